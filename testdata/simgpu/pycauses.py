"""pycauses - the host stalls of pytrain.py --causes: blocking the loop in
ways that no probed call explains, each in a function of its own.

- burn_python: pure Python on the main thread (a collate function, a
  metric computed in Python): cpu, and the gap must name burn_python.
- log_to_pipe: log lines written to stdout-like pipe whose reader (a child
  process, as a log collector) drains it slowly: the write blocks until the
  reader reads (io.write, the reader named).
- run_child: subprocess.run of a child that sleeps (subprocess).
- touch_mapped: the first touch of cold pages of a memory-mapped data file
  (io.read of that file, through page faults).
- collect_garbage: gc.collect() over a few hundred thousand objects in
  reference cycles (cpu, inside the collector).
- read_shared: batches read from fresh files in /dev/shm, as a DataLoader
  worker's tensors arrive: page faults on shared memory, which read
  nothing (cpu, not io.read).

Each method returns (function, line) as pytrain's stalls do: the function's
qualified name and the line that blocks or burns; collect_garbage adds when
the collection began (building its garbage comes first).
"""

import gc
import mmap
import os
import subprocess
import sys
import time

# The pipe's reader: reads whatever is there every PERIOD seconds.
READER = """
import os, sys, time
period = float(sys.argv[1])
while True:
    time.sleep(period)
    if not os.read(0, 1 << 20):
        break
"""


def here():
    f = sys._getframe(1)
    return getattr(f.f_code, "co_qualname", f.f_code.co_name), f.f_lineno + 1


class Causes:
    MAPPED_BYTES = 64 << 20
    SHM_DIR = "/dev/shm"
    SHM_BYTES = 4 << 20
    PIPE_BYTES = 1 << 16  # Linux's default pipe capacity

    def __init__(self, ms, data_dir, child_ms=None):
        self.ms, self.ns = ms, ms * 1000000
        self.child_ms = child_ms or ms
        self.reader = subprocess.Popen([sys.executable, "-c", READER, str(ms / 1000.0)],
                                       stdin=subprocess.PIPE, close_fds=True)
        self.log_fd = self.reader.stdin.fileno()
        self.line = b"step log line: loss=0.1234 lr=0.001 grad_norm=1.0\n" * 64
        self.map_path = os.path.join(data_dir, "pycauses-mapped.bin")
        with open(self.map_path, "wb") as f:
            for _ in range(self.MAPPED_BYTES >> 20):
                f.write(os.urandom(1 << 20))
        self.map_fd = os.open(self.map_path, os.O_RDONLY | os.O_CLOEXEC)
        self.mm = None
        self.map_off = 0
        self.garbage_objects = 600000
        self.kinds = [("cpu", self.burn_python), ("pipe", self.log_to_pipe), ("subprocess", self.run_child),
                      ("mmap", self.touch_mapped), ("gc", self.collect_garbage)]
        if os.path.isdir(self.SHM_DIR):
            self.kinds.append(("shm", self.read_shared))
            self.shm_batch = os.urandom(self.SHM_BYTES)

    def burn_python(self):
        deadline = time.monotonic_ns() + self.ns
        x, site = 1, here()
        while time.monotonic_ns() < deadline:
            for _ in range(500):
                x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        return site

    def log_to_pipe(self):
        # More than the pipe holds: the write waits for the reader, which
        # reads every stall length.
        deadline = time.monotonic_ns() + self.ns
        site = None
        while time.monotonic_ns() < deadline:
            site = here()
            os.write(self.log_fd, self.line)
        return site

    def run_child(self):
        site = here()
        subprocess.run(["sleep", "%.3f" % (self.child_ms / 1000.0)], check=True)
        return site

    def touch_mapped(self):
        # A fresh mapping of the file, its pages dropped from the page
        # cache, each page read once and at random (no readahead): every
        # touch is a fault that reads the file.
        if self.mm is not None:
            self.mm.close()
        os.posix_fadvise(self.map_fd, 0, 0, os.POSIX_FADV_DONTNEED)
        self.mm = mmap.mmap(self.map_fd, self.MAPPED_BYTES, prot=mmap.PROT_READ)
        self.mm.madvise(mmap.MADV_RANDOM)
        deadline = time.monotonic_ns() + self.ns
        page, total, site = mmap.PAGESIZE, 0, None
        while time.monotonic_ns() < deadline:
            site = here()
            total += self.mm[self.map_off]
            self.map_off = (self.map_off + 16 * page + page) % self.MAPPED_BYTES
        return site

    def read_shared(self):
        # Each batch a new file in shared memory that a worker filled (here
        # through a mapping of its own, as a worker's tensor storage is),
        # mapped again and read page by page, then dropped: every first
        # touch faults pages that are already in memory into the mapping.
        deadline = time.monotonic_ns() + self.ns
        page, n, total, site = mmap.PAGESIZE, 0, 0, None
        while time.monotonic_ns() < deadline:
            path = os.path.join(self.SHM_DIR, "pycauses-%d-%d" % (os.getpid(), n))
            n += 1
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.unlink(path)
                os.ftruncate(fd, self.SHM_BYTES)
                with mmap.mmap(fd, self.SHM_BYTES) as worker:
                    worker[:] = self.shm_batch
                mm = mmap.mmap(fd, self.SHM_BYTES, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            for off in range(0, self.SHM_BYTES, page):
                site = here()
                total += mm[off]
                if time.monotonic_ns() >= deadline:
                    break
            mm.close()
        return site

    def collect_garbage(self):
        # Objects in reference cycles that only the collector frees; the
        # stall is the collection, not building them.
        gc.disable()
        junk = []
        for i in range(self.garbage_objects // 2):
            a, b = [], {}
            a.append(b)
            b["a"] = a
            junk.append(a)
        del junk
        start = time.time_ns()
        function, line = here()
        gc.collect()
        gc.enable()
        return function, line, start

    def close(self):
        if self.mm is not None:
            self.mm.close()
        os.close(self.map_fd)
        self.reader.stdin.close()
        self.reader.wait()
        try:
            os.unlink(self.map_path)
        except OSError:
            pass
