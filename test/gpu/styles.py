#!/usr/bin/env python3
"""Training loops written the way other people write them, for checking gaptrace's steps and causes.

trainer.py is one loop with stalls injected into it. The loops here are shaped differently, each the
way a common kind of job is written, so that what gaptrace learned from trainer.py is tested on loops
it was not built against:

  amp-cnn      a small convolutional net with BatchNorm in channels_last, float16 autocast with a
               GradScaler (its step reads found_inf: a sync inside the optimizer step), a map-style
               DataLoader with 4 workers and no pinned memory (every batch a pageable .to(device)),
               the loss read only every 10th step, and a checkpoint of the model and optimizer
               (torch.save to a temporary file, fsync, os.replace) every CKPT steps
  accum        gradient accumulation: 4 micro-batches a step, each a pinned non_blocking copy of a
               dict of tensors (input ids, mask, labels) from a DataLoader with 2 workers, bfloat16
               autocast, clip_grad_norm_, fused AdamW, an LR scheduler, loss.item() once a step; a
               background thread posts metrics to a local HTTP server every 5 steps (wandb-like,
               off the feeding thread)
  logevery     a language model fed by a DataLoader with 2 workers and pinned memory, a batch copied
               non_blocking every iteration, clip_grad_norm_ and fused AdamW every iteration, and the
               loss read only every 10th iteration (the usual way to keep syncs out of the loop), after
               waiting on a CUDA event that times those ten iterations; one iteration per copy
  synthetic    the benchmark loop: a fixed input already on the device, no host copies at all,
               forward/backward/step, and print(loss.item()) only every 10th step
  evalloop     a language model trained with loss.item() every iteration (a running mean) and
               evaluated every 15th iteration: model.eval(), 6 validation batches of the training
               batches' shape under torch.no_grad() from a second DataLoader, accuracy summed on the
               device and read once, model.train(); the evaluation belongs to the iteration it ends

Every style writes trainer.py's truth format (CLOCK_MONOTONIC ns): a meta record, one step record
per measured loop iteration (the meta record's "warmup" says how many ran before them: gaptrace
counts those too), and a stall record for every checkpoint (cause "checkpoint": the whole save is the stall,
expected io.write). --profile records the measured steps with the PyTorch profiler (CUDA activity)
for evaluate.py.

Usage: styles.py --style amp-cnn|accum|logevery|synthetic|evalloop --steps N [--warmup W] [--truth FILE] [--profile FILE]
"""
import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time

import torch
import torch.nn as nn

from trainer import start_log_server  # the slow logging service, in a child process

MONO = time.monotonic_ns


class Images(torch.utils.data.Dataset):
    """Random images and labels, made on the CPU by the workers (as decoding would)."""

    def __init__(self, n, shape):
        self.n, self.shape = n, shape

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.rand(self.shape, generator=g), int(torch.randint(0, 10, (1,), generator=g))


class Tokens(torch.utils.data.Dataset):
    """Tokenized text as a dict per sample, collated into a dict of batched tensors."""

    def __init__(self, n, seq, vocab):
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, self.vocab, (self.seq,), generator=g)
        keep = int(torch.randint(self.seq // 2, self.seq + 1, (1,), generator=g))
        mask = torch.zeros(self.seq, dtype=torch.long)
        mask[:keep] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.clone()}


def cnn():
    def block(cin, cout, stride):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))
    return nn.Sequential(block(3, 32, 1), block(32, 64, 2), block(64, 64, 1), block(64, 128, 2), block(128, 128, 1),
                         block(128, 256, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10))


class LM(nn.Module):
    def __init__(self, vocab, d, layers):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 8, 4 * d, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids, mask):
        return self.head(self.enc(self.emb(ids), src_key_padding_mask=mask == 0))


def token_loader(n, seq, vocab, **kw):
    """A DataLoader of n token samples, 8 a batch, from 2 workers into pinned memory."""
    return torch.utils.data.DataLoader(Tokens(n, seq, vocab), batch_size=8, num_workers=2, pin_memory=True,
                                       drop_last=True, **kw)


def lm_loss(model, lossf, batch, dev, vocab):
    """Copies a token batch to the device (non_blocking) and returns the LM's loss on it under bf16 autocast."""
    b = {k: v.to(dev, non_blocking=True) for k, v in batch.items()}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(b["input_ids"], b["attention_mask"])
        return lossf(logits.view(-1, vocab).float(), b["labels"].view(-1))


