"""Calibrate the scalar problems' tolerances: what an honest computation's error is on the problems' input
families, and what the known shortcuts' errors are, against the float64 reference the harness uses.

    python benchmarks/calibrate_tolerances.py [--device cpu|cuda] [--problems infonce cross_entropy softmax]
                                              [--trials 6] [--max-bytes 64e6] [--full] [--solutions]
    python benchmarks/calibrate_tolerances.py --self-check [--device cuda]   (correctness.self_check, every shape)

For every correctness shape (timing shapes included: they are correctness shapes too) and every input family
(problem.yaml vary_inputs.families; `--trials` consecutive seeds, so each family is met trials/len(families)
times) it draws the harness's inputs with Problem.make_inputs, computes the float64 reference
(correctness.reference_output), and prints per (shape, family, variant) the worst error over the trials:
for a scalar output the relative error |x - ref| / |ref|, for softmax the relative L2 error. The last column is check_output's verdict with the
problem's tolerance ("pass" for an honest variant and "FAIL" for a cheat is what the tolerance is for; the
script ends with a summary of any honest variant that fails or cheat that passes).

Shapes whose inputs exceed --max-bytes run as a scaled-down analogue (fewer rows first, then shorter rows, until
they fit; the name says which); --full runs them as they are (a GPU has the memory; the CPU is slow).

The figures measured on the H200 and the tolerances chosen from them are in the comments of each problem.yaml.

Honest variants
  fp32 eager        the reference module at the problem's dtype (what `eager` is timed as)
  3xfp16 emulated   (InfoNCE) products of hi = fp16(x) and lo = fp16(2^11 (x - hi)), hi.hi + 2^-11 (lo.hi + hi.lo)
                    accumulated in fp32, the rest in fp32: the products of the shipped InfoNCE kernel
  fp32 chunked      (cross-entropy) a per-row log-sum-exp over 16 column blocks merged in fp32, row losses summed
                    in 64 sequential fp32 chains: another reduction order, as a fast kernel has
  solution NAME     (--solutions, cuda) solutions/<problem>/NAME.py's ModelNew, its output as it returns it
Cheats
  tf32 rn / rz      inputs rounded to 10 explicit mantissa bits (nearest / toward zero), products exact
  fp16 gemm         inputs cast to fp16, products accumulated in fp32 (cuBLAS HGEMM with fp32 accumulation)
  fp16 gemm out     as fp16 gemm, the dot products also rounded to fp16 (HGEMM with an fp16 C)
  bf16 gemm         inputs cast to bf16
  cublas tf32       (cuda only) torch.matmul with torch.backends.cuda.matmul.allow_tf32 = True (at B = 1 or N = 1
                    cuBLAS runs an fp32 GEMV: no TF32, listed as "not reduced precision here")
  negatives/16      (InfoNCE) every 16th negative, its exp-sum scaled by 16
  rows/16           (cross-entropy) the mean over every 16th row
  first rows/16     (cross-entropy) the mean over the first 1/16 of the rows
  classes/16        (cross-entropy) the log-sum-exp over every 16th class (+ log 16), target logit exact
  bf16 compute      (cross-entropy, fp32 logits) logits cast to bf16, computed in fp32 from there
  bf16 output       the honest loss rounded to bf16 (what the bf16 shapes returned before)
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time

import torch
import torch.nn.functional as F

import lab
from lab import check_output, native_reference, reference_output

# Dimensions shrunk to make a shape's analogue fit --max-bytes, in this order, each halved down to 4 before the
# next: the rows first (the row length, the feature size, is what a row's error depends on).
SHRINK = {"infonce": ("BATCH_SIZE", "N_NEGATIVES"), "cross_entropy": ("BATCH", "NUM_CLASSES"), "softmax": ("BATCH", "DIM")}


def tf32(x, toward_zero=False):
    bits = x.float().contiguous().view(torch.int32)
    if not toward_zero:
        bits = bits + 0x1000
    return (bits & ~0x1FFF).view(torch.float32)


def split_fp16(x):
    hi = x.half()
    lo = ((x - hi.float()) * 2048.0).half()
    return hi.float(), lo.float()


def mm32(a, b):
    return a.float() @ b.float().t()


def mm_3xfp16(a, b):
    ah, al = split_fp16(a.float())
    bh, bl = split_fp16(b.float())
    return mm32(ah, bh) + (mm32(al, bh) + mm32(ah, bl)) * (1.0 / 2048.0)


def mm_cublas_tf32(a, b):
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return a.float() @ b.float().t()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def infonce_loss(q, p, n, temperature, mm=mm32, every=1):
    """The seed's loss in fp32 with a pluggable GEMM (and optionally every `every`-th negative only)."""
    pos = F.cosine_similarity(q.float(), p.float(), dim=1) / temperature
    neg = mm(q, n[::every]) / temperature
    lse_neg = torch.logsumexp(neg.float(), dim=1) + math.log(every)
    return (torch.logaddexp(pos, lse_neg) - pos).mean()


