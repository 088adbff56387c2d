#!/usr/bin/env python3
"""blocking_misc: a loop blocked by a slow log reader, a child process and
cold pages of a memory-mapped dataset.

A small data-class-like config drives a loop of eight kernels on the legacy
stream and a cuCtxSynchronize per step. Every 15 steps, in turn:
  - flush_logs writes 256 KiB of log lines into a pipe read by a slow log
    collector (a child that reads 8 KiB every 2 ms): the write blocks until
    the collector drains it. Expected label io.write (the loop writes).
  - run_hook runs subprocess.run(["sleep", "0.08"]) and waits for it.
    Expected label subprocess (README's cause table: the loop's own call
    is what a user changes, by not waiting for the child; the child's
    command, and so what it did, is the gap's children evidence).
  - scan_index touches one byte per page of 6 MiB of a memory-mapped file
    whose pages were dropped from the page cache: page faults that read
    the file. Expected label io.read.
"""

import argparse
import ctypes
import mmap
import os
import subprocess
import sys
import time

import simcu
import xtruth

COLLECTOR = r"""
import os, sys, time
fd = sys.stdin.fileno()
while True:
    b = os.read(fd, 8192)
    if not b:
        break
    time.sleep(0.002)
"""

EVERY = 15


class Config:
    steps = 450
    data_mb = 48
    scan_mb = 6


def prepare_dataset(path, mb):
    with open(path, "wb") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(mb):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True)
    p.add_argument("--truth")
    p.add_argument("--steps", type=int, default=Config.steps)
    p.add_argument("--data-dir", default="/var/tmp")
    a = p.parse_args()
    cfg = Config()
    cfg.steps = a.steps
    truth = xtruth.Truth(a.truth, "blocking_misc")
    path = os.path.join(a.data_dir, "index-%d.bin" % os.getpid())
    prepare_dataset(path, cfg.data_mb)
    fd = os.open(path, os.O_RDONLY)
    mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    collector = subprocess.Popen([sys.executable, "-c", COLLECTOR], stdin=subprocess.PIPE)
    log = collector.stdin
    line = b"step metrics " + b"x" * 115 + b"\n"
    cursor = [0]

    def flush_logs():
        with xtruth.timed_stall(truth, "io.write", "flush_logs", reader=collector.pid):
            log.write(line * 2048)
            log.flush()

    def run_hook():
        with xtruth.timed_stall(truth, "subprocess", "run_hook", child="sleep 0.08"):
            subprocess.run(["sleep", "0.08"], check=True)

    def scan_index():
        span = cfg.scan_mb << 20
        off = cursor[0] % ((cfg.data_mb << 20) - span)
        cursor[0] += span
        # Unmap the pages first: the page cache keeps pages a mapping
        # still maps, and once the cursor wraps they would not fault.
        mm.madvise(mmap.MADV_DONTNEED, off, span)
        os.posix_fadvise(fd, off, span, os.POSIX_FADV_DONTNEED)
        total = 0
        with xtruth.timed_stall(truth, "io.read", "scan_index", path=path):
            for pg in range(off, off + span, mmap.PAGESIZE):
                total += mm[pg]
        return total

    cu, _ctx, mod, _img = simcu.open_device(a.lib)
    fns = [simcu.kernel(cu, mod, 1000) for _ in range(8)]
    hooks = (flush_logs, run_hook, scan_index)
    try:
        for step in range(1, cfg.steps + 1):
            if step % EVERY == 0:
                hooks[(step // EVERY) % 3]()
            t0 = time.time_ns()
            for f in fns:
                simcu.launch(cu, f)
            simcu.ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
            truth.step(step, t0, time.time_ns())
    finally:
        log.close()
        collector.wait()
        mm.close()
        os.close(fd)
        os.unlink(path)
    truth.close()


if __name__ == "__main__":
    main()
