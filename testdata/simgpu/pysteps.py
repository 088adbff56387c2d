#!/usr/bin/env python3
"""pysteps - ctypes training loops whose syncs come from many places.

Drives the simulated GPU (the libcuda.so.1 in --lib) in one of five loops
(--job), each iteration preparing its batch on the host (0.5 to 2 ms,
seeded) and copying it to the device (4 MiB, pinned, async):

  graph     the step is one CUDA graph replay (cuGraphLaunch of one exec),
            the loss read (4 bytes to the host, stream sync) after it; a
            background saver thread copies 8 tensors of 2 MiB to the host
            on its own stream, each with a sync, every 30 ms.
  ckpt      eager (30 launches), the loss read every iteration; every 10th
            iteration a checkpoint copies 24 tensors of 1 to 3 MiB to the
            host one by one (the loss read's direction), each with a sync.
  eval      eager, the loss read every iteration; every 25th iteration an
            evaluation of 12 batches (--eval-batches; 2 MiB, 10 launches, a
            read each).
  logevery  eager, the loss read every 10th iteration only, and a metric
            read every 25th.
  accum     4 micro-batches an iteration (each its batch copy and 20
            launches), then the optimizer (6 launches) and the loss read.

--stalls stalls the host now and then (CPU work, a sleep, a pageable copy).
--sync-reads makes every read a synchronous cuMemcpyDtoH.

--truth FILE writes JSON Lines: a meta record (pid, from_start), then one
step record per iteration (start_unix_nano, end_unix_nano), and the
count of iterations the job ran (type "done").
"""
import argparse
import ctypes
import json
import os
import random
import sys
import threading
import time

from pytrain import load_module

V = ctypes.c_void_p
JOBS = ("graph", "ckpt", "eval", "logevery", "accum")


def check(r, what):
    if r != 0:
        sys.exit("pysteps: %s failed: CUresult %d" % (what, r))


class Loop:
    def __init__(self, a):
        self.a = a
        self.rnd = random.Random(a.seed)
        cu, mod, self.image = load_module(a.lib, "pysteps", check)
        self.cu = cu
        self.ctx = V()
        check(cu.cuCtxGetCurrent(ctypes.byref(self.ctx)), "cuCtxGetCurrent")
        self.funcs = []
        for us in (150, 300, 80, 40):
            f = V()
            check(cu.cuModuleGetFunction(ctypes.byref(f), mod, b"sim_kernel_%d" % us), "cuModuleGetFunction")
            self.funcs.append(f)
        self.dptr = ctypes.c_uint64()
        check(cu.cuMemAlloc_v2(ctypes.byref(self.dptr), ctypes.c_size_t(64 << 20)), "cuMemAlloc_v2")
        self.params = (V * 1)(ctypes.cast(ctypes.byref(self.dptr), V))
        cu.cuLaunchKernel.argtypes = [V] + [ctypes.c_uint] * 6 + [ctypes.c_uint, V, V, V]
        cu.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, V, ctypes.c_size_t, V]
        cu.cuMemcpyDtoHAsync_v2.argtypes = [V, ctypes.c_uint64, ctypes.c_size_t, V]
        cu.cuMemcpyDtoH_v2.argtypes = [V, ctypes.c_uint64, ctypes.c_size_t]
        self.host = V()
        check(cu.cuMemAllocHost_v2(ctypes.byref(self.host), ctypes.c_size_t(16 << 20)), "cuMemAllocHost_v2")
        self.comp = V()
        check(cu.cuStreamCreate(ctypes.byref(self.comp), 1), "cuStreamCreate")
        self.out = ctypes.create_string_buffer(16)

    def launch(self, n, f=None):
        for i in range(n):
            fn = f if f is not None else self.funcs[i % 3]
            check(self.cu.cuLaunchKernel(fn, 108, 1, 1, 256, 1, 1, 0, self.comp, self.params, None), "cuLaunchKernel")

    def batch(self, mib=4):
        time.sleep(self.rnd.uniform(0.0005, 0.002))  # the batch, prepared on the host
        check(self.cu.cuMemcpyHtoDAsync_v2(self.dptr.value, self.host, mib << 20, self.comp), "cuMemcpyHtoDAsync_v2")

    def read(self, nbytes=4, stream=None):
        if self.a.sync_reads:
            check(self.cu.cuMemcpyDtoH_v2(self.out if nbytes <= 16 else self.host, self.dptr.value, nbytes), "cuMemcpyDtoH_v2")
            return
        s = stream if stream is not None else self.comp
        check(self.cu.cuMemcpyDtoHAsync_v2(self.out if nbytes <= 16 else self.host, self.dptr.value, nbytes, s),
              "cuMemcpyDtoHAsync_v2")
        check(self.cu.cuStreamSynchronize(s), "cuStreamSynchronize")


