"""Check and time a problem's solutions on the harness's inputs, outside the harness (GPU; a CPU mode for CI).

    python benchmarks/check.py PROBLEM [--solution FILE]... [--shape NAME]... [--quick] [--no-timing] [--device cpu]

Correctness: every correctness shape of problems/PROBLEM/problem.yaml at every dtype the problem lists (--quick:
at its own dtype only), for consecutive seeds that meet every input family (drawn by Problem.make_inputs, as the
harness draws them) and one cache-probe trial (the previous trial's first and last elements). Each output lands
in poisoned memory (an element never written fails), is judged by the harness's check_output against the float64
reference (max abs, max rel and relative L2 error against the problem's tolerance), and the call must leave its
inputs unchanged and repeat bit for bit. The eager reference is checked too (a check of the tolerances). Each
target runs in its own process, restarted at the next case after a crash, a CUDA error or a hang.
Timing: the timing shapes, each solution beside eager PyTorch and problem.yaml's externals (quack, Liger) where
they import: do_bench-style medians (lab.bench, L2 flushed before each call), GB/s, the share of the copy
ceiling the harness measures, and the speedup over eager.
On the CPU only the eager reference runs unless --solution names a file, on shapes of at most --max-bytes.
Last line: ALL CORRECT or FAILURES: ...
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

import lab

SCRIPT = Path(__file__).resolve()


def at_dtypes(prob, shape, quick: bool) -> list:
    """The shape at its own dtype (quick), or at every dtype the problem's shapes list."""
    listed = [shape.dtype] if quick else dict.fromkeys(s.dtype for s in prob.shapes)
    return [shape if d == shape.dtype else dataclasses.replace(shape, name=f"{shape.name}@{d}", dtype=d) for d in listed]


def cases(prob, args) -> list:
    """(shape, seed, probe_from) in a fixed order: parent and children enumerate the same list."""
    trials = args.trials or len(prob.family_names) * (1 if args.quick else 2)
    out = []
    for base in lab.shapes(prob, "correctness", args.shape):
        for shape in at_dtypes(prob, base, args.quick):
            if prob.bytes_moved(shape) <= args.max_bytes:
                seeds = range(args.seed, args.seed + trials)
                out += [(shape, seed, None) for seed in seeds] + [(shape, args.seed + trials, seeds[-1])]
    return out


def label(prob, case) -> str:
    shape, seed, probe_from = case
    return f"{shape.name} seed {seed} {prob.family_of(seed)}" + (" cache probe" if probe_from is not None else "")


def target_fn(prob, target: str, shape, dev, cache: dict):
    """A callable for `target` at `shape`: eager, an external's name, or a solution file (one model per shape)."""
    if target == "eager":
        return lab.model(prob, shape, dev)
    if not target.endswith(".py"):
        return lab.externals(prob)[target]
    if "module" not in cache:
        cache["module"] = lab.load_solution(prob, Path(target))
    if cache.get("shape") != shape.name:
        cache.update(shape=shape.name, model=lab.model(prob, shape, dev, cache["module"]))
    return cache["model"]


def child_check(prob, args, dev) -> int:
    cache = {}
    try:
        target_fn(prob, args.target, prob.default_shape, dev, cache)
    except Exception as error:  # noqa: BLE001 - a build or import failure is the verdict
        lab.emit(broken=f"{type(error).__name__}: {str(error)[-1500:]}")
        return 2
    for index, case in enumerate(cases(prob, args)):
        if index < args.start:
            continue
        shape, seed, probe_from = case
        try:
            fn = target_fn(prob, args.target, shape, dev, cache)
            ok, summary = lab.check(prob, shape, fn, lab.draw(prob, shape, seed, dev, probe_from), dev)
        except Exception as error:  # noqa: BLE001 - reported per case; a sticky CUDA error ends the process
            ok, summary = False, f"{type(error).__name__}: {str(error)[:300]}"
        print(f"  {'PASS' if ok else 'FAIL'} {Path(args.target).stem:14s} {label(prob, case):44s} {summary}", flush=True)
        lab.emit(case=index, ok=ok)
        try:
            lab.sync(dev)
        except Exception:  # noqa: BLE001
            return 3
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return 0


def child_time(prob, args, dev) -> int:
    targets = args.target.split(",")
    if args.target == "eager":
        targets += list(lab.externals(prob))
        lab.emit(ceilings=lab.ceilings(dev))
    cache = {}
    for shape in lab.timing_shapes(prob, args.shape, args.max_bytes):
        inputs = lab.draw(prob, shape, args.seed, dev)
        for target in targets:
            try:
                fn = target_fn(prob, target, shape, dev, cache)
                with torch.no_grad():
                    ms = lab.bench(lambda: fn(*inputs), dev)
                lab.emit(shape=shape.name, target=Path(target).stem, ms=ms, bytes=prob.bytes_moved(shape))
            except Exception as error:  # noqa: BLE001 - one library's refusal (Liger's row limit) is not ours
                print(f"  {shape.name} {Path(target).stem}: {type(error).__name__}: {str(error)[:200]}", flush=True)
        del inputs
    return 0


