#!/usr/bin/env python3
"""pytrain - a Python training loop on the simulated GPU, for GIL contention.

The main thread drives libcuda through ctypes as a PyTorch loop drives the
driver: per step it launches kernels and synchronizes. Every ctypes call
releases the GIL and takes it back on return. A background Python thread
(a logger, a metrics exporter, a pin-memory thread doing work in Python)
computes in pure Python in bursts, every E steps for M ms, holding the GIL;
meanwhile the main thread waits for the GIL after every driver call and the
GPU starves. With --burst-kind mutex-sleep the burst instead holds a
threading.Lock while it sleeps (an upload or a rate limit under a lock),
and the main thread, logging under the same lock, waits for it.

--truth FILE writes JSON Lines: a meta record (pid, main and background
thread ids), one "burst" record per background compute burst and one "step"
record per step, with CLOCK_REALTIME nanosecond timestamps (start, end);
a step's run_delay_ns is how long the main thread was runnable but not
running during it (its schedstat), which the machine's load adds and the
GIL does not.

--stall-every S adds a host stall of --stall-ms after every S-th step, once
no background burst runs, each in a function of its own, in turn: read_batch
(O_DIRECT reads of a data file, so they reach the disk), wait_for_peer (a
sleep), with --pageable copy_pageable (host-to-device copies from pageable
memory, which the driver stages before each call returns) and, with --peer,
fetch_remote (a request to a TCP server, which
answers after the stall length: it must be another, untraced, program, as
a remote data service would be). Each writes a "stall" record: kind, start, end, and the function
(qualname), file and line of its blocking call as the interpreter numbers
them. The meta record names the lines of Driver.launch and Driver.sync's
driver calls, where the main thread waits for the GIL after a driver call.
SIGINT/SIGTERM stop after the current step; exit 0.

--hang-at N makes step N hang for good, as a job does that a hang detector
must report: --hang-kind loader (the default) forks a data-loader worker
while another thread holds a lock the worker then takes (the lock stays
held in the child forever: the classic fork-with-threads deadlock), and the
main thread blocks reading the worker's pipe in next_batch; --hang-kind
stream launches one kernel that runs an hour and synchronizes on it in
drain_stream: a sync on a stream that never drains. A "hang" record (kind,
step, start, tid, the function and line of the blocking call, the worker's
pid) is written before the call blocks.
"""

import argparse
import ctypes
import inspect
import json
import mmap
import os
import signal
import socket
import sys
import threading
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lib", required=True, help="directory of the simulated libcuda.so.1")
    p.add_argument("--steps", type=int, default=1000000)
    p.add_argument("--kernels", type=int, default=8, help="kernels per step")
    p.add_argument("--kernel-us", type=int, default=2000, help="duration of each kernel")
    p.add_argument("--burst-every", type=int, default=4, help="a background burst every E steps")
    p.add_argument("--burst-ms", type=int, default=40, help="length of a background burst")
    p.add_argument("--burst-kind", choices=("gil", "mutex-sleep"), default="gil",
                   help="compute holding the GIL, or sleep holding a lock the main thread then takes")
    p.add_argument("--truth", help="write the ground truth here (JSON Lines)")
    p.add_argument("--stall-every", type=int, default=0, help="a host stall after every S-th step (0: none)")
    p.add_argument("--stall-ms", type=int, default=20, help="length of a host stall")
    p.add_argument("--data-dir", default=".", help="where read_batch keeps its data file")
    p.add_argument("--peer", help="HOST:PORT of the server fetch_remote asks (it answers a line of ms after as many ms)")
    p.add_argument("--pageable", action="store_true", help="copy_pageable takes its turn among the stalls")
    p.add_argument("--causes", action="store_true",
                   help="only the stalls of pycauses.py take turns: Python on the main thread, a pipe with a slow "
                   "reader, a subprocess, cold pages of a mapped file, gc.collect")
    p.add_argument("--hang-at", type=int, default=0, help="step N hangs for good (0: none)")
    p.add_argument("--hang-kind", choices=("loader", "stream"), default="loader",
                   help="how step --hang-at hangs: a deadlocked loader worker, or a stream that never drains")
    a = p.parse_args()
    for name in ("steps", "kernels", "kernel_us", "burst_every", "burst_ms", "stall_ms"):
        if getattr(a, name) < 1:
            p.error("--%s must be at least 1" % name.replace("_", "-"))
    if a.stall_every < 0:
        p.error("--stall-every must be at least 0")
    if a.hang_at < 0:
        p.error("--hang-at must be at least 0")
    return a


