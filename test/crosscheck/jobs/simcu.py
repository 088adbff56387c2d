"""Opens the simulated libcuda through ctypes for the cross-check trainers."""

import ctypes
import os
import sys

c_void_p = ctypes.c_void_p


class CudaError(RuntimeError):
    pass


def ok(rc, what):
    if rc != 0:
        raise CudaError("%s failed: CUresult %d" % (what, rc))


def open_device(libdir):
    """Returns (cu, ctx, module, keepalive) with device 0's primary context current."""
    path = os.path.join(libdir, "libcuda.so.1")
    try:
        cu = ctypes.CDLL(path)
    except OSError as e:
        sys.exit("load %s: %s" % (path, e))
    cu.cuGraphLaunch.argtypes = [c_void_p, c_void_p]
    cu.cuStreamSynchronize.argtypes = [c_void_p]
    cu.cuEventRecord.argtypes = [c_void_p, c_void_p]
    cu.cuEventSynchronize.argtypes = [c_void_p]
    cu.cuMemcpyDtoHAsync_v2.argtypes = [c_void_p, ctypes.c_uint64, ctypes.c_size_t, c_void_p]
    cu.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, c_void_p, ctypes.c_size_t, c_void_p]
    cu.cuLaunchKernel.argtypes = [c_void_p] + [ctypes.c_uint] * 7 + [c_void_p, c_void_p, c_void_p]
    ok(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = c_void_p()
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    image = ctypes.create_string_buffer(b"crosscheck-module")
    mod = c_void_p()
    ok(cu.cuModuleLoadData(ctypes.byref(mod), image), "cuModuleLoadData")
    return cu, ctx, mod, image


def kernel(cu, mod, us):
    f = c_void_p()
    ok(cu.cuModuleGetFunction(ctypes.byref(f), mod, ("sim_kernel_%d" % us).encode()), "cuModuleGetFunction")
    return f


def launch(cu, f, stream=None):
    ok(cu.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, None, None), "cuLaunchKernel")


def dalloc(cu, nbytes):
    p = ctypes.c_uint64()
    ok(cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes)), "cuMemAlloc_v2")
    return p.value


def new_stream(cu, flags=1):
    s = c_void_p()
    ok(cu.cuStreamCreate(ctypes.byref(s), flags), "cuStreamCreate")
    return s