def run_target(prob, target: str, common: list, all_cases: list, hang_s: float) -> tuple:
    """Check one target over every case, restarting its process after a death. Returns (failures, whether
    it is worth timing: it built and did not die three times in a row)."""
    failures, start, name, silent = [], 0, Path(target).stem, 0
    while start < len(all_cases):
        status, results = lab.run_child(SCRIPT, common + ["--child", "check", "--target", target, "--start", start], hang_s)
        if any("broken" in r for r in results):
            return [f"{name}: {next(r['broken'] for r in results if 'broken' in r)}"], False
        silent = 0 if results else silent + 1
        if silent == 3:
            return failures + [f"{name}: three processes in a row died without finishing a case; gave up"], False
        failures += [f"{name}/{label(prob, all_cases[r['case']])}" for r in results if not r["ok"]]
        start = max([r["case"] + 1 for r in results] + [start])
        if status == 0:
            break
        if status is None or status != 3:  # died inside case `start` without reporting it
            why = f"no output for {hang_s:.0f} s" if status is None else f"exit status {status}"
            print(f"  FAIL {name:14s} {label(prob, all_cases[start]):44s} {why}", flush=True)
            failures.append(f"{name}/{label(prob, all_cases[start])} ({why})")
            start += 1
    return failures, True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problem", choices=lab.available_problems())
    parser.add_argument("--solution", action="append", default=[], help="a file or a name in solutions/PROBLEM/ (repeatable; default: all)")
    parser.add_argument("--shape", action="append", default=[], help="only these shapes (repeatable)")
    parser.add_argument("--quick", action="store_true", help="each shape at its own dtype, each input family once")
    parser.add_argument("--trials", type=int, default=0, help="seeds per shape and dtype (default: each family twice)")
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--device", default=None, help="cuda (default where available) or cpu")
    parser.add_argument("--max-bytes", type=float, default=None, help="leave out larger shapes (default: none on a GPU, 64e6 on the CPU)")
    parser.add_argument("--hang-s", type=float, default=600.0, help="a target silent this long is killed")
    parser.add_argument("--child", choices=["check", "time"], help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    dev = lab.device(args.device)
    args.max_bytes = args.max_bytes or (float("inf") if dev.type == "cuda" else 64e6)
    prob = lab.problem(args.problem)
    if args.child:
        return (child_check if args.child == "check" else child_time)(prob, args, dev)

    paths = lab.solution_paths(prob, args.solution) if dev.type == "cuda" or args.solution else []
    targets = ["eager"] + [str(p) for p in paths]
    common = [prob.name, "--device", dev.type, "--seed", args.seed, "--trials", args.trials, "--max-bytes", args.max_bytes]
    common += (["--quick"] if args.quick else []) + [a for s in args.shape for a in ("--shape", s)]
    all_cases = cases(prob, args)
    print(f"== {prob.name}: {len(all_cases)} cases per target on {dev.type}; targets: {', '.join(Path(t).stem for t in targets)}", flush=True)
    failures, timed = [], []
    for target in targets:
        failed, runs = run_target(prob, target, common, all_cases, args.hang_s)
        failures += failed
        timed += [target] if runs else []
    if not args.no_timing:
        print("\n== timing (median ms, L2 flushed before each call)", flush=True)
        rows, ceilings = [], {}
        for target in timed:
            status, results = lab.run_child(SCRIPT, common + ["--child", "time", "--target", target], args.hang_s)
            rows += [r for r in results if "ms" in r]
            ceilings.update(next((r["ceilings"] for r in results if "ceilings" in r), {}))
            if status != 0:
                failures.append(f"{Path(target).stem}: timing ended with {'a hang' if status is None else f'exit status {status}'}")
        eager = {r["shape"]: r["ms"] for r in rows if r["target"] == "eager"}
        copy = ceilings.get("copy")
        print(f"  {'shape':22s} {'target':16s} {'ms':>9s} {'GB/s':>7s} {'% copy':>7s} {'vs eager':>8s}")
        order = {s.name: i for i, s in enumerate(lab.timing_shapes(prob, args.shape, args.max_bytes))}
        for r in sorted(rows, key=lambda r: (order.get(r["shape"], 0), r["ms"])):
            rate = r["bytes"] / r["ms"] / 1e6
            share = f"{100 * rate * 1e9 / copy:6.1f}%" if copy else "      -"
            speedup = f"{eager[r['shape']] / r['ms']:7.2f}x" if r["shape"] in eager else "       -"
            print(f"  {r['shape']:22s} {r['target']:16s} {r['ms']:9.4f} {rate:7.0f} {share} {speedup}")
        if copy:
            print(f"  (copy ceiling {copy / 1e12:.2f} TB/s, read ceiling {ceilings['read'] / 1e12:.2f} TB/s, measured here)")
    print("ALL CORRECT" if not failures else "FAILURES: " + ", ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
