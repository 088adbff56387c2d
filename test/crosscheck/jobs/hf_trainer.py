#!/usr/bin/env python3
"""hf_trainer: a loop shaped like Hugging Face's Trainer.

One optimizer step is eight micro-batches (gradient accumulation 8): each
uploads its batch from pinned memory and launches forward and backward;
the loss stays on the device and is summed there (tr_loss += loss). The
eighth is followed by gradient clipping and the optimizer's kernels, with
no sync: the host runs ahead of the GPU. The loss is read (.item()) only
at logging steps, every 5 optimizer steps. Every 40 steps evaluate() runs
its own batches, each with a metric read; every 60 steps save_checkpoint()
copies 24 tensors to the host one by one from the main thread
(synchronous copies, as state_dict().cpu() does) and writes them. Stall:
fetch_shard sleeps 25 ms before every 23rd step.
"""

import argparse
import ctypes
import os
import time

import simcu
import xtruth

ACCUM = 8


class Trainer:
    def __init__(self, libdir, out_dir, truth):
        self.cu, self.ctx, mod, self._img = simcu.open_device(libdir)
        self.truth = truth
        k = lambda us: simcu.kernel(self.cu, mod, us)
        self.fwd, self.bwd, self.clip, self.adam = k(250), k(450), k(60), k(200)
        self.eval_fwd = k(300)
        self.stream = simcu.new_stream(self.cu)
        pinned = ctypes.c_void_p()
        simcu.ok(self.cu.cuMemAllocHost_v2(ctypes.byref(pinned), ctypes.c_size_t(256 << 10)), "pinned")
        self.pinned = pinned
        self.batch = simcu.dalloc(self.cu, 256 << 10)
        self.tr_loss = simcu.dalloc(self.cu, 4)
        self.host_loss = ctypes.c_float()
        self.params = [(simcu.dalloc(self.cu, 512 << 10), 512 << 10) for _ in range(24)]
        self.ckpt_buf = ctypes.create_string_buffer(512 << 10)
        self.ckpt = os.path.join(out_dir, "hf-ckpt-%d.bin" % os.getpid())

    def training_step(self):
        cu, s = self.cu, self.stream
        simcu.ok(cu.cuMemcpyHtoDAsync_v2(self.batch, self.pinned, 256 << 10, s), "batch")
        simcu.launch(cu, self.fwd, s)
        simcu.launch(cu, self.bwd, s)

    def optimizer_step(self):
        simcu.launch(self.cu, self.clip, self.stream)
        for _ in range(3):
            simcu.launch(self.cu, self.adam, self.stream)

    def item(self, ptr):
        simcu.ok(self.cu.cuMemcpyDtoHAsync_v2(ctypes.addressof(self.host_loss), ptr, 4, self.stream), "item")
        simcu.ok(self.cu.cuStreamSynchronize(self.stream), "item sync")
        return self.host_loss.value

    def log(self, step):
        return self.item(self.tr_loss)

    def evaluate(self):
        metrics = []
        for _ in range(15):
            simcu.ok(self.cu.cuMemcpyHtoDAsync_v2(self.batch, self.pinned, 256 << 10, self.stream), "eval batch")
            simcu.launch(self.cu, self.eval_fwd, self.stream)
            metrics.append(self.item(self.batch))
        return metrics

    def save_checkpoint(self):
        with open(self.ckpt, "wb") as f:
            for ptr, n in self.params:
                simcu.ok(self.cu.cuMemcpyDtoH_v2(ctypes.addressof(self.ckpt_buf), ptr, n), "state copy")
                f.write(self.ckpt_buf.raw)

    def fetch_shard(self):
        with xtruth.timed_stall(self.truth, "sleep", "fetch_shard"):
            time.sleep(0.025)

    def train(self, steps):
        for step in range(1, steps + 1):
            if step % 23 == 0:
                self.fetch_shard()
            t0 = time.time_ns()
            for _ in range(ACCUM):
                self.training_step()
            self.optimizer_step()
            if step % 5 == 0:
                self.log(step)
            self.truth.step(step, t0, time.time_ns())
            if step % 40 == 0:
                self.evaluate()
            if step % 60 == 0:
                self.save_checkpoint()
        os.unlink(self.ckpt)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True)
    p.add_argument("--truth")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--data-dir", default="/var/tmp")
    a = p.parse_args()
    truth = xtruth.Truth(a.truth, "hf_trainer")
    Trainer(a.lib, a.data_dir, truth).train(a.steps)
    truth.close()


if __name__ == "__main__":
    main()
