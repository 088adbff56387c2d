#!/usr/bin/env python3
"""A PyTorch trainer with injected stalls of known cause, for validating gaptrace on a real GPU.

Each step trains a small transformer (forward, backward, AdamW) and ends with loss.item(), a
device-to-host copy plus a stream sync. Before every E-th step a stall of a known cause runs on the
main (feeding) thread; its exact interval is written to --truth as JSON Lines in CLOCK_MONOTONIC ns,
the same format as simtrain's truth file:

  {"type":"meta","clock":"monotonic","realtime_minus_monotonic_ns":N,"pid":P,...}
  {"type":"step","step":n,"start":ns,"end":ns}
  {"type":"stall","step":n,"cause":"io.read","start":ns,"end":ns,"tid":T}

Stall causes:
  io.read      read a dataset file with its page cache dropped (posix_fadvise DONTNEED)
  loader.wait  the next batch comes from a DataLoader worker that is slow this time (it reads a
               file with the page cache dropped): the main thread blocks on the worker queue
  net          synchronous HTTP POST to a local slow logging server (a child process)
  io.write     torch.save of a checkpoint followed by fsync
  cpu          CPU-bound host work in Python
  launch       a launch-bound phase of many tiny kernels (micro-gaps, no single big gap)
  checkpoint   torch.save of the model's CUDA state_dict straight to a file, then fsync: each
               tensor is copied device to host with a sync, pickled, written (one episode, io.write)
  lock         a background Python thread holds the GIL computing; the main thread waits for it
  pageable     tensor.to('cuda') of a pageable (not pinned) host tensor of MB megabytes: the
               "async" copy blocks the host while the driver stages it (cuda.memcpy)

--pin-memory, --loader-workers N, --item-reads K and --graph shape the loop the way real jobs do
(pinned non_blocking copies from a DataLoader, extra .item() syncs, a CUDA-graph replay); steps are
still one iteration of the loop each.

Usage: trainer.py --steps N [--stall CAUSE:every=E:ms=M]... [--truth FILE] [--profile FILE]
                  [--warmup W] [--result FILE] [--preset NAME]
--preset loader-cost is the job the cost harnesses time (2 pinned DataLoader workers, loader and read
stalls); its flags come first, so the command line's own override them.
--profile records a PyTorch profiler (Kineto/CUPTI) trace of the measured steps for the ground
truth of GPU idle time. --result writes {"steps_per_s":..} over the measured steps.

--serve LOG runs until --ctl FILE says "stop" (read every 25 steps, acknowledged by writing the word
to FILE.ack) and appends one line per measured iteration to LOG, as launchjob.py --serve does:
"end_ns wall_ns cpu_ns 0" (end: CLOCK_MONOTONIC; wall: from the previous iteration's end, so the
wait for the loader and every stall are in it; cpu: this process's CPU time over it, every thread
but not the loader workers'). overhead_attach.py --job loader drives it.
"""
import argparse
import http.server
import io
import json
import os
import socket
import sys
import tempfile
import threading
import time

import torch
import torch.nn as nn

MONO = time.monotonic_ns


def parse_stall(s):
    cause, _, rest = s.partition(":")
    kv = dict(p.split("=", 1) for p in rest.split(":") if p)
    return cause, int(kv.get("every", 10)), float(kv.get("ms", 40))


class SlowLogHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(n)
        ms = float(self.path.strip("/").split("/")[-1] or 0)
        time.sleep(ms / 1000.0)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *a):
        pass


