#!/usr/bin/env python3
"""sparse_loss: the loss is read only every 10th iteration; an EMA thread.

A Trainer object owns the step: upload (pinned host buffer, async on the
compute stream), six kernels, and every 10th iteration an event recorded
after the work and waited for, then the loss copied back (the usual way to
keep syncs out of a loop). Every iteration is one optimizer step. A
background EMA thread, every 5 iterations, copies the weights to host
memory on its own stream and synchronizes it, as a model-averaging helper
does. Stalls on the loop's thread: append_metrics writes and fsyncs a
metrics file at every loss read after the 20th (io.write), backoff sleeps
20 ms every 17th iteration (sleep).
"""

import argparse
import ctypes
import os
import threading
import time

import simcu
import xtruth


class EMA:
    def __init__(self, cu, ctx, nbytes):
        self.cu, self.ctx = cu, ctx
        self.src = simcu.dalloc(cu, nbytes)
        self.host = ctypes.create_string_buffer(nbytes)
        self.wake = threading.Semaphore(0)
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="ema", daemon=True)
        self.thread.start()

    def _loop(self):
        self.cu.cuCtxSetCurrent(self.ctx)
        s = simcu.new_stream(self.cu)
        while True:
            self.wake.acquire()
            if self.stopping:
                return
            for off in range(0, len(self.host), 1 << 20):
                simcu.ok(self.cu.cuMemcpyDtoHAsync_v2(ctypes.addressof(self.host) + off, self.src + off,
                                                      1 << 20, s), "ema copy")
            simcu.ok(self.cu.cuStreamSynchronize(s), "ema sync")

    def update(self):
        self.wake.release()

    def stop(self):
        self.stopping = True
        self.wake.release()
        self.thread.join()


class Trainer:
    def __init__(self, libdir, data_dir, truth):
        self.cu, self.ctx, mod, self._img = simcu.open_device(libdir)
        self.truth = truth
        self.kernels = [simcu.kernel(self.cu, mod, us) for us in (1200, 900, 900, 600, 600, 300)]
        self.stream = simcu.new_stream(self.cu)
        self.done = ctypes.c_void_p()
        simcu.ok(self.cu.cuEventCreate(ctypes.byref(self.done), 0), "cuEventCreate")
        pinned = ctypes.c_void_p()
        simcu.ok(self.cu.cuMemAllocHost_v2(ctypes.byref(pinned), ctypes.c_size_t(1 << 20)), "pinned")
        self.pinned = pinned
        self.batch = simcu.dalloc(self.cu, 1 << 20)
        self.loss_dev = simcu.dalloc(self.cu, 4)
        self.loss = ctypes.c_float()
        self.metrics = os.path.join(data_dir, "metrics-%d.log" % os.getpid())
        self.ema = EMA(self.cu, self.ctx, 8 << 20)

    def append_metrics(self, it):
        with xtruth.timed_stall(self.truth, "io.write", "append_metrics"):
            with open(self.metrics, "ab") as f:
                f.write(b"%d %f\n" % (it, self.loss.value) * 20000)
                f.flush()
                os.fsync(f.fileno())

    def backoff(self):
        with xtruth.timed_stall(self.truth, "sleep", "backoff"):
            time.sleep(0.02)

    def iteration(self, it):
        cu, s = self.cu, self.stream
        simcu.ok(cu.cuMemcpyHtoDAsync_v2(self.batch, self.pinned, 1 << 20, s), "upload")
        for f in self.kernels:
            simcu.launch(cu, f, s)
        if it % 10 == 0:
            simcu.ok(cu.cuEventRecord(self.done, s), "record")
            simcu.ok(cu.cuEventSynchronize(self.done), "wait")
            simcu.ok(cu.cuMemcpyDtoHAsync_v2(ctypes.addressof(self.loss), self.loss_dev, 4, s), "loss")
            simcu.ok(cu.cuStreamSynchronize(s), "loss sync")

    def fit(self, iterations):
        for it in range(1, iterations + 1):
            if it % 17 == 0:
                self.backoff()
            t0 = time.time_ns()
            self.iteration(it)
            self.truth.step(it, t0, time.time_ns())
            if it % 10 == 0 and it > 20:
                self.append_metrics(it)
            if it % 5 == 0:
                self.ema.update()
        self.ema.stop()
        os.unlink(self.metrics)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True)
    p.add_argument("--truth")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--data-dir", default="/var/tmp")
    a = p.parse_args()
    truth = xtruth.Truth(a.truth, "sparse_loss")
    Trainer(a.lib, a.data_dir, truth).fit(a.steps)
    truth.close()


if __name__ == "__main__":
    main()
