#!/usr/bin/env python3
"""sync_logger: a loop that logs its experiment synchronously.

Eight kernels on a non-blocking stream, an event recorded after them and
synchronized per step. Every 12th step, in turn:
  - post_metrics: an HTTP POST (http.client) of the step's metrics to a
    tracking server in a child process that answers after 40-80 ms.
    Expected label net (the loop waits on the socket).
  - run_shell_hook: os.system("sleep 0.05"), a shell hook the loop waits
    for. Expected label subprocess.
  - log_step: logging.info of 64 tables of 4 KiB through a StreamHandler
    on a pipe read by a slow log collector (a child reading 8 KiB every
    2 ms): the handler's write blocks. Expected label io.write.
  - tokenize: 50 ms of pure Python two calls below the loop
    (prepare_batch -> encode_texts -> tokenize) while a QueueListener
    thread writes earlier records into a second slow pipe: the loop only
    computes; the listener's blocked writes are not the loop's gap.
    Expected label cpu, named by the loop's CPU samples.
  - write_summary: json.dumps of a large nested dict (about 40 ms).
    Expected label cpu; the sampled code is json's encoder called from
    write_summary.
"""

import argparse
import ctypes
import http.client
import json
import logging
import logging.handlers
import os
import queue
import random
import subprocess
import sys
import time

import simcu
import xtruth

SERVER = r"""
import http.server, random, sys, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        self.rfile.read(n)
        time.sleep(random.uniform(0.04, 0.08))
        body = b'{"ok":true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
sys.stdout.write("%d\n" % s.server_address[1])
sys.stdout.flush()
s.serve_forever()
"""

COLLECTOR = r"""
import os, sys, time
fd = sys.stdin.fileno()
while True:
    b = os.read(fd, 8192)
    if not b:
        break
    time.sleep(0.002)
"""

EVERY = 12


def tokenize(texts, ms):
    deadline = time.perf_counter() + ms / 1000.0
    ids = []
    while time.perf_counter() < deadline:
        for t in texts:
            ids.append(sum(ord(c) * 31 for c in t) % 50257)
    return ids


def encode_texts(texts, ms):
    return tokenize([t.lower() for t in texts], ms)


def prepare_batch(texts, ms):
    return encode_texts(texts, ms)


def slow_pipe():
    p = subprocess.Popen([sys.executable, "-c", COLLECTOR], stdin=subprocess.PIPE)
    return p, p.stdin


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True)
    p.add_argument("--truth")
    p.add_argument("--steps", type=int, default=420)
    a = p.parse_args()
    truth = xtruth.Truth(a.truth, "sync_logger")
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE)
    port = int(server.stdout.readline())
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)

    fg_proc, fg_pipe = slow_pipe()
    fg = logging.getLogger("train")
    fg.propagate = False
    fg.setLevel(logging.INFO)
    fg.addHandler(logging.StreamHandler(open(fg_pipe.fileno(), "w", closefd=False)))
    bg_proc, bg_pipe = slow_pipe()
    bgq = queue.Queue()
    listener = logging.handlers.QueueListener(
        bgq, logging.StreamHandler(open(bg_pipe.fileno(), "w", closefd=False)))
    listener.start()
    bg = logging.getLogger("train.async")
    bg.propagate = False
    bg.setLevel(logging.INFO)
    bg.addHandler(logging.handlers.QueueHandler(bgq))

    record = "loss=%.4f lr=%.6f " + "m" * 100
    bulk = "m" * 8000
    table = "loss=%.4f lr=%.6f\n" + "\n".join("layer.%03d grad_norm=0.000 w_norm=0.000" % i
                                                for i in range(100))
    summary = {"run": {"layer%d" % i: {"w": [random.random() for _ in range(40)],
                                       "name": "block.%d.attn" % i, "i": i}
                       for i in range(1000)}}
    texts = ["the quick brown fox %d jumps" % i for i in range(64)]

    def post_metrics(step):
        body = json.dumps({"step": step, "loss": 1.0 / step}).encode()
        with xtruth.timed_stall(truth, "net", "post_metrics", peer="127.0.0.1:%d" % port):
            conn.request("POST", "/log", body, {"Content-Type": "application/json"})
            conn.getresponse().read()

    def run_shell_hook():
        with xtruth.timed_stall(truth, "subprocess", "run_shell_hook", child="sleep 0.05"):
            os.system("sleep 0.05")

    def log_step(step):
        with xtruth.timed_stall(truth, "io.write", "log_step", reader=fg_proc.pid):
            for i in range(64):
                fg.info(table, 1.0 / step, 1e-4)
            fg.handlers[0].flush()

    def tokenize_step():
        for i in range(256):  # the listener writes these while the loop computes
            bg.info("%s", bulk)
        with xtruth.timed_stall(truth, "cpu", "tokenize"):
            prepare_batch(texts, 50)

    def write_summary():
        with xtruth.timed_stall(truth, "cpu", "write_summary|dumps|encode|iterencode"):
            return len(json.dumps(summary, indent=1))

    cu, _ctx, mod, _img = simcu.open_device(a.lib)
    fns = [simcu.kernel(cu, mod, 1000) for _ in range(8)]
    stream = simcu.new_stream(cu)
    ev = ctypes.c_void_p()
    simcu.ok(cu.cuEventCreate(ctypes.byref(ev), 0), "cuEventCreate")
    hooks = (lambda s: post_metrics(s), lambda s: run_shell_hook(), lambda s: log_step(s),
             lambda s: tokenize_step(), lambda s: write_summary())
    try:
        for step in range(1, a.steps + 1):
            if step % EVERY == 0:
                hooks[(step // EVERY) % len(hooks)](step)
            t0 = time.time_ns()
            for f in fns:
                simcu.launch(cu, f, stream)
            simcu.ok(cu.cuEventRecord(ev, stream), "cuEventRecord")
            simcu.ok(cu.cuEventSynchronize(ev), "cuEventSynchronize")
            truth.step(step, t0, time.time_ns())
    finally:
        listener.stop()
        for proc, pipe in ((fg_proc, fg_pipe), (bg_proc, bg_pipe)):
            pipe.close()
            proc.wait()
        conn.close()
        server.kill()
        server.wait()
    truth.close()


if __name__ == "__main__":
    main()