class Logger(threading.Thread):
    """Posts queued metrics from a thread of its own, as wandb's does."""

    def __init__(self, port):
        super().__init__(name="metrics-logger", daemon=True)
        self.port, self.items, self.cv = port, [], threading.Condition()

    def log(self, d):
        with self.cv:
            self.items.append(d)
            self.cv.notify()

    def run(self):
        while True:
            with self.cv:
                while not self.items:
                    self.cv.wait()
                d = self.items.pop(0)
            body = json.dumps(d).encode()
            try:
                s = socket.create_connection(("127.0.0.1", self.port))
                s.sendall(b"POST /log/20 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                while s.recv(4096):
                    pass
                s.close()
            except OSError:
                pass


def save_checkpoint(model, opt, path):
    """Saves to a temporary file, fsyncs, renames it over path; returns when each part ended."""
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".ckpt-")
    with os.fdopen(fd, "wb") as f:
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, f)
        f.flush()
        saved = MONO()
        os.fsync(f.fileno())
        synced = MONO()
    closed = MONO()
    os.replace(tmp, path)
    return {"saved": saved, "synced": synced, "closed": closed, "replaced": MONO()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--style", required=True, choices=["amp-cnn", "accum", "logevery", "synthetic", "evalloop"])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--truth")
    ap.add_argument("--profile")
    ap.add_argument("--ckpt-every", type=int, default=25)
    ap.add_argument("--data-dir", default=tempfile.gettempdir())
    a = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    total = a.warmup + a.steps
    truth = [{"type": "meta", "clock": "monotonic", "realtime_minus_monotonic_ns": time.time_ns() - MONO(),
              "pid": os.getpid(), "device": 0, "rank": 0, "style": a.style, "warmup": a.warmup}]
    tid = threading.get_native_id()
    prof = None
    if a.profile:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    logsrv = None
    t_measure = None

    def step_done(i, s0):
        if i >= a.warmup:
            truth.append({"type": "step", "step": i - a.warmup + 1, "start": s0, "end": MONO()})

    def begin(i):
        nonlocal t_measure
        if i == a.warmup:
            torch.cuda.synchronize()
            if prof:
                prof.start()
            t_measure = time.perf_counter()

    if a.style == "amp-cnn":
        model = cnn().to(dev).to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        scaler = torch.amp.GradScaler("cuda")
        loader = torch.utils.data.DataLoader(Images(total * 32, (3, 64, 64)), batch_size=32, shuffle=True,
                                             num_workers=4, persistent_workers=True, drop_last=True)
        ckpt = os.path.join(a.data_dir, "styles-amp-cnn.pt")
        lossf = nn.CrossEntropyLoss()
        it = iter(loader)
        for i in range(total):
            begin(i)
            s0 = MONO()
            x, y = next(it)
            x = x.to(dev).to(memory_format=torch.channels_last)
            y = y.to(dev)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = lossf(model(x), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            if i % 10 == 0:
                print(f"step {i} loss {loss.item():.4f}", flush=True)
            if a.ckpt_every and i >= a.warmup and (i + 1) % a.ckpt_every == 0:
                c0 = MONO()
                parts = save_checkpoint(model, opt, ckpt)
                truth.append({"type": "stall", "step": i - a.warmup + 1, "cause": "checkpoint", "start": c0,
                              "end": MONO(), "tid": tid, "parts": parts})
            step_done(i, s0)
    elif a.style == "accum":
        vocab, seq, micro = 2000, 128, 4
        model = LM(vocab, 384, 3).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
        loader = token_loader(total * micro * 8, seq, vocab)
        logsrv, port = start_log_server()  # answers each post 20 ms late
        logger = Logger(port)
        logger.start()
        lossf = nn.CrossEntropyLoss()
        it = iter(loader)
        for i in range(total):
            begin(i)
            s0 = MONO()
            for _ in range(micro):
                loss = lm_loss(model, lossf, next(it), dev, vocab) / micro
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            lv = loss.item() * micro
            if i % 5 == 0:
                logger.log({"step": i, "loss": lv, "lr": sched.get_last_lr()[0]})
            step_done(i, s0)
    elif a.style == "logevery":
        vocab, seq = 2000, 128
        model = LM(vocab, 384, 3).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
        loader = token_loader(total * 8, seq, vocab)
        lossf = nn.CrossEntropyLoss()
        ev_start, ev_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ev_start.record()
        it = iter(loader)
        for i in range(total):
            begin(i)
            s0 = MONO()
            loss = lm_loss(model, lossf, next(it), dev, vocab)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i % 10 == 9:
                # Timed with CUDA events, as many loops log their step time:
                # the host waits on the event (cuEventSynchronize), then reads
                # the loss the event already covers.
                ev_end.record()
                ev_end.synchronize()
                print(f"step {i} loss {loss.item():.4f} {ev_start.elapsed_time(ev_end) / 10:.1f} ms/step", flush=True)
            if i % 10 == 0:
                ev_start.record()
            step_done(i, s0)
    elif a.style == "evalloop":
        vocab, seq, every, nval = 2000, 128, 15, 6
        model = LM(vocab, 384, 3).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        loader = token_loader(total * 8, seq, vocab)
        val = token_loader(nval * 8, seq, vocab, persistent_workers=True)
        lossf = nn.CrossEntropyLoss()
        running = 0.0
        it = iter(loader)
        for i in range(total):
            begin(i)
            s0 = MONO()
            loss = lm_loss(model, lossf, next(it), dev, vocab)
            opt.zero_grad()
            loss.backward()
            opt.step()
            running = 0.9 * running + 0.1 * loss.item()
            if (i + 1) % every == 0:
                model.eval()
                correct = torch.zeros((), device=dev, dtype=torch.long)
                with torch.no_grad():
                    for vb in val:
                        vb = {k: v.to(dev, non_blocking=True) for k, v in vb.items()}
                        with torch.autocast("cuda", dtype=torch.bfloat16):
                            pred = model(vb["input_ids"], vb["attention_mask"]).argmax(-1)
                        correct += (pred == vb["labels"]).sum()
                print(f"step {i} loss {running:.4f} val acc {correct.item() / (nval * 8 * seq):.4f}", flush=True)
                model.train()
            step_done(i, s0)
    else:
        model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(),
                              nn.Linear(4096, 1024)).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        x = torch.randn(64, 1024, device=dev)
        target = torch.randn(64, 1024, device=dev)
        for i in range(total):
            begin(i)
            s0 = MONO()
            loss = nn.functional.mse_loss(model(x), target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if i % 10 == 0:
                print(f"step {i} loss {loss.item():.4f}", flush=True)
            step_done(i, s0)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t_measure
    if prof:
        prof.stop()
        prof.export_chrome_trace(a.profile)
    print(f"styles: {a.style}: {a.steps} steps in {elapsed:.2f}s ({total} iterations with the warm-up)", flush=True)
    if a.truth:
        with open(a.truth, "w") as f:
            for r in truth:
                f.write(json.dumps(r) + "\n")
    if logsrv:
        os.kill(logsrv, 9)
        os.waitpid(logsrv, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
