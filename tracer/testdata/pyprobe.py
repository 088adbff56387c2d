"""pyprobe - a CPython whose state tracer/python_test.go checks from outside.

Prints one JSON line with what the interpreter itself says of its runtime,
thread state, frames and code objects (through ctypes and the C API), then
blocks in wait() reading stdin, so the frames stay put while the test reads
the process's memory; exits when stdin closes.

--lines: instead, print the line of every bytecode offset of every code
object in this file (from co_lines()), for the line-table decoder test.
"""

import ctypes
import dis
import json
import sys
import threading

api = ctypes.pythonapi
api.PyInterpreterState_Head.restype = ctypes.c_void_p
api.PyThreadState_Get.restype = ctypes.c_void_p


def codes(co):
    yield co
    for c in co.co_consts:
        if hasattr(c, "co_code"):
            yield from codes(c)


def lines_of_file():
    with open(__file__, encoding="utf-8") as f:
        top = compile(f.read(), __file__, "exec")
    out = []
    for co in codes(top):
        by_offset = {}
        if hasattr(co, "co_lines"):
            table = co.co_linetable
            for start, end, line in co.co_lines():
                for off in range(start, end, 2):
                    by_offset[off] = line if line is not None else -1
        else:  # 3.9: co_lnotab, and the line starts dis finds in it
            table = co.co_lnotab
            starts = dict(dis.findlinestarts(co))
            line = co.co_firstlineno
            for off in range(0, len(co.co_code), 2):
                line = starts.get(off, line)
                by_offset[off] = line
        out.append({"name": co.co_qualname if hasattr(co, "co_qualname") else co.co_name,
                    "firstlineno": co.co_firstlineno, "linetable": table.hex(),
                    "lines": [by_offset.get(o, -1) for o in range(0, len(co.co_code), 2)]})
    print(json.dumps({"version": list(sys.version_info[:2]), "codes": out}))


class Probe:
    def wait(self, report):
        report["wait_line"] = sys._getframe().f_lineno + 1
        print(json.dumps(report), flush=True); sys.stdin.readline()


def outer(report):
    report["outer_line"] = sys._getframe().f_lineno + 1
    Probe().wait(report)


def main():
    runtime = ctypes.addressof(ctypes.c_char.in_dll(api, "_PyRuntime"))
    report = {
        "version": list(sys.version_info[:2]),
        "runtime": runtime,
        "interp": api.PyInterpreterState_Head(),
        "tstate": api.PyThreadState_Get(),
        "thread_id": threading.get_ident(),
        "code_type": id(type(main.__code__)),
        "file": __file__,
        "wait_code": id(Probe.wait.__code__),
        "outer_code": id(outer.__code__),
        "main_code": id(main.__code__),
    }
    report["main_line"] = sys._getframe().f_lineno + 1
    outer(report)


if __name__ == "__main__":
    if sys.argv[1:] == ["--lines"]:
        lines_of_file()
    else:
        main()