def infonce_variants(device):
    v = {
        "fp32 eager": ("honest", None),
        "3xfp16 emulated": ("honest", lambda q, p, n, t: infonce_loss(q, p, n, t, mm_3xfp16)),
        "tf32 rn": ("cheat", lambda q, p, n, t: infonce_loss(q, p, n, t, lambda a, b: mm32(tf32(a), tf32(b)))),
        "tf32 rz": ("cheat", lambda q, p, n, t: infonce_loss(q, p, n, t, lambda a, b: mm32(tf32(a, True), tf32(b, True)))),
        "fp16 gemm": ("cheat", lambda q, p, n, t: infonce_loss(q, p, n, t, lambda a, b: mm32(a.half(), b.half()))),
        "fp16 gemm out": ("cheat", lambda q, p, n, t: infonce_loss(q, p, n, t, lambda a, b: mm32(a.half(), b.half()).half().float())),
        "bf16 gemm": ("cheat", lambda q, p, n, t: infonce_loss(q, p, n, t, lambda a, b: mm32(a.bfloat16(), b.bfloat16()))),
        "negatives/16": ("cheat", lambda q, p, n, t: infonce_loss(q, p, n, t, every=16) if n.shape[0] >= 16 else None),
    }
    if torch.device(device).type == "cuda":
        v["cublas tf32"] = ("cheat", lambda q, p, n, t: infonce_loss(q, p, n, t, mm_cublas_tf32))
    return v


def ce_rows(x, targets):
    x = x.float()
    m = x.amax(dim=1, keepdim=True)
    lse = m.squeeze(1) + (x - m).exp().sum(dim=1).log()
    return lse - x.gather(1, targets.view(-1, 1)).squeeze(1)


def ce_chunked(x, targets):
    """Per-row (max, sum) over 16 column blocks merged in fp32, row losses in 64 sequential fp32 chains."""
    x = x.float()
    B, C = x.shape
    blocks = [x[:, i::16] for i in range(min(16, C))]
    ms = torch.stack([b.amax(dim=1) for b in blocks], 1)
    m = ms.amax(dim=1, keepdim=True)
    s = torch.stack([(b - m).exp().sum(dim=1) for b in blocks], 1)
    total = torch.zeros(B, dtype=torch.float32, device=x.device)
    for k in range(s.shape[1]):
        total = total + s[:, k]
    loss = m.squeeze(1) + total.log() - x.gather(1, targets.view(-1, 1)).squeeze(1)
    chains = torch.zeros(min(64, B), dtype=torch.float32, device=x.device)
    for start in range(0, B, chains.numel()):
        part = loss[start:start + chains.numel()]
        chains[:part.numel()] += part
    return chains.sum() / B


def ce_classes16(x, targets):
    x = x.float()
    sub = x[:, ::16]
    lse = torch.logsumexp(sub, dim=1) + math.log(x.shape[1] / sub.shape[1])
    return (lse - x.gather(1, targets.view(-1, 1)).squeeze(1)).mean()