def load_module(libdir, prog, check):
    """Loads libcuda.so.1 from libdir, makes device 0's primary context
    current and loads the simulated module: (the library, the module, its
    image, which the caller keeps alive). check(result, what) judges each
    call; prog names the program in the error of a library that will not
    load."""
    path = os.path.join(libdir, "libcuda.so.1")
    try:
        cu = ctypes.CDLL(path)
    except OSError as e:
        sys.exit("%s: load %s: %s" % (prog, path, e))
    check(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    image = ctypes.create_string_buffer(b"simgpu-module")
    mod = ctypes.c_void_p()
    check(cu.cuModuleLoadData(ctypes.byref(mod), image), "cuModuleLoadData")
    return cu, mod, image


class Driver:
    """The few driver entry points the loop needs, through ctypes."""

    def __init__(self, libdir, kernel_us):
        self.cu, mod, self.image = load_module(libdir, "pytrain", self.check)
        self.mod = mod
        self.func = ctypes.c_void_p()
        name = ("sim_kernel_%d" % kernel_us).encode()
        self.check(self.cu.cuModuleGetFunction(ctypes.byref(self.func), mod, name), "cuModuleGetFunction")
        self.dptr = ctypes.c_uint64()
        self.check(self.cu.cuMemAlloc_v2(ctypes.byref(self.dptr), ctypes.c_size_t(1 << 20)), "cuMemAlloc_v2")
        self.params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(self.dptr), ctypes.c_void_p))
        self.cu.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [
            ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self.cu.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        self.cu.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]

    @staticmethod
    def check(r, what):
        if r != 0:
            sys.exit("pytrain: %s failed: CUresult %d" % (what, r))

    def launch(self):
        self.check(self.cu.cuLaunchKernel(self.func, 108, 1, 1, 256, 1, 1, 0, None, self.params, None),
                   "cuLaunchKernel")

    def sync(self):
        self.check(self.cu.cuStreamSynchronize(None), "cuStreamSynchronize")


def next_batch(truth, step):
    """A data-loader worker that deadlocks: forked while another thread of
    this process holds a lock that the worker takes before it answers. The
    main thread waits for the batch in a read of the worker's pipe."""
    lock, held, release = threading.Lock(), threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            release.wait()

    threading.Thread(target=hold, name="pytrain-pin", daemon=True).start()
    held.wait()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        with lock:  # held by a thread that does not exist in the child: never
            os.write(w, b"batch")
        os._exit(0)
    os.close(w)
    release.set()
    line = sys._getframe().f_lineno + 3  # the read's
    truth.write({"type": "hang", "kind": "loader", "step": step, "start": time.time_ns(), "worker": pid,
                 "tid": threading.get_native_id(), "function": "next_batch", "file": __file__, "line": line})
    return os.read(r, 5)


def drain_stream(drv, truth, step):
    """One kernel that runs an hour, then a sync on its stream."""
    name = b"sim_kernel_3600000000"
    func = ctypes.c_void_p()
    drv.check(drv.cu.cuModuleGetFunction(ctypes.byref(func), drv.mod, name), "cuModuleGetFunction")
    drv.check(drv.cu.cuLaunchKernel(func, 108, 1, 1, 256, 1, 1, 0, None, drv.params, None), "cuLaunchKernel")
    line = sys._getframe().f_lineno + 3  # the sync's
    truth.write({"type": "hang", "kind": "stream", "step": step, "start": time.time_ns(),
                 "tid": threading.get_native_id(), "function": "drain_stream", "file": __file__, "line": line})
    drv.sync()


