"""Two ranks of a training loop on the simulated GPU whose all-reduce is
not an NCCL call but a hand-written one over TCP, as gloo's is: each step
launches kernels, synchronizes, then sends its value to the other rank and
blocks in recv for the other's. Rank 0 listens on --port, rank 1 connects.

Truth (--truth, JSON Lines): a meta record with the pid, a step record per
step."""

import argparse
import ctypes
import json
import os
import socket
import struct
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lib", required=True, help="directory of the simulated libcuda.so.1")
    p.add_argument("--rank", type=int, choices=(0, 1), required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--truth", required=True)
    p.add_argument("--kernel-us", type=int, default=1000)
    p.add_argument("--kernels", type=int, default=4)
    return p.parse_args()


def check(r, what):
    if r != 0:
        sys.exit("sockreduce: %s failed: CUresult %d" % (what, r))


def driver(lib, kernel_us):
    cu = ctypes.CDLL(os.path.join(lib, "libcuda.so.1"))
    check(cu.cuInit(0), "cuInit")
    dev, ctx, mod, func = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    image = ctypes.create_string_buffer(b"simgpu-module")
    check(cu.cuModuleLoadData(ctypes.byref(mod), image), "cuModuleLoadData")
    check(cu.cuModuleGetFunction(ctypes.byref(func), mod, b"sim_kernel_%d" % kernel_us), "cuModuleGetFunction")
    dptr = ctypes.c_uint64()
    check(cu.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(1 << 20)), "cuMemAlloc_v2")
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(dptr), ctypes.c_void_p))
    cu.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [
        ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    cu.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
    return cu, func, params, image


def connect(rank, port):
    if rank == 0:
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", port))
        ls.listen(1)
        s, _ = ls.accept()
        ls.close()
        return s
    deadline = time.monotonic() + 60
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        got = s.recv(n - len(b))
        if not got:
            sys.exit("sockreduce: the other rank closed the connection")
        b += got
    return b


def main():
    a = parse()
    cu, func, params, _image = driver(a.lib, a.kernel_us)
    truth = open(a.truth, "w")
    truth.write(json.dumps({"type": "meta", "pid": os.getpid(), "rank": a.rank}) + "\n")
    truth.flush()
    s = connect(a.rank, a.port)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    value = float(a.rank + 1)
    step = 0
    while True:
        for _ in range(a.kernels):
            check(cu.cuLaunchKernel(func, 108, 1, 1, 256, 1, 1, 0, None, params, None), "cuLaunchKernel")
        check(cu.cuStreamSynchronize(None), "cuStreamSynchronize")
        # The all-reduce: send ours, wait for the other's.
        s.sendall(struct.pack("<d", value))
        (other,) = struct.unpack("<d", recv_exact(s, 8))
        value = (value + other) / 2
        truth.write(json.dumps({"type": "step", "step": step, "end": time.time_ns()}) + "\n")
        truth.flush()
        step += 1


if __name__ == "__main__":
    main()
