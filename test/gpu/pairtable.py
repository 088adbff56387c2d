"""The overhead table both pair scripts print (overhead_pairs.py: whole runs; overhead_attach.py: windows
of one running job): bin/bench -merge's medians with bootstrap 95% intervals when bin/bench is there,
plain medians otherwise, then gaptrace's own cost per mode."""
import os
import statistics
import subprocess


def add_pair(saved, mode, traced, base):
    """Records one pair in bench's -save format: traced's step time against base's, traced's CPU time
    per step and time per launch."""
    saved["Ratio"][mode].append(traced["step_ns"] / base["step_ns"])
    saved["CPU"][mode].append(traced["cpu_ns"])
    saved["Launch"][mode].append(traced["launch_ns"])


def print_table(bench, path, saved, modes, sidecar, per, job="launch"):
    """saved: bench's -save format ({"Ratio"|"CPU"|"Launch": {mode: [...]}}, or {"JOB/mode": [...]}
    for a job other than launch) as written to path; sidecar: {mode: [summary "sidecar" objects]};
    per: what one sidecar figure covers ("run")."""
    pre = "" if job == "launch" else job + "/"
    shown = [m for m in modes if saved["Ratio"].get(pre + m)]
    if os.access(bench, os.X_OK):
        subprocess.run([bench, "-merge", path, "-jobs", job, "-modes", ",".join(shown)])
    else:
        print(f"(no {bench}: medians only)")
        for m in shown:
            k = pre + m
            print(f"{m:<9} wall/step vs untraced {statistics.median(saved['Ratio'][k]):.4f}  "
                  f"cpu {statistics.median(saved['CPU'][k]) / 1e3:.1f} µs/step  "
                  f"{statistics.median(saved['Launch'][k]) / 1e3:.3f} µs/launch")
    for m in modes:
        if sidecar.get(m):
            cpu = statistics.median(s["cpu_ns"] for s in sidecar[m]) / 1e9
            rss = statistics.median(s["max_rss_bytes"] for s in sidecar[m]) / 2**20
            print(f"gaptrace's own cost under {m}: median {cpu:.2f} s CPU per {per}, {rss:.0f} MiB peak RSS")
