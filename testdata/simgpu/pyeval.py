#!/usr/bin/env python3
"""pyeval - a ctypes training loop of synchronous copies that evaluates.

Drives the simulated GPU (the libcuda.so.1 in --lib) the way a loop written
against the driver API without streams does: per step the batch (4 MiB) is
copied with cuMemcpyHtoD_v2 (synchronous; from pageable memory unless
--pinned), 27 kernels of three functions run on the legacy stream, and the
loss (4 bytes) is read with cuMemcpyDtoH_v2; every 5th step the loop also
calls cuCtxSynchronize and reads a metric (8 bytes). Every 9th step sleeps
10 ms (a synchronous logger). Every --eval-every steps, at the end of the
step, it evaluates --eval-batches batches of --eval-mib MiB (1; 4 is the
training batch's size, as an evaluation that shares the training's collate
copies): each a copy, 8 kernels and a read. Evaluation belongs to the step
it ends: it is no iteration of the training loop.

--truth FILE writes JSON Lines: a meta record (pid, from_start: every
iteration of the loop is recorded) and one step record per training
iteration with its start and end in Unix ns (start_unix_nano,
end_unix_nano).
"""
import argparse
import ctypes
import json
import os
import sys
import time

from pytrain import load_module

V = ctypes.c_void_p


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lib", required=True, help="directory of the simulated libcuda.so.1")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=40, help="steps between evaluations (0: none)")
    p.add_argument("--eval-batches", type=int, default=60, help="batches an evaluation runs")
    p.add_argument("--eval-mib", type=int, default=1, help="MiB an evaluation batch copies (1 to 4)")
    p.add_argument("--pinned", action="store_true", help="copy the batch from pinned memory")
    p.add_argument("--truth", help="write the ground truth here (JSON Lines)")
    a = p.parse_args()
    if a.steps < 1 or a.eval_every < 0 or a.eval_batches < 0 or not 1 <= a.eval_mib <= 4:
        p.error("want --steps >= 1, --eval-every >= 0, --eval-batches >= 0, --eval-mib 1 to 4")
    return a


def check(r, what):
    if r != 0:
        sys.exit("pyeval: %s failed: CUresult %d" % (what, r))


def main():
    a = parse_args()
    cu, mod, image = load_module(a.lib, "pyeval", check)
    funcs = []
    for us in (200, 350, 90):
        f = V()
        check(cu.cuModuleGetFunction(ctypes.byref(f), mod, b"sim_kernel_%d" % us), "cuModuleGetFunction")
        funcs.append(f)
    dptr = ctypes.c_uint64()
    check(cu.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(64 << 20)), "cuMemAlloc_v2")
    params = (V * 1)(ctypes.cast(ctypes.byref(dptr), V))
    cu.cuLaunchKernel.argtypes = [V] + [ctypes.c_uint] * 6 + [ctypes.c_uint, V, V, V]
    cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, V, ctypes.c_size_t]
    cu.cuMemcpyDtoH_v2.argtypes = [V, ctypes.c_uint64, ctypes.c_size_t]
    if a.pinned:
        host = V()
        check(cu.cuMemAllocHost_v2(ctypes.byref(host), ctypes.c_size_t(4 << 20)), "cuMemAllocHost_v2")
    else:
        buf = ctypes.create_string_buffer(4 << 20)
        host = ctypes.cast(buf, V)
    out = ctypes.create_string_buffer(64)
    truth = open(a.truth, "w") if a.truth else None

    def record(**kv):
        if truth:
            truth.write(json.dumps(kv) + "\n")
            truth.flush()

    def launch(f, n=1):
        for _ in range(n):
            check(cu.cuLaunchKernel(f, 108, 1, 1, 256, 1, 1, 0, None, params, None), "cuLaunchKernel")

    record(type="meta", pid=os.getpid(), from_start=True, steps=a.steps, eval_every=a.eval_every,
           eval_batches=a.eval_batches, eval_mib=a.eval_mib)
    for step in range(a.steps):
        start = time.time_ns()
        if step % 9 == 4:
            time.sleep(0.01)
        check(cu.cuMemcpyHtoD_v2(dptr.value, host, 4 << 20), "cuMemcpyHtoD_v2")
        for i in range(12):  # forward
            launch(funcs[i % 2])
        launch(funcs[2])  # the loss
        for i in range(14):  # backward and the optimizer
            launch(funcs[i % 2])
        check(cu.cuMemcpyDtoH_v2(out, dptr.value, 4), "cuMemcpyDtoH_v2")
        if step % 5 == 2:
            check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
            check(cu.cuMemcpyDtoH_v2(out, dptr.value, 8), "cuMemcpyDtoH_v2")
        if a.eval_every and step % a.eval_every == a.eval_every - 1:
            for _ in range(a.eval_batches):
                check(cu.cuMemcpyHtoD_v2(dptr.value, host, a.eval_mib << 20), "cuMemcpyHtoD_v2")
                for i in range(8):
                    launch(funcs[i % 2])
                check(cu.cuMemcpyDtoH_v2(out, dptr.value, 4), "cuMemcpyDtoH_v2")
        record(type="step", step=step, start_unix_nano=start, end_unix_nano=time.time_ns())


if __name__ == "__main__":
    main()