def here():
    """The caller's function (qualname where the interpreter has one) and
    the line after the caller's current one: called on the line before a
    blocking call, it names that call."""
    f = sys._getframe(1)
    return getattr(f.f_code, "co_qualname", f.f_code.co_name), f.f_lineno + 1


def call_line(func, callee):
    """The line of func's source that calls callee."""
    lines, first = inspect.getsourcelines(func)
    for i, text in enumerate(lines):
        if callee + "(" in text:
            return first + i
    raise LookupError("%s does not call %s" % (func.__qualname__, callee))


class Stalls:
    """Host stalls between steps, each blocking in a function of its own."""

    DATA_BYTES = 8 << 20
    CHUNK = 1 << 20
    PAGEABLE_BYTES = 4 << 20

    def __init__(self, ms, data_dir, peer, drv, pageable, causes=False):
        self.ms, self.ns = ms, ms * 1000000
        self.file = __file__
        if causes:
            import pycauses
            self.more = pycauses.Causes(ms, data_dir)
            self.kinds, self.file = self.more.kinds, pycauses.__file__
            self.n = 0
            return
        self.more = None
        self.path = os.path.join(data_dir, "pytrain-data.bin")
        with open(self.path, "wb") as f:
            f.write(os.urandom(self.DATA_BYTES))
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
            self.direct = True
        except OSError:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            self.direct = False
        self.buf = mmap.mmap(-1, self.CHUNK)  # page-aligned, as O_DIRECT wants
        self.off = 0
        self.drv = drv
        self.host = ctypes.create_string_buffer(self.PAGEABLE_BYTES)  # pageable: the driver stages it
        self.kinds = [("read", self.read_batch), ("sleep", self.wait_for_peer)]
        if pageable:
            self.kinds.append(("pageable", self.copy_pageable))
        if peer:
            host, _, port = peer.rpartition(":")
            self.sock = socket.create_connection((host, int(port)))
            self.kinds.append(("socket", self.fetch_remote))
        self.n = 0

    def read_batch(self):
        deadline = time.monotonic_ns() + self.ns
        site = None
        while time.monotonic_ns() < deadline:
            if not self.direct:
                os.posix_fadvise(self.fd, self.off, self.CHUNK, os.POSIX_FADV_DONTNEED)
            site = here()
            os.preadv(self.fd, [self.buf], self.off)
            self.off = (self.off + self.CHUNK) % self.DATA_BYTES
        return site

    def wait_for_peer(self):
        site = here()
        time.sleep(self.ns / 1e9)
        return site

    def copy_pageable(self):
        """A batch copied from pageable memory: each "async" copy returns only
        once the driver has staged it."""
        deadline = time.monotonic_ns() + self.ns
        site = None
        while time.monotonic_ns() < deadline:
            site = here()
            r = self.drv.cu.cuMemcpyHtoDAsync_v2(self.drv.dptr.value, self.host, self.PAGEABLE_BYTES, None)
            self.drv.check(r, "cuMemcpyHtoDAsync_v2")
        self.drv.sync()
        return site

    def fetch_remote(self):
        self.sock.sendall(b"%d\n" % self.ms)
        site = here()
        self.sock.recv(64)
        return site

    def run(self, truth, step):
        kind, fn = self.kinds[self.n % len(self.kinds)]
        self.n += 1
        sched_fd = getattr(self, "sched_fd", None)
        if sched_fd is None:
            try:
                sched_fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                sched_fd = -1
            self.sched_fd = sched_fd
        start, rd0 = time.time_ns(), run_delay_ns(sched_fd)
        site = fn()
        function, line = site[:2]
        if len(site) > 2:
            start = site[2]  # the stall proper began after its setup
        truth.write({"type": "stall", "kind": kind, "step": step, "start": start, "end": time.time_ns(),
                     "function": function, "file": self.file, "line": line, "tid": threading.get_native_id(),
                     "run_delay_ns": run_delay_ns(sched_fd) - rd0})

    def close(self):
        if self.more is not None:
            self.more.close()


