"""Does the harness's timing agree with do_bench, and how much does a figure move between processes? (GPU)

    python benchmarks/timing_check.py [PROBLEM ...] [--shape NAME]... [--solution FILE] [--processes N]
                                      [--sets N] [--env NAME=VALUE]... [--json FILE]

For every timing shape of each problem (default: all), the eager reference (or --solution, one problem) is timed
in a fresh process, pinned to the GPU's NUMA node as the harness's worker is, by
  harness   the harness's own loops (harness.timing.make_timer, through lab.harness_timing): warm-up, batches
            of --sets input sets (default: the harness's sets_per_batch), an L2 flush and events around every
            call, until the standard error is under 1% or the harness's budget is spent (the harness draws
            fresh sets for every batch; here they are drawn once);
  do_bench  triton.testing.do_bench's median on one input set (lab.bench's own loop where triton is missing);
and beside them: issue, the host's ms to issue one call in a back-to-back burst; device, the median when the
device waits until the host has queued a batch (the part of a launch-bound figure that does not follow the host);
probe, the host's us to issue one tiny operation. It prints harness / do_bench per shape and the worst
disagreement (the harness is meant to agree within 5%). With --processes N every measurement is repeated in N
fresh processes, one after another, and each column's spread (max / min - 1) is printed with its correlation with
probe: a launch-bound figure that follows probe is the host's speed, not the kernel's. --env sets a variable in
those processes (PYTHONHASHSEED=0, say). --device cpu runs the same path on the CPU (small shapes; no device time).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

import lab

COLUMNS = ("harness_ms", "do_bench_ms", "issue_ms", "device_ms", "probe_us")


def child(args, dev) -> int:
    pinned = lab.pin_near_device(dev)
    for name in args.problems:
        prob = lab.problem(name)
        module = lab.load_solution(prob, lab.solution_paths(prob, [args.solution])[0]) if args.solution else None
        for shape in lab.timing_shapes(prob, args.shape, args.max_bytes):
            count = args.sets or lab.sets_per_batch(prob.bytes_moved(shape), lab.HARNESS.memory_budget_bytes)
            sets = [lab.draw(prob, shape, 100 + k, dev) for k in range(count)]
            fn = lab.model(prob, shape, dev, module)
            with torch.no_grad():
                timed = lab.harness_timing(fn, sets, dev)
                do_bench = lab.bench(lambda: fn(*sets[0]), dev, warmup_ms=50, rep_ms=300)
            lab.emit(problem=name, shape=shape.name, sets=count, reps=timed["reps"], harness_ms=timed["median_ms"], do_bench_ms=do_bench,
                     issue_ms=timed["issue_ms"], device_ms=timed["device_ms"], probe_us=timed["probe_us"], cpus=pinned or "as started")
            del sets, fn
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return 0


def correlation(xs, ys) -> float:
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:  # fewer than two points, or a constant column
        return float("nan")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="*", default=None, help="default: every problem")
    parser.add_argument("--shape", action="append", default=[], help="only these shapes (repeatable; one problem)")
    parser.add_argument("--solution", help="time this solution file instead of the eager reference (one problem)")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--sets", type=int, default=0, help="input sets per timed batch (default: the harness's choice)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="set in the measuring processes")
    parser.add_argument("--device", default=None)
    parser.add_argument("--max-bytes", type=float, default=None, help="leave out larger shapes (default: none on a GPU, 64e6 on the CPU)")
    parser.add_argument("--json", type=Path, help="also write every process's figures here")
    parser.add_argument("--hang-s", type=float, default=900.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    dev = lab.device(args.device)
    args.max_bytes = args.max_bytes or (float("inf") if dev.type == "cuda" else 64e6)
    args.problems = args.problems or lab.available_problems()
    if (args.solution or args.shape) and len(args.problems) != 1:
        parser.error("--solution and --shape go with one problem")
    if args.child:
        return child(args, dev)

    forward = [*args.problems, "--device", dev.type, "--max-bytes", args.max_bytes, "--sets", args.sets, "--child"]
    forward += [a for s in args.shape for a in ("--shape", s)] + (["--solution", args.solution] if args.solution else [])
    env = dict(item.split("=", 1) for item in args.env)
    rows, failed = [], 0
    print(f"{'process':>7s} {'problem':13s} {'shape':20s} {'sets':>4s} " + " ".join(f"{c:>11s}" for c in COLUMNS) + "  ratio", flush=True)
    for process in range(1, args.processes + 1):
        status, results = lab.run_child(Path(__file__).resolve(), forward, args.hang_s, env)
        failed += status != 0
        for r in results:
            r["process"] = process
            values = " ".join(f"{r[c]:11.4f}" if r[c] is not None else f"{'-':>11s}" for c in COLUMNS)
            print(f"{process:7d} {r['problem']:13s} {r['shape']:20s} {r['sets']:4d} {values}  {r['harness_ms'] / r['do_bench_ms']:5.3f}", flush=True)
        rows += results
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    keys = list(dict.fromkeys((r["problem"], r["shape"]) for r in rows))
    worst = 0.0
    for key in keys:
        group = [r for r in rows if (r["problem"], r["shape"]) == key]
        ratio = statistics.median(r["harness_ms"] / r["do_bench_ms"] for r in group)
        worst = max(worst, abs(ratio - 1))
        print(f"\n{key[0]} {key[1]}: harness / do_bench {ratio:.3f} (median over {len(group)} process(es))")
        if len(group) > 2:
            for c in COLUMNS:
                values = [r[c] for r in group if r[c] is not None]
                if len(values) == len(group) and min(values) > 0:
                    probe = [r["probe_us"] for r in group]
                    print(f"  {c:12s} median {statistics.median(values):9.4f}  spread {100 * (max(values) / min(values) - 1):6.1f}%"
                          f"  correlation with probe {correlation(values, probe):+.2f}")
    if keys:
        print(f"\nworst harness / do_bench disagreement {100 * worst:.1f}% ({'within' if worst <= 0.05 else 'OUTSIDE'} 5%)")
    return 1 if failed or not keys else 0


if __name__ == "__main__":
    sys.exit(main())