def start_log_server():
    """A slow logging service in a child process, like a wandb/HTTP logger on the other end."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        srv = http.server.HTTPServer(("127.0.0.1", 0), SlowLogHandler)
        os.write(w, str(srv.server_address[1]).encode())
        os.close(w)
        srv.serve_forever()
        os._exit(0)
    os.close(w)
    port = int(os.read(r, 16))
    os.close(r)
    return pid, port


def http_post(port, ms):
    body = json.dumps({"loss": 1.0}).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /log/%g HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (ms, len(body)) + body)
    buf = b""
    while b"\r\n\r\n" not in buf or not buf.endswith(b"ok"):
        chunk = s.recv(4096)
        if not chunk:
            break
        buf += chunk
    s.close()


def make_file(path, size):
    if os.path.exists(path) and os.path.getsize(path) >= size:
        return
    with open(path, "wb") as f:
        block = os.urandom(1 << 20)
        for _ in range(size >> 20):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())


def read_cold(path, ms):
    """Blocking reads of a file whose page cache is dropped, until ms elapsed."""
    deadline = MONO() + int(ms * 1e6)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        off = 0
        while MONO() < deadline:
            if off == 0:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.pread(fd, 1 << 20, off)
            off = (off + (1 << 20)) % size
    finally:
        os.close(fd)


class SlowDataset(torch.utils.data.IterableDataset):
    """Yields batches; some are slow because the worker reads cold data first."""

    def __init__(self, n, every, ms, path, shape):
        self.n, self.every, self.ms, self.path, self.shape = n, every, ms, path, shape

    def __iter__(self):
        for i in range(1, self.n + 1):
            if self.every and i % self.every == 0:
                read_cold(self.path, self.ms)
            yield torch.randint(0, 1000, self.shape)


def served_step(log, ctl, n, prev):
    """Logs the iteration that just ended (--serve); returns its (end, CPU) for the next one and
    whether --ctl says stop."""
    end, cpu = MONO(), time.process_time_ns()
    if n > 0 and prev is not None:
        log.write(f"{end} {end - prev[0]} {cpu - prev[1]} 0\n")
    now = (end, cpu)
    if n % 25:
        return now, False
    log.flush()  # about once a second: the driver reads the steps while the job runs
    try:
        with open(ctl) as f:
            want = f.read().strip()
    except FileNotFoundError:
        return now, False
    if want != "stop":
        return now, False
    with open(ctl + ".ack.tmp", "w") as f:
        f.write(want)
    os.replace(ctl + ".ack.tmp", ctl + ".ack")
    return now, True


# Named jobs, so that every harness that times one runs the same flags. loader-cost: fed by 2
# pinned DataLoader workers, with loader and read stalls (cost.sh, overhead_attach.py --job loader).
PRESETS = {
    "loader-cost": ["--warmup", "20", "--loader-workers", "2", "--pin-memory",
                    "--stall", "loader.wait:every=10:ms=40", "--stall", "io.read:every=15:ms=20"],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=sorted(PRESETS), help="a named job's flags; flags given after it win")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--stall", action="append", default=[])
    ap.add_argument("--truth")
    ap.add_argument("--profile")
    ap.add_argument("--profile-activities", default="cuda", help="cuda or cpu,cuda")
    ap.add_argument("--result")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--dmodel", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--data-dir", default=tempfile.gettempdir())
    ap.add_argument("--pin-memory", action="store_true", help="DataLoader pin_memory=True (a pin-memory thread)")
    ap.add_argument("--loader-workers", type=int, default=0)
    ap.add_argument("--item-reads", type=int, default=0, help="extra .item() reads per step (varying 0..K)")
    ap.add_argument("--graph", action="store_true", help="replay the forward/backward as a CUDA graph")
    ap.add_argument("--pageable-mb", type=int, default=256)
    ap.add_argument("--serve", metavar="LOG")
    ap.add_argument("--ctl", metavar="FILE")
    args = ap.parse_args()
    if args.preset:
        # The preset's flags first: the command line's own come after and override them (--stall adds).
        args = ap.parse_args(PRESETS[args.preset] + sys.argv[1:])
    if args.serve and not args.ctl:
        ap.error("--serve needs --ctl")

    stalls = [parse_stall(s) for s in args.stall]
    known = {"io.read", "loader.wait", "net", "io.write", "cpu", "launch", "checkpoint", "lock", "pageable"}
    for c, _, _ in stalls:
        if c not in known:
            sys.exit(f"trainer: unknown stall cause {c!r} (known: {', '.join(sorted(known))})")

    torch.manual_seed(0)
    dev = torch.device("cuda")
    vocab = 1000
    layer = nn.TransformerEncoderLayer(args.dmodel, 8, 4 * args.dmodel, batch_first=True)
    model = nn.Sequential(nn.Embedding(vocab, args.dmodel), nn.TransformerEncoder(layer, args.layers),
                          nn.Linear(args.dmodel, vocab)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lossf = nn.CrossEntropyLoss()

    data = os.path.join(args.data_dir, "gaptrace-dataset.bin")
    make_file(data, 256 << 20)
    ckpt = os.path.join(args.data_dir, "gaptrace-ckpt.pt")
    logsrv, port = (None, None)
    if any(c == "net" for c, _, _ in stalls):
        logsrv, port = start_log_server()

    total = args.warmup + (10**9 if args.serve else args.steps)
    serve = open(args.serve, "a", buffering=1 << 16) if args.serve else None
    served = None  # (monotonic ns, process CPU ns) at the last iteration's end
    loader_stall = [(e, m) for c, e, m in stalls if c == "loader.wait"]
    le, lm = loader_stall[0] if loader_stall else (0, 0)
    ds = SlowDataset(total + 1, le, lm, data, (args.batch, args.seq))
    workers = max(args.loader_workers, 1 if le else 0)
    loader = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                              prefetch_factor=1 if workers else None, pin_memory=args.pin_memory))
    pageable = torch.empty(args.pageable_mb << 20, dtype=torch.uint8) if any(c == "pageable" for c, _, _ in stalls) else None
    if pageable is not None:
        pageable.fill_(1)  # touch every page: the stall is the copy, not page faults

    graph = None
    if args.graph:
        # Capture forward+backward on a static batch; optimizer steps stay eager.
        static_x = torch.randint(0, vocab, (args.batch, args.seq), device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                lossf(model(static_x).view(-1, vocab), static_x.view(-1)).backward()
        torch.cuda.current_stream().wait_stream(s)
        opt.zero_grad(set_to_none=False)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_loss = lossf(model(static_x).view(-1, vocab), static_x.view(-1))
            static_loss.backward()

    truth = []

    def note(rec):
        # A served job runs until told to stop and never writes its truth: keep nothing.
        if serve is None:
            truth.append(rec)

    off = time.time_ns() - MONO()
    note({"type": "meta", "clock": "monotonic", "realtime_minus_monotonic_ns": off, "pid": os.getpid(),
                  "device": 0, "rank": 0, "stalls": args.stall, "warmup": args.warmup})
    tid = threading.get_native_id()
    tiny = torch.ones(64, device=dev)

    prof = None
    if args.profile:
        # CUDA activity only by default: the GPU timeline is the truth we need, and host-side op
        # recording would slow the very loop being measured. The overhead harness asks for both, as
        # an always-on profiler would run.
        acts = {"cpu": torch.profiler.ProfilerActivity.CPU, "cuda": torch.profiler.ProfilerActivity.CUDA}
        prof = torch.profiler.profile(activities=[acts[x] for x in args.profile_activities.split(",")])
    t_measure = None
    for step in range(1, total + 1):
        if step == args.warmup + 1:
            torch.cuda.synchronize()
            if prof:
                prof.start()
            t_measure = time.perf_counter()
        n = step - args.warmup  # measured step number (<= 0 during warm-up)
        for cause, every, ms in stalls:
            if n <= 0 or n % every != 0:
                continue
            if cause == "lock":
                # The background thread keeps the GIL for the whole stall: with a switch interval
                # longer than the stall the interpreter never asks it to let go.
                ready = threading.Event()

                def hog(ms=ms):
                    sys.setswitchinterval(max(0.005, 2 * ms / 1000))
                    ready.set()
                    end = MONO() + int(ms * 1e6)
                    x = 0
                    while MONO() < end:
                        x += 1
                hogger = threading.Thread(target=hog, name="bg-metrics")
                t0 = MONO()
                hogger.start()
                ready.wait()
                time.sleep(0)  # releases the GIL; getting it back waits for the hog
                t1 = MONO()
                hogger.join()
                sys.setswitchinterval(0.005)
                note({"type": "stall", "step": n, "cause": "lock", "start": t0, "end": t1, "tid": tid})
                continue
            if cause == "io.write":
                buf = io.BytesIO()
                torch.save({k: v.detach().cpu() for k, v in list(model.state_dict().items())[:8]}, buf)
                ckpt_bytes = buf.getvalue()
            t0 = MONO()
            if cause == "io.read":
                read_cold(data, ms)
            elif cause == "net":
                http_post(port, ms)
            elif cause == "io.write":
                # checkpoint bytes serialized before the stall's clock started (pickling is CPU
                # work, not I/O); the stall itself is writing and fsyncing them
                deadline = t0 + int(ms * 1e6)
                while MONO() < deadline:
                    with open(ckpt, "wb") as f:
                        f.write(ckpt_bytes)
                        f.flush()
                        os.fsync(f.fileno())
            elif cause == "cpu":
                deadline = t0 + int(ms * 1e6)
                x = 0
                while MONO() < deadline:
                    x += 1
            elif cause == "launch":
                deadline = t0 + int(ms * 1e6)
                while MONO() < deadline:
                    tiny.add_(1.0)
                torch.cuda.synchronize()
            elif cause == "checkpoint":
                # torch.save of CUDA tensors: per tensor a device-to-host copy and a sync, pickling,
                # writes; then fsync. The whole episode is the stall.
                with open(ckpt, "wb") as f:
                    torch.save(model.state_dict(), f)
                    f.flush()
                    os.fsync(f.fileno())
            elif cause == "pageable":
                pageable.to(dev, non_blocking=True)
                torch.cuda.current_stream().synchronize()
            elif cause == "loader.wait":
                continue  # happens inside next(loader), recorded below
            rec = {"type": "stall", "step": n, "cause": cause, "start": t0, "end": MONO(), "tid": tid}
            if cause == "pageable":
                # what gaptrace's copy evidence should say
                rec.update(bytes=pageable.numel() * pageable.element_size(), direction="htod")
            note(rec)
        t0 = MONO()
        batch = next(loader)
        t1 = MONO()
        if le and n > 0 and t1 - t0 > lm * 1e6 / 4:
            # the worker was still reading cold data for this batch (an ordinary next() costs
            # ~1 ms of unpickling on this thread: that is CPU work, not a wait)
            note({"type": "stall", "step": n, "cause": "loader.wait", "start": t0, "end": t1, "tid": tid})
        s0 = MONO()
        x = batch.to(dev, non_blocking=True)
        if graph is not None:
            static_x.copy_(x)
            opt.zero_grad(set_to_none=False)
            graph.replay()
            loss = static_loss
        else:
            out = model(x)
            loss = lossf(out.view(-1, vocab), x.view(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
        opt.step()
        for _ in range(step % (args.item_reads + 1)):
            x[0, 0].item()  # a scalar read: one more sync inside the step
        loss.item()
        if serve is not None:
            served, stop = served_step(serve, args.ctl, n, served)
            if stop:
                break
            continue
        if n > 0:
            note({"type": "step", "step": n, "start": s0, "end": MONO()})
    torch.cuda.synchronize()
    if serve is not None:
        serve.close()
        if logsrv:
            os.kill(logsrv, 9)
            os.waitpid(logsrv, 0)
        return
    elapsed = time.perf_counter() - t_measure
    if prof:
        prof.stop()
        prof.export_chrome_trace(args.profile)
    sps = args.steps / elapsed
    print(f"trainer: {args.steps} steps in {elapsed:.2f}s, {sps:.2f} steps/s", flush=True)
    if args.result:
        with open(args.result, "w") as f:
            json.dump({"steps_per_s": sps, "steps": args.steps, "elapsed_s": elapsed}, f)
    if args.truth:
        with open(args.truth, "w") as f:
            for r in truth:
                f.write(json.dumps(r) + "\n")
    if logsrv:
        os.kill(logsrv, 9)
        os.waitpid(logsrv, 0)


if __name__ == "__main__":
    main()
