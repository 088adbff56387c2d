#!/usr/bin/env python3
"""hang_job - two PyTorch processes on one GPU whose second rank stops.

Rank 0 and rank 1 share GPU 0 (NCCL refuses two ranks on one device in
some versions: --backend gloo then all-reduces the CUDA tensors through the
host). Each step is a few matmuls and one all-reduce. At step --stop-at,
rank 1 does what --mode says:

  stop  SIGSTOPs itself (the launcher, hang.sh, sends SIGCONT later)
  exit  exits with status 3
  sleep blocks --sleep-s seconds in a read of a pipe nobody writes to
        (a data loader that never answers), then goes on

Rank 0 meanwhile waits in its all-reduce (the collective, or the sync that
follows it). Each rank writes JSON lines to --truth-dir/rank{R}.jsonl: meta
(pid, rank, backend) and, on rank 1, the moment it stops/exits/blocks.
"""

import argparse
import datetime
import json
import os
import signal
import sys
import time


def log(f, rec):
    rec["unix_nano"] = time.time_ns()
    f.write(json.dumps(rec) + "\n")
    f.flush()


def worker(rank, a):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port), RANK=str(rank), WORLD_SIZE="2")
    torch.cuda.set_device(0)
    dist.init_process_group(a.backend, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=a.timeout_s))
    out = open(os.path.join(a.truth_dir, "rank%d.jsonl" % rank), "w", encoding="utf-8")
    log(out, {"type": "meta", "pid": os.getpid(), "rank": rank, "backend": a.backend})
    x = torch.randn(2048, 2048, device="cuda")
    g = torch.zeros(8 << 20, device="cuda")
    for step in range(1, a.steps + 1):
        for _ in range(4):
            x = torch.tanh(x @ x) * 0.5
        if rank == 1 and step == a.stop_at:
            log(out, {"type": a.mode, "step": step})
            if a.mode == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif a.mode == "exit":
                os._exit(3)
            else:
                import threading
                r, w = os.pipe()
                threading.Timer(a.sleep_s, os.write, args=(w, b"x")).start()  # the loader answers late
                os.read(r, 1)
        g += x[0, 0]
        dist.all_reduce(g)
        torch.cuda.synchronize()
        if step % 20 == 0:
            log(out, {"type": "step", "step": step})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    p.add_argument("--mode", choices=("stop", "exit", "sleep"), default="stop")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--stop-at", type=int, default=100)
    p.add_argument("--sleep-s", type=float, default=40)
    p.add_argument("--timeout-s", type=int, default=300, help="the process group's collective timeout")
    p.add_argument("--port", type=int, default=29531)
    p.add_argument("--truth-dir", default=".")
    a = p.parse_args()
    import torch.multiprocessing as mp
    ctx = mp.spawn(worker, args=(a,), nprocs=2, join=False)
    try:
        while not ctx.join():
            pass
    except Exception as e:  # a rank that exited fails the job, as torchrun would
        print("hang_job: %s" % e, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
