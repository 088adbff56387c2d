#!/usr/bin/env python3
"""pyprefetch - a ctypes training loop that prefetches its batches on a copy stream.

Drives the simulated GPU (the libcuda.so.1 in --lib) the way a loop that
double-buffers its input does: per iteration it prepares the batch on the
host (0.5 to 3 ms, seeded), makes the compute stream wait for the batch
copied in the previous iteration (cuStreamWaitEvent), copies the next batch
(8 MiB, pinned) on a copy stream and records an event there, then launches
30 kernels of three functions on the compute stream (34 in the first four
iterations: autotuning). With --accum M an iteration is M such
micro-batches, then 6 optimizer kernels. The loss is read with
cuMemcpyDtoHAsync and cuEventSynchronize every --log-every iterations (1:
every iteration), or with --log-sync stream/ctx by cuStreamSynchronize or
cuCtxSynchronize. --ckpt-every C saves a checkpoint every C iterations:
8 tensors of 4 MiB each copied to the host (async copy, stream sync) and
written to a file, then fsync. --upload-at-exit MS uploads the model after
the loop and exits: 20 chunks sent over TCP to a server (a child forked at
the start) that acknowledges each MS/20 ms late, as a push of the final
weights or a logger flushing its last records (wandb.finish) holds the job.

--truth FILE writes JSON Lines: a meta record (pid, from_start: every
iteration of the loop is recorded), one step record per iteration with its
start and end in Unix ns (start_unix_nano, end_unix_nano), a stall record
per checkpoint (cause io.write, its span), one for the upload (cause net)
and, from the simulated GPU's
own timeline, a busy record per kernel (when it ran, in Unix ns): the idle
the job truly had.
"""
import argparse
import ctypes
import json
import os
import random
import socket
import sys
import time

from pytrain import load_module

V = ctypes.c_void_p


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lib", required=True, help="directory of the simulated libcuda.so.1")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--log-every", type=int, default=1, help="read the loss every N iterations")
    p.add_argument("--log-sync", choices=("event", "stream", "ctx"), default="event", help="how the loss read waits")
    p.add_argument("--accum", type=int, default=1, help="micro-batches an iteration")
    p.add_argument("--ckpt-every", type=int, default=0, help="a checkpoint every C iterations (0: none)")
    p.add_argument("--upload-at-exit", type=int, default=0, metavar="MS",
                   help="after the loop, upload to a server that acknowledges 20 chunks MS/20 ms late each")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data-dir", default=".")
    p.add_argument("--truth", help="write the ground truth here (JSON Lines)")
    a = p.parse_args()
    if a.steps < 1 or a.log_every < 1 or a.accum < 1 or a.ckpt_every < 0:
        p.error("want --steps, --log-every and --accum >= 1, --ckpt-every >= 0")
    return a


def check(r, what):
    if r != 0:
        sys.exit("pyprefetch: %s failed: CUresult %d" % (what, r))


