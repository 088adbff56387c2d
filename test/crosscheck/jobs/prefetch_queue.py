#!/usr/bin/env python3
"""prefetch_queue: a prefetch thread, a checkpoint on the loop, a metrics lock.

A prefetch thread fills a queue.Queue(maxsize=2) with batches; the loop
takes one per step (queue.get), launches six kernels on the legacy stream,
copies each batch host-to-device and reads the loss back (cuMemcpyDtoH,
synchronous). Stalls:
  - lock/decode_samples: every 20th batch (offset 10) the prefetch thread
    decodes it in pure Python for 60 ms; the loop drains the queue and
    waits in queue.get for the thread. The loop waits on a condition
    the producer holds it on; the producer's code is what to change.
  - io.read/read_shard: every 20th batch (offset 0) the prefetch thread
    reads a 48 MiB shard with O_DIRECT in 256 KiB reads (each waits for
    the device); the loop waits in queue.get while it reads.
  - io.write/save_checkpoint: every 30th step (offset 5) the loop writes a
    checkpoint on its own thread: 1024 writes of 8 KiB and an fsync
    (torch.save of many small tensors).
  - io.read/load_shard: every 30th step (offset 15) load_shard copies
    8 MiB of a memory-mapped file whose pages were unmapped and dropped
    into a reused host buffer (one copy in C: the page faults read the
    file).
  - lock/flush_metrics: every 30th step (offset 25) the metrics thread
    takes the metrics lock and sleeps 50 ms in flush_metrics holding it;
    the loop's record_metric waits for the lock.
The prefetch thread starts a slow batch once the loop has taken every
earlier one (it has fallen behind), so the loop's wait in queue.get for
the tagged batch is the stall; it is written where it lasted 5 ms or more.
"""

import argparse
import ctypes
import mmap
import os
import queue
import threading
import time

import simcu
import xtruth

SHARD_MB = 48
MAP_MB = 48


def decode_samples(ms):
    deadline = time.perf_counter() + ms / 1000.0
    acc = 0
    while time.perf_counter() < deadline:
        for i in range(200):
            acc = (acc * 1103515245 + i) & 0xFFFFFFFF
    return acc


def read_shard(path, buf):
    # O_DIRECT, as a loader that bypasses the page cache reads: each read
    # waits for the device (a buffered read of a host-cached virtual disk
    # is a memory copy, mostly on the CPU).
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:  # a file system without O_DIRECT (tmpfs): drop the pages
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    try:
        n = 0
        while True:
            r = os.preadv(fd, [buf], n)
            if r <= 0:
                return n
            n += r
    finally:
        os.close(fd)


def make_file(path, mb):
    with open(path, "wb") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(mb):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


class Prefetcher(threading.Thread):
    def __init__(self, shard):
        super().__init__(name="prefetch", daemon=True)
        self.q = queue.Queue(maxsize=2)
        self.shard = shard
        self.stop = False
        self.buf = memoryview(mmap.mmap(-1, 256 << 10))  # page-aligned, for O_DIRECT

    def run(self):
        i = 0
        while not self.stop:
            i += 1
            tag = None
            if i % 20 in (0, 10):
                self.q.join()  # fallen behind: the loop has taken every batch
            if i % 20 == 10:
                decode_samples(60)
                tag = ("lock", "decode_samples")
            elif i % 20 == 0:
                read_shard(self.shard, self.buf)
                tag = ("io.read", "read_shard")
            self.q.put((i, tag))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True)
    p.add_argument("--truth")
    p.add_argument("--steps", type=int, default=420)
    p.add_argument("--dir", default="/var/tmp")
    a = p.parse_args()
    truth = xtruth.Truth(a.truth, "prefetch_queue")
    base = os.path.join(a.dir, "pq-%d" % os.getpid())
    shard, mapped, ckpt = base + "-shard.bin", base + "-map.bin", base + "-ckpt.pt"
    make_file(shard, SHARD_MB)
    make_file(mapped, MAP_MB)
    mfd = os.open(mapped, os.O_RDONLY)
    mm = mmap.mmap(mfd, 0, prot=mmap.PROT_READ)
    view = memoryview(mm)
    staging = bytearray(8 << 20)  # the batch's host buffer, reused
    cursor = [0]

    metrics_lock = threading.Lock()
    metrics = {}
    go, held = threading.Event(), threading.Event()

    def flush_metrics():
        with metrics_lock:
            held.set()
            time.sleep(0.05)
            metrics.clear()

    def metrics_thread():
        while True:
            go.wait()
            go.clear()
            if stop[0]:
                return
            flush_metrics()

    stop = [False]
    mt = threading.Thread(target=metrics_thread, name="metrics", daemon=True)
    mt.start()

    def record_metric(step):
        held.wait()
        held.clear()
        with xtruth.timed_stall(truth, "lock", "flush_metrics"):
            with metrics_lock:
                metrics[step] = 1.0 / step

    blob = os.urandom(8192)

    def save_checkpoint():
        with xtruth.timed_stall(truth, "io.write", "save_checkpoint", path=ckpt):
            fd = os.open(ckpt, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for _ in range(1024):
                    os.write(fd, blob)
                os.fsync(fd)
            finally:
                os.close(fd)

    def load_shard():
        span = 8 << 20
        off = cursor[0] % ((MAP_MB << 20) - span)
        cursor[0] += span
        # Unmap the pages, then drop them: fadvise keeps pages still mapped.
        mm.madvise(mmap.MADV_DONTNEED, off, span)
        os.posix_fadvise(mfd, off, span, os.POSIX_FADV_DONTNEED)
        with xtruth.timed_stall(truth, "io.read", "load_shard", path=mapped):
            staging[:] = view[off:off + span]

    cu, _ctx, mod, _img = simcu.open_device(a.lib)
    fns = [simcu.kernel(cu, mod, us) for us in (1500, 1000, 1000, 800, 800, 400)]
    cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    batch_dev, loss_dev = simcu.dalloc(cu, 64 << 10), simcu.dalloc(cu, 4)
    batch_host = ctypes.create_string_buffer(64 << 10)
    loss = ctypes.c_float()
    pf = Prefetcher(shard)
    pf.start()
    try:
        for step in range(1, a.steps + 1):
            # The loop's own stalls fall between the prefetch thread's
            # slow batches (every 10th): never two stalls at once.
            if step % 30 == 5:
                save_checkpoint()
            elif step % 30 == 15:
                load_shard()
            elif step % 30 == 24:
                go.set()
            elif step % 30 == 25:
                record_metric(step)
            d0, w0 = xtruth.run_delay_ns(), time.time_ns()
            _i, tag = pf.q.get()
            w1 = time.time_ns()
            pf.q.task_done()
            if tag is not None and w1 - w0 >= 5_000_000:
                truth.stall(tag[0], tag[1], w0, w1, xtruth.run_delay_ns() - d0)
            t0 = time.time_ns()
            simcu.ok(cu.cuMemcpyHtoD_v2(batch_dev, batch_host, 64 << 10), "batch copy")
            for f in fns:
                simcu.launch(cu, f)
            simcu.ok(cu.cuMemcpyDtoH_v2(ctypes.addressof(loss), loss_dev, 4), "loss read")
            truth.step(step, t0, time.time_ns())
    finally:
        pf.stop = True
        stop[0] = True
        go.set()
        try:
            pf.q.get_nowait()
        except queue.Empty:
            pass
        view.release()
        mm.close()
        os.close(mfd)
        for f in (shard, mapped, ckpt):
            if os.path.exists(f):
                os.unlink(f)
    truth.close()


if __name__ == "__main__":
    main()