def ce_variants(shape):
    v = {
        "fp32 eager": ("honest", None),
        "fp32 chunked": ("honest", lambda x, t: ce_chunked(x, t)),
        "rows/16": ("cheat", lambda x, t: ce_rows(x[::16], t[::16]).mean() if x.shape[0] >= 16 else None),
        "first rows/16": ("cheat", lambda x, t: ce_rows(x[:x.shape[0] // 16], t[:x.shape[0] // 16]).mean() if x.shape[0] >= 16 else None),
        "classes/16": ("cheat", lambda x, t: ce_classes16(x, t) if x.shape[1] >= 32 else None),
        "bf16 output": ("cheat", lambda x, t: ce_rows(x, t).mean().bfloat16().float()),
    }
    if shape.dtype == "float32":
        v["bf16 compute"] = ("cheat", lambda x, t: ce_rows(x.bfloat16(), t).mean())
    return v


def analogue(problem, shape, max_bytes):
    if problem.bytes_moved(shape) <= max_bytes:
        return shape
    constants = dict(problem.constants(shape))
    names = SHRINK[problem.name]
    for name in names:
        while True:
            trial = dataclasses.replace(shape, constants={k: constants[k] for k in shape.constants} | {k: constants[k] for k in names})
            if problem.bytes_moved(trial) <= max_bytes or constants[name] <= 4:
                break
            constants[name] //= 2
        if problem.bytes_moved(trial) <= max_bytes:
            break
    label = ",".join(f"{k}={constants[k]}" for k in names if constants[k] != problem.constants(shape)[k])
    return dataclasses.replace(trial, name=f"{shape.name}~{label}")


def scalar_error(value, truth):
    return abs(float(value) - float(truth)) / max(abs(float(truth)), 1e-30)


def solution_variants(problem, device):
    """ModelNew of every solutions/<problem>/*.py, built per shape (its constructor may read shared constants)."""
    variants = {}
    for path in lab.solution_paths(problem):
        module = lab.load_solution(problem, path)
        models = {}

        def run(shape, inputs, module=module, models=models):
            if shape.name not in models:
                models[shape.name] = lab.model(problem, shape, device, module)
            return models[shape.name](*inputs)
        variants[f"solution {path.stem}"] = ("honest", run)
    return variants


def run_problem(problem, device, trials, max_bytes, rows, seed0, solutions=None):
    for original in problem.shapes_for("correctness"):
        shape = analogue(problem, original, max_bytes)
        tolerance = problem.tolerance_for(shape.dtype)
        out_dtype = problem.output_dtype(shape)
        if problem.name == "infonce":
            variants = infonce_variants(device)
        elif problem.name == "cross_entropy":
            variants = ce_variants(shape)
        else:
            variants = {"fp32 eager": ("honest", None)}
        for name, (kind, fn) in (solutions or {}).items():
            variants[name] = (kind, lambda *inputs, fn=fn, shape=shape: fn(shape, [x for x in inputs if not isinstance(x, float)]))
        worst = {}
        started = time.time()
        for k in range(trials):
            seed = seed0 + k
            family = problem.family_of(seed)
            inputs = lab.draw(problem, shape, seed, device)
            truth = reference_output(problem, shape, inputs, device)
            for name, (kind, fn) in variants.items():
                with torch.no_grad():
                    if fn is None:
                        out = native_reference(problem, shape, inputs, device)
                    else:
                        args = list(inputs) + ([problem.constants(shape)["TEMPERATURE"]] if problem.name == "infonce" else [])
                        out = fn(*args)
                if out is None:
                    continue
                if name.startswith("solution "):
                    candidate = out  # as returned: its dtype is checked too
                    err = scalar_error(out, truth) if out.dim() == 0 else float(
                        torch.linalg.vector_norm(out.double() - truth) / torch.linalg.vector_norm(truth))
                elif out.dim() == 0:
                    err = scalar_error(out, truth)
                    candidate = out.to(out_dtype)
                else:
                    d = (out.double() - truth).abs()
                    err = float(torch.linalg.vector_norm(d) / torch.linalg.vector_norm(truth))
                    candidate = out
                verdict = check_output(candidate, truth, out_dtype, tolerance)
                key = (family, name)
                e, ok_all, ok_any, _ = worst.get(key, (0.0, True, False, kind))
                worst[key] = (max(e, err), ok_all and verdict.ok, ok_any or verdict.ok, kind)
                del out
            del inputs, truth
        for (family, name), (err, ok_all, ok_any, kind) in sorted(worst.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            verdict = ("pass" if ok_all else "FAIL(some)") if kind == "honest" else ("FAIL" if not ok_any else ("pass(some)" if not ok_all else "PASS"))
            rows.append((problem.name, shape.name, family, name, kind, err, verdict))
            print(f"{problem.name:13s} {shape.name:34s} {family:15s} {name:16s} {kind:6s} {err:10.3e}  {verdict}", flush=True)
        print(f"# {problem.name} {shape.name}: {time.time() - started:.1f} s; tolerance {tolerance}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--problems", nargs="*", default=["infonce", "cross_entropy", "softmax"])
    parser.add_argument("--trials", type=int, default=6, help="consecutive seeds per shape (each family trials/len(families) times)")
    parser.add_argument("--max-bytes", type=float, default=64e6, help="shapes over this many input bytes run as a scaled-down analogue")
    parser.add_argument("--full", action="store_true", help="run every shape as it is")
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--solutions", action="store_true", help="also check solutions/<problem>/*.py (builds them; cuda)")
    parser.add_argument("--self-check", action="store_true", help="only run correctness.self_check on --device (every shape on a GPU)")
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.device == "cpu":
        torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.self_check:
        bad = 0
        for name in args.problems:
            started = time.time()
            lines = lab.self_check(lab.problem(name), args.device)
            wrong = [line for line in lines if not line.ok]
            bad += len(wrong)
            print(f"self-check {name} on {args.device}: {len(lines) - len(wrong)}/{len(lines)} cases as expected "
                  f"({len({line.shape for line in lines})} shapes, {time.time() - started:.1f} s)", flush=True)
            for line in wrong:
                print(f"  {line.shape} [{line.family}] {line.case}: expected {line.expected}, got {line.got}")
        return 1 if bad else 0
    rows = []
    print(f"{'problem':13s} {'shape':34s} {'family':15s} {'variant':16s} {'kind':6s} {'worst err':>10s}  verdict at the problem's tolerance")
    for name in args.problems:
        problem = lab.problem(name)
        solutions = solution_variants(problem, args.device) if args.solutions else None
        run_problem(problem, args.device, args.trials, float("inf") if args.full else args.max_bytes, rows, args.seed, solutions)
    print("\nper variant and family, over shapes: smallest and largest worst-error, and shapes where check_output")
    print("rejected the variant in at least one trial of the family (honest: should be 0; cheats: all of them):")
    table = {}
    for problem, shape, family, name, kind, err, verdict in rows:
        entry = table.setdefault((problem, kind, name, family), [math.inf, 0.0, 0, 0])
        entry[0], entry[1] = min(entry[0], err), max(entry[1], err)
        entry[2] += verdict != "pass" and verdict != "PASS"
        entry[3] += 1
    for (problem, kind, name, family), (lo, hi, rejected, total) in sorted(table.items()):
        print(f"  {problem:13s} {kind:6s} {name:16s} {family:15s} min {lo:9.2e} max {hi:9.2e}  rejected on {rejected}/{total} shapes")
    for problem in args.problems:
        print(f"  {problem} tolerance: {lab.problem(problem).tolerance}")
    caught, largest = {}, {}
    for problem, shape, family, name, kind, err, verdict in rows:
        if kind == "cheat":
            caught[(problem, shape, name)] = caught.get((problem, shape, name), False) or verdict != "PASS"
            largest[(problem, shape, name)] = max(largest.get((problem, shape, name), 0.0), err)
    wrong = [f"{r[0]} {r[1]} {r[2]}: honest {r[3]} failed (error {r[5]:.2e})" for r in rows if r[4] == "honest" and r[6] != "pass"]
    for (p, s, n), ok in caught.items():
        if not ok and largest[(p, s, n)] < 1e-6:  # e.g. cuBLAS runs B = 1 or N = 1 as an fp32 GEMV: no TF32 there
            print(f"  (not reduced precision here: {p} {s} {n} stayed within {largest[(p, s, n)]:.1e} of the reference)")
        elif not ok:
            wrong.append(f"{p} {s}: cheat {n} passed every trial")
    print("\nproblems:" if wrong else "\nevery honest variant passes every trial; every cheat fails at least one trial of every shape")
    for line in wrong:
        print("  " + line)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
