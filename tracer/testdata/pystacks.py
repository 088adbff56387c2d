"""pystacks - Python threads whose blocking calls tracer/python_trace_test.go
names from their traced stacks.

main: calls outer() -> nap(), which sleeps, N times.
churn: compiles a fresh function gen_I each round (its sleep on line
I % 500 + 2 of file "churn.py"), calls it and drops it, so code objects are
freed and their memory reused while stacks naming them are resolved.
deep: sleeps at the bottom of a recursion deeper than the captured depth.

Prints one JSON line at the end: pid, thread ids, file and lines; then
stays until stdin closes, so the tracer can still read its memory while it
resolves the last stacks.
"""

import json
import os
import sys
import threading
import time


def nap(truth):
    truth["nap_line"] = sys._getframe().f_lineno + 1
    time.sleep(0.002)


def outer(truth):
    truth["outer_line"] = sys._getframe().f_lineno + 1
    nap(truth)


def churn(stop, truth):
    truth["churn_tid"] = threading.get_native_id()
    i = 0
    while not stop.is_set():
        i += 1
        src = "\n" * (i % 500) + "def gen_%d():\n    time.sleep(0.0003)\n" % i
        ns = {"time": time}
        exec(compile(src, "churn.py", "exec"), ns)
        ns["gen_%d" % i]()
        del ns
    truth["churn_rounds"] = i


def rec(n, truth):
    if n:
        return rec(n - 1, truth)
    truth["rec_line"] = sys._getframe().f_lineno + 1
    time.sleep(0.0005)


def deep(stop, truth):
    truth["deep_tid"] = threading.get_native_id()
    while not stop.is_set():
        rec(40, truth)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    truth = {"pid": os.getpid(), "tid": threading.get_native_id(), "file": __file__}
    stop = threading.Event()
    ts = [threading.Thread(target=churn, args=(stop, truth)), threading.Thread(target=deep, args=(stop, truth))]
    for t in ts:
        t.start()
    for _ in range(n):
        outer(truth)
    stop.set()
    for t in ts:
        t.join()
    print(json.dumps(truth), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
