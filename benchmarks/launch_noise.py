"""How much does a launch-bound timing move from one process to the next? (GPU, a minute or two)

The InfoNCE reference at its seed shape is about ten small kernels, so its time is the host's launch
time. This script times it (eager, and under torch.compile) with harness.timing.time_calls in fresh
processes, interleaving three ways of running the timer:
  old   no timed warm-up, garbage collector on, process left where the OS put it
  new   what the harness does now: timed warm-up, collector paused, pinned to the GPU's NUMA node
  core  as new, and pinned to one core of that node
  hash0 as new, with PYTHONHASHSEED=0 (the same dict layouts in every process)
  fixed as hash0, with address-space randomisation off (setarch -R)
and prints, per way, the medians and their spread (max/min - 1) across processes.
Usage: python3 benchmarks/launch_noise.py [--procs 4] [--no-compile]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def child(way: str, with_compile: bool) -> None:
    import torch

    from harness import timing
    from harness.problem import load_problem

    device = torch.device("cuda")
    cpus = ""
    if way != "old":
        cpus = timing.pin_near_device(device)
        if way == "core":
            first = min(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {first})
            cpus = str(first)
    problem = load_problem(ROOT / "problems" / "infonce")
    shape = problem.shape("256x512_n2560")
    problem.apply_constants(shape)
    result = {"way": way, "cpus": cpus or "os"}
    models = {"eager": problem.module.Model().to(device).eval()}
    if with_compile:
        models["compile"] = torch.compile(problem.module.Model().to(device).eval(), dynamic=False)
    for name, model in models.items():
        draw = lambda k: problem.make_inputs(shape, 1000 + k, device)  # noqa: E731
        with torch.no_grad():
            if way == "old":
                for _ in range(3):
                    model(*draw(-1))
                torch.cuda.synchronize()
                stats = timing.time_calls(model, draw, device, warmup_s=0.0, pause_gc=False)
            else:
                stats = timing.time_calls(model, draw, device)
        result[name] = round(stats.median_ms, 5)
        result[name + "_reps"] = stats.reps
    print("RESULT " + json.dumps(result), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--ways", default="old,new,core")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        child(args.child, not args.no_compile)
        return 0
    for path in ("/sys/devices/system/node/online",):
        if os.path.exists(path):
            print(path, open(path).read().strip())
    print("cpus allowed:", len(os.sched_getaffinity(0)))
    results = {way: [] for way in args.ways.split(",")}
    for i in range(args.procs):
        for way in results:
            cmd = [sys.executable, __file__, "--child", way] + (["--no-compile"] if args.no_compile else [])
            env = dict(os.environ)
            if way in ("hash0", "fixed"):
                env["PYTHONHASHSEED"] = "0"
            if way == "fixed":
                cmd = ["setarch", os.uname().machine, "-R"] + cmd
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if not lines:
                print(f"{way} process {i} failed: {proc.stderr.strip().splitlines()[-1:]}")
                continue
            result = json.loads(lines[0][7:])
            print(result, flush=True)
            results[way].append(result)
    print("\nway    target   medians (ms)                               spread")
    for way, rows in results.items():
        for target in ("eager", "compile"):
            values = [r[target] for r in rows if target in r]
            if len(values) > 1:
                spread = max(values) / min(values) - 1
                print(f"{way:6} {target:8} {' '.join(f'{v:.4f}' for v in values):42} {100 * spread:5.1f}%"
                      f"  (median {statistics.median(values):.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