class Truth:
    def __init__(self, path):
        self.f = open(path, "w", encoding="utf-8") if path else None
        self.mu = threading.Lock()

    def write(self, rec):
        if self.f is None:
            return
        with self.mu:
            self.f.write(json.dumps(rec) + "\n")
            self.f.flush()

    def close(self):
        if self.f is not None:
            self.f.close()


def run_delay_ns(fd):
    """The calling thread's run-queue wait so far, from the fd of its
    /proc/thread-self/schedstat (0 where the kernel has no schedstats)."""
    if fd < 0:
        return 0
    try:
        return int(os.pread(fd, 128, 0).split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def background(truth, requests, stop, idle, held):
    """Computes in pure Python for each requested burst, holding the GIL
    except when the interpreter's switch interval makes it yield, or with
    held (a lock and an event) sleeps holding the lock; idle is clear while
    a burst is requested or runs."""
    while True:
        requests.wait()
        requests.clear()
        if stop.is_set():
            return
        step, ms = background.pending
        if held:
            mu, taken = held
            with mu:
                start = time.time_ns()
                taken.set()
                time.sleep(ms / 1000)
                end = time.time_ns()
            truth.write({"type": "burst", "step": step, "start": start, "end": end,
                         "tid": threading.get_native_id()})
            idle.set()
            continue
        start = time.time_ns()
        deadline = start + ms * 1000000
        x = 1
        while time.time_ns() < deadline:
            for _ in range(200):
                x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        truth.write({"type": "burst", "step": step, "start": start, "end": time.time_ns(),
                     "tid": threading.get_native_id()})
        idle.set()


def main():
    a = parse_args()
    stopping = []
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    drv = Driver(a.lib, a.kernel_us)
    truth = Truth(a.truth)
    requests, stop, idle = threading.Event(), threading.Event(), threading.Event()
    idle.set()
    stalls = Stalls(a.stall_ms, a.data_dir, a.peer, drv, a.pageable, a.causes) if a.stall_every else None
    held = (threading.Lock(), threading.Event()) if a.burst_kind == "mutex-sleep" else None
    bg = threading.Thread(target=background, args=(truth, requests, stop, idle, held), name="pytrain-bg", daemon=True)
    bg.start()
    while bg.native_id is None:
        time.sleep(0.001)
    truth.write({"type": "meta", "pid": os.getpid(), "tid": threading.get_native_id(),
                 "bg_tid": bg.native_id, "kernels": a.kernels, "kernel_us": a.kernel_us,
                 "burst_every": a.burst_every, "burst_ms": a.burst_ms, "burst_kind": a.burst_kind, "file": __file__,
                 "launch_line": call_line(Driver.launch, "cuLaunchKernel"),
                 "sync_line": call_line(Driver.sync, "cuStreamSynchronize")})
    try:
        sched_fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        sched_fd = -1
    step = 0
    while step < a.steps and not stopping:
        step += 1
        if step % a.burst_every == 0:
            background.pending = (step, a.burst_ms)
            idle.clear()
            requests.set()
        start, rd0 = time.time_ns(), run_delay_ns(sched_fd)
        if held and step % a.burst_every == 0:
            held[1].wait()
            held[1].clear()
            with held[0]:  # log a metric under the lock the burst holds
                pass
        if step == a.hang_at and a.hang_kind == "loader":
            next_batch(truth, step)
        for _ in range(a.kernels):
            drv.launch()
        if step == a.hang_at and a.hang_kind == "stream":
            drain_stream(drv, truth, step)
        drv.sync()
        truth.write({"type": "step", "step": step, "start": start, "end": time.time_ns(),
                     "run_delay_ns": run_delay_ns(sched_fd) - rd0})
        if stalls and step % a.stall_every == 0:
            idle.wait()
            stalls.run(truth, step)
    stop.set()
    requests.set()
    bg.join()
    if stalls:
        stalls.close()
    truth.write({"type": "end", "steps": step})
    truth.close()
    print("pytrain: %d steps" % step)


if __name__ == "__main__":
    main()
