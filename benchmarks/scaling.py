"""How a call's time grows with one size: its fixed cost against its work. (GPU; --device cpu runs small sizes.)

    python benchmarks/scaling.py PROBLEM --vary NAME=V1,V2,... [--shape BASE] [--solution FILE]... [--no-eager]

From a shape of problem.yaml (default: the problem's default shape), the reference module's constant NAME takes
each value in turn; for each, the harness's inputs are drawn, every target is checked once against the float64
reference (lab.check) and timed (lab.bench: do_bench-style medians, L2 flushed before each call). Then a least-
squares line, time = fixed + slope x NAME, per target. Targets: the problem's solutions (or --solution) and eager.
Beside each time: GB/s of the bytes problem.yaml's cost counts, and the share of the copy ceiling.
  infonce --vary FEATURE_DIM=8,32,64,128,256,512,1024: with B and N fixed, the launch, pipeline fill and merge
      (fixed) against the K loop (slope);
  softmax --shape 8192x16384_fp32 --vary BATCH=8192,32768,98304: short rows over a growing tensor (98304 rows
      move the bytes of 4096x393216): is a large tensor slower per byte, or are long rows?
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

import torch

import lab


def fit(xs, ys) -> tuple:
    """(intercept, slope) of the least-squares line through the points."""
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problem", choices=lab.available_problems())
    parser.add_argument("--vary", required=True, metavar="NAME=V1,V2,...", help="a constant of the reference module and its values")
    parser.add_argument("--shape", help="the shape the other constants come from (default: the problem's default shape)")
    parser.add_argument("--solution", action="append", default=[], help="a file or a name in solutions/PROBLEM/ (default: all)")
    parser.add_argument("--no-eager", action="store_true")
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    dev = lab.device(args.device)
    prob = lab.problem(args.problem)
    name, _, values = args.vary.partition("=")
    if name not in prob.module_defaults() or not values:
        parser.error(f"--vary needs NAME=V1,V2,... with NAME one of {', '.join(prob.module_defaults())}")
    values = [type(prob.module_defaults()[name])(v) for v in values.split(",")]
    base = prob.shape(args.shape) if args.shape else prob.default_shape

    targets = {} if args.no_eager else {"eager": None}
    for path in lab.solution_paths(prob, args.solution) if dev.type == "cuda" or args.solution else []:
        targets[path.stem] = lab.load_solution(prob, path)
    ceilings = lab.ceilings(dev)
    if ceilings:
        print(f"copy ceiling {ceilings['copy'] / 1e12:.2f} TB/s, read ceiling {ceilings['read'] / 1e12:.2f} TB/s (measured here)")
    print(f"{prob.name} from {base.name}, {name} varied; median ms, GB/s, % of copy, check")
    times = {t: [] for t in targets}
    for value in values:
        shape = dataclasses.replace(base, name=f"{base.name}[{name}={value}]", constants={**base.constants, name: value})
        inputs = lab.draw(prob, shape, args.seed, dev)
        truth = lab.reference_output(prob, shape, inputs, dev)
        nbytes = prob.bytes_moved(shape)
        for target, module in targets.items():
            fn = lab.model(prob, shape, dev, module)
            ok, summary = lab.check(prob, shape, fn, inputs, dev, truth)
            with torch.no_grad():
                ms = lab.bench(lambda: fn(*inputs), dev)
            times[target].append(ms)
            share = f"{100 * nbytes / ms / 1e-3 / ceilings['copy']:5.1f}%" if ceilings else "    -"
            print(f"  {name}={value:<9} {target:16s} {ms:10.4f} {nbytes / ms / 1e6:8.0f} {share}  {'ok' if ok else 'WRONG: ' + summary}", flush=True)
        del inputs, truth
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if len(values) > 1:
        print(f"\nleast squares, ms = fixed + slope x {name}:")
        for target, ys in times.items():
            fixed, slope = fit(values, ys)
            print(f"  {target:16s} fixed {fixed * 1e3:9.2f} us   slope {slope * 1e3:10.5f} us per unit ({slope * 1e3 * values[-1]:.2f} us at {values[-1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
