#!/usr/bin/env python3
"""Two-rank DDP with one rank made slow, so the other waits in NCCL.

Start one process per rank (so that each rank can have its own gaptrace sidecar):
  ddp.py --rank 0 --world 2 --port 29533 --truth t0.jsonl &
  ddp.py --rank 1 --world 2 --port 29533 --truth t1.jsonl --slow-ms 60
The slow rank spends --slow-ms of host time before its backward pass every step; the fast rank's
gradient all-reduce then waits for it. Truth (CLOCK_MONOTONIC ns, shared by both processes on one
host): every slow interval is written as {"type":"stall","cause":"comm","rank":1,...} in the slow
rank's file; the fast rank's file has its steps. NCCL multicast stays off (see GPU-MACHINE.md).
"""
import argparse
import json
import os
import threading
import time

for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[k] = v

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

MONO = time.monotonic_ns


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--slow-ms", type=float, default=0)
    ap.add_argument("--truth")
    a = ap.parse_args()

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank, world_size=a.world)
    torch.cuda.set_device(a.rank)
    dev = torch.device("cuda", a.rank)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)]).to(dev)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[a.rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(64, 2048, device=dev)
    truth = [{"type": "meta", "clock": "monotonic", "realtime_minus_monotonic_ns": time.time_ns() - MONO(),
              "pid": os.getpid(), "device": a.rank, "rank": a.rank, "slow_ms": a.slow_ms}]
    tid = threading.get_native_id()
    t_measure = None
    for step in range(1, a.warmup + a.steps + 1):
        if step == a.warmup + 1:
            torch.cuda.synchronize()
            dist.barrier()
            t_measure = time.perf_counter()
        n = step - a.warmup
        s0 = MONO()
        out = ddp(x)
        loss = out.square().mean()
        if a.slow_ms and n > 0:
            t0 = MONO()
            deadline = t0 + int(a.slow_ms * 1e6)
            while MONO() < deadline:
                pass
            truth.append({"type": "stall", "step": n, "cause": "comm", "rank": a.rank, "start": t0,
                          "end": MONO(), "tid": tid})
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        if n > 0:
            truth.append({"type": "step", "step": n, "start": s0, "end": MONO()})
    torch.cuda.synchronize()
    el = time.perf_counter() - t_measure
    print(f"ddp rank {a.rank}: {a.steps} steps in {el:.2f}s ({a.steps / el:.2f} steps/s)", flush=True)
    if a.truth:
        with open(a.truth, "w") as f:
            for r in truth:
                f.write(json.dumps(r) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
