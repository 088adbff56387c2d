#!/usr/bin/env python3
"""mp_loader: batches from multiprocessing workers, one of them slow.

Three worker processes (forked before the device is opened) take batch
indices from their own index queue and put (index, payload) on one result
queue, as a DataLoader with num_workers=3 and prefetch_factor=2 does.
Worker 2 computes 45 ms of pure Python per batch, the others 1 ms. The
loop takes batches in index order (keeping early arrivals), uploads each
with a synchronous copy, runs five kernels and reads the loss with
cuCtxSynchronize and a synchronous copy. Every wait for one of the slow
worker's batches is a loader.wait.cpu stall, in next_batch.
"""

import argparse
import ctypes
import multiprocessing as mp
import time

import simcu
import xtruth

WORKERS = 3
SLOW = 2
PREFETCH = 2


def worker_main(wid, index_q, result_q):
    cost = 0.045 if wid == SLOW else 0.001
    while True:
        idx = index_q.get()
        if idx is None:
            return
        end = time.perf_counter() + cost
        x = idx
        while time.perf_counter() < end:
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        result_q.put((idx, bytes(64 << 10)))


class Loader:
    def __init__(self, total):
        ctx = mp.get_context("fork")
        self.result_q = ctx.Queue()
        self.index_qs = [ctx.Queue() for _ in range(WORKERS)]
        self.procs = [ctx.Process(target=worker_main, args=(w, self.index_qs[w], self.result_q), daemon=True)
                      for w in range(WORKERS)]
        for pr in self.procs:
            pr.start()
        self.total, self.sent, self.ready = total, 0, {}
        for _ in range(WORKERS * PREFETCH):
            self._send()

    def _send(self):
        if self.sent < self.total:
            self.index_qs[self.sent % WORKERS].put(self.sent)
            self.sent += 1

    def next_batch(self, idx, truth):
        slow = idx % WORKERS == SLOW
        t0 = time.time_ns()
        d0 = xtruth.run_delay_ns()
        while idx not in self.ready:
            i, payload = self.result_q.get()
            self.ready[i] = payload
        t1 = time.time_ns()
        if slow and t1 - t0 >= 1_000_000:
            truth.stall("loader.wait.cpu", "next_batch", t0, t1, xtruth.run_delay_ns() - d0,
                        worker=self.procs[SLOW].pid)
        self._send()
        return self.ready.pop(idx)

    def close(self):
        for q in self.index_qs:
            q.put(None)
        for pr in self.procs:
            pr.join(timeout=5)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True)
    p.add_argument("--truth")
    p.add_argument("--steps", type=int, default=360)
    a = p.parse_args()
    truth = xtruth.Truth(a.truth, "mp_loader")
    loader = Loader(a.steps)
    cu, _ctx, mod, _img = simcu.open_device(a.lib)
    fns = [simcu.kernel(cu, mod, us) for us in (2500, 2000, 1500, 1000, 500)]
    dev_batch = simcu.dalloc(cu, 64 << 10)
    loss_dev = simcu.dalloc(cu, 4)
    loss = ctypes.c_float()
    for idx in range(a.steps):
        payload = loader.next_batch(idx, truth)
        t0 = time.time_ns()
        simcu.ok(cu.cuMemcpyHtoD_v2(ctypes.c_uint64(dev_batch), payload, ctypes.c_size_t(len(payload))), "upload")
        for f in fns:
            simcu.launch(cu, f)
        simcu.ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        simcu.ok(cu.cuMemcpyDtoH_v2(ctypes.byref(loss), ctypes.c_uint64(loss_dev), ctypes.c_size_t(4)), "loss")
        truth.step(idx + 1, t0, time.time_ns())
    loader.close()
    truth.close()


if __name__ == "__main__":
    main()