def upload_server(ms):
    """Forks a server that acknowledges each 4 KiB chunk ms/20 ms late; returns (pid, port)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    pid = os.fork()
    if pid == 0:
        c, _ = srv.accept()
        while True:
            got = 0
            while got < 4096:
                d = c.recv(4096 - got)
                if not d:
                    os._exit(0)
                got += len(d)
            time.sleep(ms / 20 / 1000)
            c.sendall(b"k")
    port = srv.getsockname()[1]
    srv.close()
    return pid, port


def upload(port):
    s = socket.create_connection(("127.0.0.1", port))
    for _ in range(20):
        s.sendall(b"\0" * 4096)
        s.recv(1)
    s.close()


def main():
    a = parse_args()
    rnd = random.Random(a.seed)
    server = upload_server(a.upload_at_exit) if a.upload_at_exit else None
    cu, mod, image = load_module(a.lib, "pyprefetch", check)
    funcs = []
    for us in (150, 300, 80, 40):
        f = V()
        check(cu.cuModuleGetFunction(ctypes.byref(f), mod, b"sim_kernel_%d" % us), "cuModuleGetFunction")
        funcs.append(f)
    dptr = ctypes.c_uint64()
    check(cu.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(64 << 20)), "cuMemAlloc_v2")
    params = (V * 1)(ctypes.cast(ctypes.byref(dptr), V))
    cu.cuLaunchKernel.argtypes = [V] + [ctypes.c_uint] * 6 + [ctypes.c_uint, V, V, V]
    cu.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, V, ctypes.c_size_t, V]
    cu.cuMemcpyDtoHAsync_v2.argtypes = [V, ctypes.c_uint64, ctypes.c_size_t, V]
    host = V()
    check(cu.cuMemAllocHost_v2(ctypes.byref(host), ctypes.c_size_t(32 << 20)), "cuMemAllocHost_v2")
    comp, copy = V(), V()
    check(cu.cuStreamCreate(ctypes.byref(comp), 1), "cuStreamCreate")
    check(cu.cuStreamCreate(ctypes.byref(copy), 1), "cuStreamCreate")
    ready = []
    for _ in range(3):
        e = V()
        check(cu.cuEventCreate(ctypes.byref(e), 2), "cuEventCreate")
        ready.append(e)
    out = ctypes.create_string_buffer(16)
    truth = open(a.truth, "w") if a.truth else None
    if truth:
        # The simulated GPU reports each interval it schedules (start and
        # end in CLOCK_MONOTONIC ns, possibly in the future) on the
        # launching thread: kernels (kind 1) are what idle is the absence of.
        busy_fn = ctypes.CFUNCTYPE(None, V, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32)
        off = time.time_ns() - time.monotonic_ns()

        def on_busy(arg, dev, start, end, kind, stream):
            if kind == 1:
                truth.write('{"type": "busy", "kind": "kernel", "start_unix_nano": %d, "end_unix_nano": %d}\n' % (start + off, end + off))

        busy_cb = busy_fn(on_busy)  # kept alive for the run
        cu.simgpu_set_busy_callback(busy_cb, None)

    def record(**kv):
        if truth:
            truth.write(json.dumps(kv) + "\n")
            truth.flush()

    def launch(f, n=1):
        for _ in range(n):
            check(cu.cuLaunchKernel(f, 108, 1, 1, 256, 1, 1, 0, comp, params, None), "cuLaunchKernel")

    def prefetch(j):
        check(cu.cuMemcpyHtoDAsync_v2(dptr.value, host, 8 << 20, copy), "cuMemcpyHtoDAsync_v2")
        check(cu.cuEventRecord(ready[j % 2], copy), "cuEventRecord")

    def checkpoint():
        with open(os.path.join(a.data_dir, "pyprefetch-ckpt.bin"), "wb") as f:
            for _ in range(8):
                check(cu.cuMemcpyDtoHAsync_v2(host, dptr.value, 4 << 20, comp), "cuMemcpyDtoHAsync_v2")
                check(cu.cuStreamSynchronize(comp), "cuStreamSynchronize")
                f.write(ctypes.string_at(host, 4 << 20))
            f.flush()
            os.fsync(f.fileno())

    record(type="meta", pid=os.getpid(), from_start=True, steps=a.steps, log_every=a.log_every, accum=a.accum)
    prefetch(0)
    for step in range(a.steps):
        start = time.time_ns()
        for m in range(a.accum):
            j = step * a.accum + m
            time.sleep(rnd.uniform(0.0005, 0.003))  # the batch, prepared on the host
            check(cu.cuStreamWaitEvent(comp, ready[j % 2], 0), "cuStreamWaitEvent")
            prefetch(j + 1)
            for i in range(34 if step < 4 else 30):
                launch(funcs[i % 3])
        if a.accum > 1:
            launch(funcs[3], 6)  # the optimizer
        if step % a.log_every == a.log_every - 1:
            if a.log_sync == "event":
                check(cu.cuMemcpyDtoHAsync_v2(out, dptr.value, 4, comp), "cuMemcpyDtoHAsync_v2")
                check(cu.cuEventRecord(ready[2], comp), "cuEventRecord")
                check(cu.cuEventSynchronize(ready[2]), "cuEventSynchronize")
            elif a.log_sync == "stream":
                check(cu.cuMemcpyDtoHAsync_v2(out, dptr.value, 4, comp), "cuMemcpyDtoHAsync_v2")
                check(cu.cuStreamSynchronize(comp), "cuStreamSynchronize")
            else:
                check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        if a.ckpt_every and step % a.ckpt_every == a.ckpt_every - 1:
            t0 = time.time_ns()
            checkpoint()
            record(type="stall", cause="io.write", step=step, start_unix_nano=t0, end_unix_nano=time.time_ns())
        record(type="step", step=step, start_unix_nano=start, end_unix_nano=time.time_ns())
    if server:
        t0 = time.time_ns()
        upload(server[1])
        record(type="stall", cause="net", start_unix_nano=t0, end_unix_nano=time.time_ns())
        os.waitpid(server[0], 0)
    if truth:
        truth.close()


if __name__ == "__main__":
    main()
