"""What moves a launch-bound figure between processes: the CPU, PyTorch's dispatcher, or the launch path?
(GPU, about a minute.)

The InfoNCE reference at its seed shape is about ten small kernels, so the harness times the host issuing
them. Its median moves 10-40% between processes and between runs while it is steady inside one process.
In each of --procs fresh processes this script measures, twice:
  python   a fixed pure-Python workload (function calls, dict lookups), us
  dispatch torch's CPU dispatcher: add_ on a one-element CPU tensor, us per op
  launch   harness.timing.host_issue_probe: add_ on a one-element CUDA tensor, us per launch
  eager    the eager reference at 256x512_n2560, harness.timing.time_calls median, ms
then prints each column's spread across processes and its correlation with eager. One more process
repeats the four every few seconds for --drift seconds (does a process's speed move over time?).
--modes runs the processes in several ways, interleaved: os (as started), hash0 (PYTHONHASHSEED=0: the same
dict layouts in every process), hash0core (that, and pinned to the last allowed CPU).
Usage: python3 benchmarks/host_speed.py [--procs 10] [--drift 20] [--modes os,hash0,hash0core]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
COLUMNS = ("python", "dispatch", "launch", "eager")


def python_workload_us(repeats: int = 5) -> float:
    table = {f"k{i}": i for i in range(64)}
    keys = list(table)

    def step(d, k):
        return d[k] + 1

    best = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(200):
            for k in keys:
                step(table, k)
        best.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(best)


def current_cpu() -> int:
    """The CPU this process last ran on (field 39 of /proc/self/stat)."""
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def measure(torch, timing, model, draw, device) -> dict:
    cpu = torch.zeros(1)
    t0 = time.perf_counter()
    for _ in range(2000):
        cpu.add_(1.0)
    dispatch = (time.perf_counter() - t0) / 2000 * 1e6
    with torch.no_grad():
        eager = timing.time_calls(model, draw, device, budget_s=1.0).median_ms
    return {"python": python_workload_us(), "dispatch": dispatch, "launch": timing.host_issue_probe(device),
            "eager": eager, "cpu": current_cpu()}


def child(drift_s: float) -> None:
    import torch

    from harness import timing
    from harness.problem import find_problem

    device = torch.device(os.environ.get("HOST_SPEED_DEVICE", "cuda"))  # cpu: try the script without a GPU
    pinned = timing.pin_near_device(device)
    if os.environ.get("HOST_SPEED_CORE") == "last":  # the highest-numbered CPU allowed: away from CPU 0's interrupts
        last = max(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {last})
        pinned = str(last)
    problem = find_problem("infonce")
    shape = problem.shape("256x512_n2560")
    model = problem.make_reference(shape, device)
    draw = lambda k: problem.make_inputs(shape, 1000 + k, device)  # noqa: E731
    rounds = []
    start = time.perf_counter()
    while len(rounds) < 2 or time.perf_counter() - start < drift_s:
        rounds.append(measure(torch, timing, model, draw, device))
        if drift_s:
            time.sleep(2.0)
    print("RESULT " + json.dumps({"pinned": pinned or "os", "rounds": rounds}), flush=True)


def correlation(xs, ys) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / (sxx * syy) ** 0.5 if sxx and syy else float("nan")


MODES = {"os": {}, "hash0": {"PYTHONHASHSEED": "0"}, "hash0core": {"PYTHONHASHSEED": "0", "HOST_SPEED_CORE": "last"}}


def run_child(drift_s: float, mode: str = "os"):
    proc = subprocess.run([sys.executable, __file__, "--child", "--drift", str(drift_s)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, **MODES[mode]})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        print("process failed:", proc.stderr.strip().splitlines()[-3:])
        return None
    return json.loads(lines[0][7:])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=10)
    ap.add_argument("--drift", type=float, default=20.0)
    ap.add_argument("--modes", default="os", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        child(args.drift)
        return 0
    for path in ("/proc/loadavg", "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"):
        if os.path.exists(path):
            print(path, open(path).read().strip())
    print("cpus allowed:", len(os.sched_getaffinity(0)), "| model:",
          next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?"))
    modes = args.modes.split(",")
    firsts = {mode: [] for mode in modes}
    print("\nmode       proc  cpu  python us  dispatch us  launch us  eager ms   (first round / second round)")
    for i in range(args.procs):
        for mode in modes:  # interleaved, so that a drift of the host hits every mode alike
            result = run_child(0.0, mode)
            if not result:
                continue
            a, b = result["rounds"][0], result["rounds"][1]
            firsts[mode].append(a)
            print(f"{mode:10s} {i:4d} {a['cpu']:4d}  " + "  ".join(f"{a[c]:8.3f}/{b[c]:<8.3f}" for c in COLUMNS), flush=True)
    for mode, rows in firsts.items():
        if len(rows) > 2:
            print(f"\n{mode}: column  spread (max/min-1)  correlation with eager   (eager median {statistics.median(r['eager'] for r in rows):.4f} ms)")
            eager = [r["eager"] for r in rows]
            for c in COLUMNS:
                values = [r[c] for r in rows]
                print(f"  {c:9s}  {100 * (max(values) / min(values) - 1):6.1f}%            {correlation(values, eager):+.2f}")
    if args.drift:
        result = run_child(args.drift)
        if result:
            print(f"\none process over {args.drift:.0f} s:")
            for r in result["rounds"]:
                print("  " + "  ".join(f"{c} {r[c]:.3f}" for c in COLUMNS) + f"  cpu {r['cpu']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
