#!/usr/bin/env python3
"""Score the code locations gaptrace gave the gaps of a trainer.py run.

For each stall kind of the truth file, the gaps overlapping its stalls are taken, and the innermost
frame of each gap's evidence stack that lies in trainer.py is compared with where the stall blocks:
a function (read_cold, http_post) or a source line whose text names the blocking call (torch.save,
fsync, next(loader), time.sleep(0), .to(dev)). The line numbers come from trainer.py itself, so
edits to it need no change here. Gaps outside stalls are listed by their top call sites.

  stacks_eval.py --gaps G --truth T [--trainer trainer.py] [--json OUT]
"""
import argparse
import collections
import json
import os

EXPECT = {  # stall cause -> (functions, line-text fragments) that are right
    "io.read": ({"read_cold"}, ()),
    "net": ({"http_post"}, ()),
    "io.write": (set(), ("torch.save", "fsync", "flush")),
    "checkpoint": (set(), ("torch.save", "fsync", "flush")),
    "loader.wait": (set(), ("next(loader)",)),
    "lock": (set(), ("time.sleep(0)", "hogger.start", "hogger.join", "ready.wait")),
    "pageable": (set(), ("pageable.to(",)),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gaps", required=True)
    ap.add_argument("--truth", required=True)
    ap.add_argument("--trainer", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "trainer.py"))
    ap.add_argument("--json")
    a = ap.parse_args()
    src = open(a.trainer).read().splitlines()
    off, stalls = 0, []
    for line in open(a.truth):
        r = json.loads(line)
        if r["type"] == "meta":
            off = r["realtime_minus_monotonic_ns"]
        elif r["type"] == "stall":
            stalls.append((r["cause"], r["start"] + off, r["end"] + off))
    gaps = [json.loads(l) for l in open(a.gaps)]

    def site(g):
        for f in (g.get("evidence") or {}).get("stack") or []:
            if f.get("file", "").endswith("trainer.py"):
                ln = f.get("line", 0)
                text = src[ln - 1].strip() if 0 < ln <= len(src) else ""
                return f.get("function", ""), ln, text
        return None

    res, out = {}, []
    inside = set()
    for cause in sorted({c for c, _, _ in stalls}):
        if cause not in EXPECT:
            continue
        funcs, frags = EXPECT[cause]
        n = ok = withpy = 0
        seen = collections.Counter()
        for c, s, e in stalls:
            if c != cause:
                continue
            for i, g in enumerate(gaps):
                if g["end_unix_nano"] <= s or g["start_unix_nano"] >= e or g["duration_ns"] < 2e6:
                    continue
                inside.add(i)
                n += 1
                st = site(g)
                if st is None:
                    seen["(no trainer.py frame)"] += 1
                    continue
                withpy += 1
                fn, ln, text = st
                seen["trainer.py:%d %s — %s" % (ln, fn, text[:50])] += 1
                if fn in funcs or any(f in text for f in frags):
                    ok += 1
        res[cause] = {"gaps": n, "with_trainer_frame": withpy, "right": ok, "share": ok / n if n else None,
                      "sites": seen.most_common(3)}
        out.append("%-12s %3d gaps  trainer.py frame %5.3f  right site %5.3f   top: %s" % (
            cause, n, withpy / n if n else 0, ok / n if n else 0, "; ".join("%s ×%d" % kv for kv in seen.most_common(2))))
    rest = collections.Counter()
    for i, g in enumerate(gaps):
        if i in inside:
            continue
        st = site(g)
        rest["trainer.py:%d %s — %s" % (st[1], st[0], st[2][:40]) if st else "(no trainer.py frame)"] += 1
    out.append("other gaps: " + "; ".join("%s ×%d" % kv for kv in rest.most_common(4)))
    print("\n".join(out))
    if a.json:
        json.dump({"causes": res, "other": rest.most_common(8)}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