def saver(loop, stop):
    """A background thread that saves the model every 30 ms, tensor by tensor."""
    cu = loop.cu
    try:
        check(cu.cuCtxSetCurrent(loop.ctx), "cuCtxSetCurrent")  # the context is current per thread
        s = V()
        check(cu.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")
        while not stop.wait(0.03):
            for _ in range(8):
                loop.read(2 << 20, s)
    except SystemExit as e:
        print(e, file=sys.stderr)
        os._exit(1)  # a thread's exit would go unnoticed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lib", required=True, help="directory of the simulated libcuda.so.1")
    p.add_argument("--job", choices=JOBS, required=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--stalls", action="store_true", help="stall the host: 15 ms of CPU every 7th iteration, a 20 ms sleep every 11th, a pageable 8 MiB copy every 13th")
    p.add_argument("--eval-batches", type=int, default=12, help="batches an evaluation runs (eval)")
    p.add_argument("--sync-reads", action="store_true", help="read with cuMemcpyDtoH (synchronous) instead of an async copy and a stream sync")
    p.add_argument("--truth", help="write the ground truth here (JSON Lines)")
    a = p.parse_args()
    if a.steps < 1 or a.eval_batches < 0:
        p.error("want --steps >= 1, --eval-batches >= 0")
    loop = Loop(a)
    cu = loop.cu
    truth = open(a.truth, "w") if a.truth else None

    def record(**kv):
        if truth:
            truth.write(json.dumps(kv) + "\n")
            truth.flush()

    gexec = None
    stop = threading.Event()
    bg = None
    if a.job == "graph":
        g = V()
        check(cu.cuGraphCreate(ctypes.byref(g), 0), "cuGraphCreate")
        gexec = V()
        check(cu.cuGraphInstantiateWithFlags(ctypes.byref(gexec), g, ctypes.c_ulonglong(0)), "cuGraphInstantiateWithFlags")
        bg = threading.Thread(target=saver, args=(loop, stop), name="saver", daemon=True)
        bg.start()
    record(type="meta", pid=os.getpid(), from_start=True, job=a.job, steps=a.steps)
    pageable = ctypes.create_string_buffer(8 << 20)
    cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, V, ctypes.c_size_t]
    for step in range(a.steps):
        start = time.time_ns()
        if a.stalls and step % 7 == 3:
            end = time.monotonic() + 0.015
            while time.monotonic() < end:
                pass
        if a.stalls and step % 11 == 5:
            time.sleep(0.02)
        if a.stalls and step % 13 == 8:
            check(cu.cuMemcpyHtoD_v2(loop.dptr.value, pageable, 8 << 20), "cuMemcpyHtoD_v2")
        if a.job == "graph":
            loop.batch()
            check(cu.cuGraphLaunch(gexec, loop.comp), "cuGraphLaunch")
            loop.read()  # loss.item()
        elif a.job == "accum":
            for _ in range(4):
                loop.batch()
                loop.launch(20)
            loop.launch(6, loop.funcs[3])  # the optimizer
            loop.read()  # loss.item()
        else:
            loop.batch()
            loop.launch(30)
            if a.job != "logevery":
                loop.read()  # loss.item(), the step site
            elif step % 10 == 9:
                loop.read()  # the loss, logged every 10th iteration
            if a.job == "logevery" and step % 25 == 24:
                loop.read(8)  # a metric every 25th
            if a.job == "ckpt" and step % 10 == 9:
                for k in range(24):
                    loop.read((1 + k % 3) << 20)  # one tensor of the checkpoint
            if a.job == "eval" and step % 25 == 24:
                for _ in range(a.eval_batches):
                    loop.batch(2)
                    loop.launch(10)
                    loop.read()  # the evaluation batch's metric
        record(type="step", step=step, start_unix_nano=start, end_unix_nano=time.time_ns())
    if bg:
        stop.set()
        bg.join()
    record(type="done", steps=a.steps)
    if truth:
        truth.close()


if __name__ == "__main__":
    main()
