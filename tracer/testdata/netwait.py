"""Waits on sockets as Python code with timeouts does, for the tracer.

netwait.py HOST:PORT DELAY_MS: three waits of about DELAY_MS each on the
main thread, each reported on stdout as one JSON line before the next
starts ({"what", "pid", "tid", "fd"}):
  - "http": http.client.HTTPConnection(timeout=10) GETs /slow from the
    server, which answers after DELAY_MS: the socket has a timeout, so
    CPython waits in poll() on it and then reads without blocking;
  - "select": select.select() on a second connection's socket, while the
    server delays its answer;
  - "pipe": select.poll() on a pipe that a thread writes DELAY_MS later
    (a data-loader queue): no socket.
Then it waits for a line on stdin, so that the tracer reads the events
while the process and its sockets still exist, and exits.
"""
import http.client
import json
import os
import select
import socket
import sys
import threading
import time


def report(what, fd):
    print(json.dumps({"what": what, "pid": os.getpid(), "tid": threading.get_native_id(), "fd": fd}), flush=True)


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    delay = int(sys.argv[2])

    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/slow?ms=%d" % delay)
    fd = conn.sock.fileno()
    resp = conn.getresponse()
    resp.read()
    report("http", fd)

    s = socket.create_connection((host, int(port)))
    s.sendall(b"GET /slow?ms=%d HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % delay)
    r, _, _ = select.select([s], [], [], 10)
    if not r:
        sys.exit("select timed out")
    report("select", s.fileno())
    while s.recv(4096):
        pass

    rd, wr = os.pipe()
    threading.Timer(delay / 1000, os.write, (wr, b"x")).start()
    p = select.poll()
    p.register(rd, select.POLLIN)
    if not p.poll(10000):
        sys.exit("pipe poll timed out")
    report("pipe", rd)

    sys.stdin.readline()
    conn.close()
    s.close()


if __name__ == "__main__":
    main()
