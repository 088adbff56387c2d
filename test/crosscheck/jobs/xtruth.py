"""Ground truth for the cross-check trainers: JSON Lines, CLOCK_REALTIME ns.

Records: meta (job, pid, tid), step (n, start, end: one per optimizer
step), stall (cause, code, start, end, tid, run_delay_ns), end (steps).
Every record is flushed at once so that a runner can watch the steps grow
(the attach mode waits for them).
"""

import json
import os
import threading
import time


def run_delay_ns():
    """The calling thread's run-queue wait so far (schedstat), 0 if unknown."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


class Truth:
    def __init__(self, path, job):
        self._f = open(path, "w", buffering=1) if path else None
        self._mu = threading.Lock()
        self.steps = 0
        self._put(type="meta", job=job, pid=os.getpid(), tid=threading.get_native_id(),
                  clock="realtime")

    def _put(self, **rec):
        if self._f is None:
            return
        with self._mu:
            self._f.write(json.dumps(rec) + "\n")

    def step(self, n, start, end):
        self.steps = n
        self._put(type="step", n=n, start=start, end=end)

    def stall(self, cause, code, start, end, delay=0, **extra):
        self._put(type="stall", cause=cause, code=code, start=start, end=end,
                  tid=threading.get_native_id(), run_delay_ns=delay, **extra)

    def close(self):
        self._put(type="end", steps=self.steps)
        if self._f:
            self._f.close()


class timed_stall:
    """with timed_stall(truth, cause, code): ... records the block as a stall."""

    def __init__(self, truth, cause, code, **extra):
        self.truth, self.cause, self.code, self.extra = truth, cause, code, extra

    def __enter__(self):
        self.d0 = run_delay_ns()
        self.t0 = time.time_ns()
        return self

    def __exit__(self, *exc):
        t1 = time.time_ns()
        self.truth.stall(self.cause, self.code, self.t0, t1, run_delay_ns() - self.d0, **self.extra)
        return False
