#!/usr/bin/env python3
"""causes_job - a PyTorch loop with stalls whose cause no probed CUDA call
explains, each in a function of its own, for test/gpu/causes.sh.

Every step trains a small MLP (forward, backward, AdamW) on a batch from a
DataLoader with one worker and ends with loss.item(). Every --every-th
step one stall runs, in turn:

  ckpt_python  60 ms of Python on the main thread (burn_while_saving) while a
               background thread saves a checkpoint of the CUDA model
               (torch.save of its state_dict: per tensor a device-to-host copy)
  loader       the worker computes 80 ms in Python (slow_item) for the next batch;
               the stall is the main thread's wait for it
  gil          a background thread computes 60 ms in Python holding the GIL
               (hold_gil) while the main thread trains
  cpu          60 ms of Python on the main thread (pycauses burn_python)
  pipe         log lines into a pipe whose reader (a child) drains it slowly
  subprocess   subprocess.run of a child that sleeps 80 ms
  mmap         cold pages of a memory-mapped file read on the main thread
  gc           gc.collect() over 600k objects in reference cycles

The last five are testdata/simgpu/pycauses.py's, the ones the simulated GPU
runs. --truth writes JSON Lines: a meta record, and per stall a record with
kind, start and end (CLOCK_REALTIME ns), the function that blocks or burns,
the thread and its run-queue wait during the stall (run_delay_ns).
"""
import argparse
import gc
import json
import os
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "testdata", "simgpu"))
import pycauses  # noqa: E402


def run_delay(fd):
    try:
        return int(os.pread(fd, 128, 0).split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def burn(ms):
    deadline = time.monotonic_ns() + ms * 1000000
    x = 1
    while time.monotonic_ns() < deadline:
        for _ in range(500):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
    return x


class Items(torch.utils.data.Dataset):
    """Batches the worker makes; slow_item for the indices in slow."""

    def __init__(self, n, dim, slow_ms):
        self.n, self.dim, self.slow_ms = n, dim, slow_ms
        self.slow = set()

    def __len__(self):
        return self.n

    def slow_item(self, i):
        burn(self.slow_ms)
        return torch.randn(64, self.dim)

    def __getitem__(self, i):
        if i in self.slow:
            return self.slow_item(i)
        return torch.randn(64, self.dim)


def hold_gil(ms, done):
    burn(ms)
    done.set()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--ms", type=int, default=60)
    p.add_argument("--truth", required=True)
    p.add_argument("--data-dir", default="/tmp")
    p.add_argument("--kinds", default="ckpt_python,loader,gil,cpu,pipe,subprocess,mmap,gc")
    a = p.parse_args()
    dev = torch.device("cuda")
    dim = 1024
    model = torch.nn.Sequential(*[torch.nn.Linear(dim, dim) for _ in range(6)]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    kinds = a.kinds.split(",")
    # Which steps stall, and how, decided up front: the worker must know
    # its slow items before it prefetches them.
    plan = {s: kinds[(s // a.every - 1) % len(kinds)] for s in range(a.every, a.steps + 1, a.every)}
    items = Items(a.steps + 8, dim, 80)
    items.slow = {s for s, k in plan.items() if k == "loader"}
    loader = torch.utils.data.DataLoader(items, batch_size=None, num_workers=1, prefetch_factor=2,
                                         pin_memory=True, persistent_workers=True)
    more = pycauses.Causes(a.ms, a.data_dir, child_ms=80)
    by_kind = dict(more.kinds)
    truth = open(a.truth, "w", encoding="utf-8")
    sched_fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)

    def record(kind, start, function, rd0, end=None):
        truth.write(json.dumps({"type": "stall", "kind": kind, "start": start, "end": end or time.time_ns(),
                                "function": function, "tid": threading.get_native_id(),
                                "run_delay_ns": run_delay(sched_fd) - rd0}) + "\n")
        truth.flush()

    truth.write(json.dumps({"type": "meta", "pid": os.getpid(), "tid": threading.get_native_id(),
                            "kinds": kinds, "every": a.every, "ms": a.ms}) + "\n")
    it = iter(loader)
    for step in range(a.steps):
        kind = plan.get(step)
        rd0, start = run_delay(sched_fd), time.time_ns()
        x = next(it)
        if kind == "loader":
            record("loader", start, "Items.slow_item", rd0)
        x = x.to(dev, non_blocking=True)
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        if kind in (None, "loader"):
            continue
        rd0, start = run_delay(sched_fd), time.time_ns()
        if kind == "ckpt_python":
            path = os.path.join(a.data_dir, "causes-ckpt.pt")
            saver = threading.Thread(target=torch.save, args=(model.state_dict(), path), name="saver")
            saver.start()
            burn_while_saving(a.ms)
            record(kind, start, "burn_while_saving", rd0)
            saver.join()
        elif kind == "gil":
            done = threading.Event()
            t = threading.Thread(target=hold_gil, args=(a.ms, done), name="gil-holder")
            t.start()
            # the loop goes on, waiting for the GIL after its CUDA calls
            while not done.is_set():
                y = model(x).sum()
                y.item()
            end = time.time_ns()
            t.join()
            record(kind, start, "hold_gil", rd0, end)
        else:
            site = by_kind[kind]()
            if len(site) > 2:
                start = site[2]
            record(kind, start, site[0], rd0)
    torch.cuda.synchronize()
    # The DataLoader's worker was forked after the log pipe was made, so it
    # holds the pipe's write end too: stop it before closing the pipe, or
    # the reader never sees EOF and close() waits for it forever.
    del it, loader
    gc.collect()
    more.close()
    truth.close()
    print("causes_job: %d steps" % a.steps)


def burn_while_saving(ms):
    return burn(ms)


if __name__ == "__main__":
    main()
