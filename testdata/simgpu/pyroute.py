#!/usr/bin/env python3
"""pyroute - a ctypes training loop whose data decides its kernels.

Drives the simulated GPU (the libcuda.so.1 in --lib) the way a loop with
routed or variable-length work drives the driver: per step the batch is
copied to the device on a copy stream from pinned memory, the compute
stream waits for it through an event, then launches between --kmin and
--kmax kernels, each of a function the step's data picks among five (a
router choosing experts, buckets of sequence lengths), and a last kernel of
its own function; the loss (4 bytes) is copied back and waited for, by an
event (--style events) or a stream sync (--style stream). Every 7th step
sleeps 20 ms (a synchronous logger), every 11th reads 4 MiB of a data file
dropped from the page cache. --loader adds a Python thread that computes
for 1-4 ms, holding the GIL, before each batch is handed to the loop.

--truth FILE writes JSON Lines: a meta record (pid, from_start: every
iteration of the loop is recorded) and one step record per iteration with
its start and end in Unix ns (start_unix_nano, end_unix_nano).
"""
import argparse
import ctypes
import json
import os
import queue
import random
import sys
import threading
import time

from pytrain import load_module

V = ctypes.c_void_p


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lib", required=True, help="directory of the simulated libcuda.so.1")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--kmin", type=int, default=8, help="fewest routed kernels a step")
    p.add_argument("--kmax", type=int, default=16, help="most routed kernels a step")
    p.add_argument("--style", choices=("events", "stream"), default="events", help="how the loss read waits")
    p.add_argument("--loader", action="store_true", help="a GIL-holding thread prepares each batch")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data-dir", default=".")
    p.add_argument("--truth", help="write the ground truth here (JSON Lines)")
    return p.parse_args()


class Driver:
    def __init__(self, libdir):
        self.cu, mod, self.image = load_module(libdir, "pyroute", self.check)
        cu = self.cu
        cu.cuLaunchKernel.argtypes = [V] + [ctypes.c_uint] * 6 + [ctypes.c_uint, V, V, V]
        cu.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, V, ctypes.c_size_t, V]
        cu.cuMemcpyDtoHAsync_v2.argtypes = [V, ctypes.c_uint64, ctypes.c_size_t, V]
        cu.cuEventRecord.argtypes = [V, V]
        cu.cuStreamWaitEvent.argtypes = [V, V, ctypes.c_uint]
        cu.cuEventSynchronize.argtypes = [V]
        cu.cuStreamSynchronize.argtypes = [V]
        self.funcs = []
        for us in (120, 300, 450, 800, 1500, 60):  # five routed, then the step's last
            f = V()
            self.check(cu.cuModuleGetFunction(ctypes.byref(f), mod, b"sim_kernel_%d" % us), "cuModuleGetFunction")
            self.funcs.append(f)
        self.dptr = ctypes.c_uint64()
        self.check(cu.cuMemAlloc_v2(ctypes.byref(self.dptr), ctypes.c_size_t(64 << 20)), "cuMemAlloc_v2")
        self.params = (V * 1)(ctypes.cast(ctypes.byref(self.dptr), V))
        self.copy, self.comp = V(), V()
        self.check(cu.cuStreamCreate(ctypes.byref(self.copy), 1), "cuStreamCreate")
        self.check(cu.cuStreamCreate(ctypes.byref(self.comp), 1), "cuStreamCreate")
        self.ev_in, self.ev_done = V(), V()
        self.check(cu.cuEventCreate(ctypes.byref(self.ev_in), 0), "cuEventCreate")
        self.check(cu.cuEventCreate(ctypes.byref(self.ev_done), 0), "cuEventCreate")
        self.host = V()
        self.check(cu.cuMemAllocHost_v2(ctypes.byref(self.host), ctypes.c_size_t(8 << 20)), "cuMemAllocHost_v2")

    @staticmethod
    def check(r, what):
        if r != 0:
            sys.exit("pyroute: %s failed: CUresult %d" % (what, r))


def main():
    a = parse_args()
    if a.kmin < 1 or a.kmax < a.kmin:
        sys.exit("pyroute: want 1 <= --kmin <= --kmax")
    rng = random.Random(a.seed)
    d = Driver(a.lib)
    cu = d.cu
    path = os.path.join(a.data_dir, "pyroute-data.bin")
    with open(path, "wb") as f:
        f.write(os.urandom(8 << 20))
    truth = open(a.truth, "w") if a.truth else None

    def record(**kv):
        if truth:
            truth.write(json.dumps(kv) + "\n")
            truth.flush()

    record(type="meta", pid=os.getpid(), from_start=True, steps=a.steps, kmin=a.kmin, kmax=a.kmax, style=a.style)
    batches = queue.Queue(maxsize=2)

    def loader():
        lr = random.Random(a.seed + 1)
        while True:
            until = time.time() + lr.uniform(0.001, 0.004)
            while time.time() < until:  # Python work, holding the GIL
                pass
            batches.put(1)

    if a.loader:
        threading.Thread(target=loader, daemon=True).start()
    for step in range(a.steps):
        start = time.time_ns()
        if a.loader:
            batches.get()
        if step % 7 == 3:
            time.sleep(0.02)
        if step % 11 == 5:
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.read(fd, 4 << 20)
            os.close(fd)
        d.check(cu.cuMemcpyHtoDAsync_v2(d.dptr.value, d.host, 2 << 20, d.copy), "cuMemcpyHtoDAsync_v2")
        d.check(cu.cuEventRecord(d.ev_in, d.copy), "cuEventRecord")
        d.check(cu.cuStreamWaitEvent(d.comp, d.ev_in, 0), "cuStreamWaitEvent")
        n = rng.randint(a.kmin, a.kmax)
        for i in range(n):
            f = d.funcs[rng.randrange(5)] if i < n - 1 else d.funcs[5]
            d.check(cu.cuLaunchKernel(f, 108, 1, 1, 256, 1, 1, 0, d.comp, d.params, None), "cuLaunchKernel")
            time.sleep(0)  # the framework's own Python between launches
        d.check(cu.cuMemcpyDtoHAsync_v2(d.host, d.dptr.value, 4, d.comp), "cuMemcpyDtoHAsync_v2")
        if a.style == "events":
            d.check(cu.cuEventRecord(d.ev_done, d.comp), "cuEventRecord")
            d.check(cu.cuEventSynchronize(d.ev_done), "cuEventSynchronize")
        else:
            d.check(cu.cuStreamSynchronize(d.comp), "cuStreamSynchronize")
        record(type="step", step=step, start_unix_nano=start, end_unix_nano=time.time_ns())


if __name__ == "__main__":
    main()
