#!/usr/bin/env python3
"""steps_job - PyTorch training loops written the ways step counting finds hard.

  --job eager     a small MLP, a batch copied from pinned memory, loss.item() each iteration
  --job graph     the step captured in a CUDA graph, g.replay() and loss.item(); a background
                  thread copies the model's tensors to the host every 0.2 s (a checkpoint saver)
  --job compile   torch.compile'd model, loss.item() each iteration
  --job accum     4 micro-batches an iteration, loss.item() on each, one optimizer step
  --job eval      an evaluation of 20 batches (no grad, its own metric read) every 25 iterations
  --job logevery  the loss read every 10th iteration only
  --job ckpt      every 20th iteration, a checkpoint copying each tensor to the host (.cpu())
  --job hfaccum   shaped like Hugging Face's Trainer: 8 micro-batches an optimizer step, the loss
                  summed on the device, clip_grad_norm_ and opt.step() with no sync; the loss read
                  every 5th step, an evaluation of 15 batches (copied as the training's, each read)
                  every 40th: the host runs ahead of the device
  --job hfmanual  the same with a hand-written SGD update (no torch.optim: no optimizer-step
                  marker), so only the enqueued work can tell the optimizer steps

Runs --seconds of training (after a warm-up of 5 iterations that is not counted as a step by
the job either: its step records start after it), and writes --truth: a meta record (pid), one
step record per optimizer step (start_unix_nano, end_unix_nano) and a final record with the
count (type "done", steps).
"""
import argparse
import json
import os
import threading
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True,
                   choices=("eager", "graph", "compile", "accum", "eval", "logevery", "ckpt", "hfaccum", "hfmanual"))
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--truth", required=True)
    a = p.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1024)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    host_x = torch.randn(256, 1024).pin_memory()
    host_y = torch.randn(256, 1024).pin_memory()
    truth = open(a.truth, "w")
    truth.write(json.dumps({"type": "meta", "pid": os.getpid(), "job": a.job}) + "\n")
    truth.flush()
    fwd = torch.compile(model) if a.job == "compile" else model

    def train_step(x, y):
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(fwd(x), y)
        loss.backward()
        opt.step()
        return loss

    step_fn = None
    if a.job == "graph":
        sx, sy = host_x.to(dev), host_y.to(dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                train_step(sx, sy)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_loss = train_step(sx, sy)

        def step_fn():
            sx.copy_(host_x, non_blocking=True)
            sy.copy_(host_y, non_blocking=True)
            g.replay()
            return static_loss.item()

        stop = threading.Event()

        def saver():
            while not stop.wait(0.2):
                _ = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        threading.Thread(target=saver, daemon=True, name="saver").start()

    tr_loss = None
    n = 0
    warm = 5
    end = None
    i = 0
    while True:
        t0 = time.time_ns()
        if step_fn is not None:
            step_fn()
        elif a.job in ("hfaccum", "hfmanual"):
            if tr_loss is None:
                tr_loss = torch.zeros((), device=dev)
            for _ in range(8):
                x, y = host_x.to(dev, non_blocking=True), host_y.to(dev, non_blocking=True)
                loss = torch.nn.functional.mse_loss(model(x), y) / 8
                loss.backward()
                tr_loss += loss.detach()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if a.job == "hfaccum":
                opt.step()
                opt.zero_grad(set_to_none=False)
            else:
                with torch.no_grad():
                    for q in model.parameters():
                        q.add_(q.grad, alpha=-1e-3)
                        q.grad.zero_()
            if i % 5 == 4:
                tr_loss.item()
                tr_loss.zero_()
        elif a.job == "accum":
            opt.zero_grad()
            for _ in range(4):
                x, y = host_x.to(dev, non_blocking=True), host_y.to(dev, non_blocking=True)
                loss = torch.nn.functional.mse_loss(model(x), y) / 4
                loss.backward()
                loss.item()
            opt.step()
        else:
            x, y = host_x.to(dev, non_blocking=True), host_y.to(dev, non_blocking=True)
            loss = train_step(x, y)
            if a.job != "logevery" or i % 10 == 9:
                loss.item()
            if a.job == "eval" and i % 25 == 24:
                with torch.no_grad():
                    for _ in range(20):
                        ex = host_x.to(dev, non_blocking=True)
                        fwd(ex).abs().mean().item()
            if a.job == "ckpt" and i % 20 == 19:
                _ = [v.detach().cpu() for v in model.state_dict().values()]
        if a.job in ("hfaccum", "hfmanual") and i % 40 == 39:
            t_end = time.time_ns()  # the step ended; the evaluation is no step
            with torch.no_grad():
                for _ in range(15):
                    ex = host_x.to(dev, non_blocking=True)
                    fwd(ex).abs().mean().item()
        else:
            t_end = None
        i += 1
        if i <= warm:
            if i == warm:
                end = time.monotonic() + a.seconds
            continue
        truth.write(json.dumps({"type": "step", "step": n, "start_unix_nano": t0,
                                "end_unix_nano": t_end or time.time_ns()}) + "\n")
        n += 1
        if time.monotonic() >= end:
            break
    if a.job == "graph":
        stop.set()
    torch.cuda.synchronize()
    truth.write(json.dumps({"type": "done", "steps": n}) + "\n")
    truth.close()


if __name__ == "__main__":
    main()
