#!/usr/bin/env python3
"""lightning_hooks: a loop shaped like PyTorch Lightning's fit loop.

The batch goes through layers: FitLoop.run -> advance -> the callbacks'
on_train_batch_start -> Strategy.training_step -> Module.training_step
(upload, forward, backward) -> optimizer_step (closure, optimizer kernels)
-> the callbacks' on_train_batch_end. A MetricsCallback logs the loss
every step through Module.log -> ResultCollection.update -> _sync ->
_item, which reads it (async copy, stream sync). Every 30 steps the same
loop's _run_validation runs 12 validation batches whose validation_step
logs its loss through the very same Module.log chain, so the read's own
frames (and the three above them) are the training's. Stall: a callback
sleeps 20 ms every 19th step (checkpoint_wait).
"""

import argparse
import ctypes
import time

import simcu
import xtruth


class ResultCollection:
    def __init__(self, module):
        self.module = module

    def _item(self, ptr):
        m = self.module
        simcu.ok(m.cu.cuMemcpyDtoHAsync_v2(ctypes.addressof(m.host), ptr, 4, m.stream), "item")
        simcu.ok(m.cu.cuStreamSynchronize(m.stream), "item sync")
        return m.host.value

    def _sync(self, ptr):
        return self._item(ptr)

    def update(self, name, ptr):
        return self._sync(ptr)


class Module:
    def __init__(self, libdir):
        self.cu, self.ctx, mod, self._img = simcu.open_device(libdir)
        k = lambda us: simcu.kernel(self.cu, mod, us)
        self.kf, self.kb, self.kopt, self.kval = k(900), k(1500), k(400), k(700)
        self.stream = simcu.new_stream(self.cu)
        pinned = ctypes.c_void_p()
        simcu.ok(self.cu.cuMemAllocHost_v2(ctypes.byref(pinned), ctypes.c_size_t(512 << 10)), "pinned")
        self.pinned = pinned
        self.batch = simcu.dalloc(self.cu, 512 << 10)
        self.loss = simcu.dalloc(self.cu, 4)
        self.host = ctypes.c_float()
        self.results = ResultCollection(self)

    def log(self, name, ptr):
        return self.results.update(name, ptr)

    def _upload(self):
        simcu.ok(self.cu.cuMemcpyHtoDAsync_v2(self.batch, self.pinned, 512 << 10, self.stream), "batch")

    def training_step(self, batch):
        self._upload()
        simcu.launch(self.cu, self.kf, self.stream)
        simcu.launch(self.cu, self.kb, self.stream)
        simcu.launch(self.cu, self.kb, self.stream)
        return self.loss

    def validation_step(self, batch):
        self._upload()
        simcu.launch(self.cu, self.kval, self.stream)
        self.log("val_loss", self.loss)

    def optimizer_step(self, closure):
        out = closure()
        simcu.launch(self.cu, self.kopt, self.stream)
        simcu.launch(self.cu, self.kopt, self.stream)
        return out


class Strategy:
    def __init__(self, module):
        self.module = module

    def training_step(self, batch):
        return self.module.optimizer_step(lambda: self.module.training_step(batch))


class Callback:
    def on_train_batch_start(self, loop, batch):
        pass

    def on_train_batch_end(self, loop, outputs, batch):
        pass


class MetricsCallback(Callback):
    def on_train_batch_end(self, loop, outputs, batch):
        loop.module.log("train_loss", outputs)


class SlowStorageCallback(Callback):
    def on_train_batch_start(self, loop, batch):
        if batch % 19 == 0:
            self.checkpoint_wait(loop)

    def checkpoint_wait(self, loop):
        with xtruth.timed_stall(loop.truth, "sleep", "checkpoint_wait"):
            time.sleep(0.02)


class FitLoop:
    def __init__(self, module, callbacks, truth):
        self.module, self.callbacks, self.truth = module, callbacks, truth
        self.strategy = Strategy(module)

    def _call_hook(self, name, *args):
        for cb in self.callbacks:
            getattr(cb, name)(self, *args)

    def advance(self, batch):
        self._call_hook("on_train_batch_start", batch)
        t0 = time.time_ns()
        outputs = self.strategy.training_step(batch)
        self._call_hook("on_train_batch_end", outputs, batch)
        self.truth.step(batch, t0, time.time_ns())

    def _run_validation(self):
        for b in range(12):
            self.module.validation_step(b)

    def run(self, steps):
        for batch in range(1, steps + 1):
            self.advance(batch)
            if batch % 30 == 0:
                self._run_validation()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True)
    p.add_argument("--truth")
    p.add_argument("--steps", type=int, default=900)
    a = p.parse_args()
    truth = xtruth.Truth(a.truth, "lightning_hooks")
    module = Module(a.lib)
    FitLoop(module, [SlowStorageCallback(), MetricsCallback()], truth).run(a.steps)
    truth.close()


if __name__ == "__main__":
    main()
