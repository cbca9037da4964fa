"""Correctness + knob sweep for solutions/softmax/fast_v4.py (run on the GPU machine, from the repo root).

    python3 benchmarks/bench_softmax_v4.py [--quick] [--names fast,fast_v4] [--classes 0,1,2,3,4]

Builds the files named by --names (default fast.py and fast_v4.py). Correctness (fast_v4 only): every
problem.yaml shape in float32 and bfloat16 (auto dispatch), inputs like the harness (randn * scale + offset,
offset in +-60), float64 reference, problem.yaml tolerances (atol/rtol and relative L2); outputs poisoned
with NaN (freed NaN memory reused by the allocator); inputs must come back unchanged. Extras: misaligned
base pointer, an all -inf row, a +inf row and a NaN row (NaN rows like torch), and every register variant
of the chosen classes x cache hints on full-width and padded (narrower) rows of its class.
Timing: the four timing shapes, triton.testing.do_bench(warmup=25, rep=100) median (L2 flushed), for the
built files, fast_v4 (auto + knob sweep: variant, hint, CTAs/SM; 4096x393216: the register-segment
variants with .cs stores), torch eager, quack, Liger.
Each part runs in a child process restarted after a crash or hang, so one bad case cannot hide others.
Last line: ALL CORRECT or FAILURES: ...
"""
import argparse
import functools
import math
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEAK_BW = 4.24e12
TOL = {torch.float32: (1e-4, 1e-4, 1e-4), torch.bfloat16: (1e-2, 1e-2, 1e-2)}  # atol, rtol, rel L2
SCALES = [0.5, 1.0, 2.0, 4.0, 8.0]
HANG_S = 60

SHAPES = [  # problem.yaml
    ("8192x16384", 8192, 16384), ("4096x393216", 4096, 393216), ("32768x4096", 32768, 4096),
    ("16384x32768", 16384, 32768), ("one_row", 1, 1000), ("tiny", 5, 3), ("width_one", 3, 1),
    ("odd_prime_width", 7, 65537), ("not_vector_multiple", 33, 1001), ("huge_row", 2, 1048583),
    ("mid", 129, 4099), ("odd_prime_width", 3, 65537), ("big_row", 4, 393217), ("one_row", 1, 7),
]
F32, BF16 = torch.float32, torch.bfloat16
TIMING = [("8192x16384_fp32", 8192, 16384, F32), ("32768x4096_bf16", 32768, 4096, BF16),
          ("16384x32768_bf16", 16384, 32768, BF16), ("4096x393216_fp32", 4096, 393216, F32)]
# register variants of fast_v4 per timing class: (variant ids, width it covers, dtype)
VARIANTS = {0: ([1, 2, 3, 4, 5, 6], 16384, F32), 1: ([11, 12, 13, 14, 15, 16, 17], 4096, BF16),
            2: ([18, 19, 21, 22, 23, 24, 25, 26], 32768, BF16), 3: ([31, 32, 33, 37, 38], 393216, F32),
            4: ([41, 42, 43], 786432, BF16)}  # 3, 4: long rows in register segments (4: correctness only)
MULTI_CTA_PERSISTENT = {13, 14, 15, 16}  # persistent variants with > 1 CTA/SM: sweep CTAs per SM
AUTO = {0: 1, 1: 17, 2: 18, 3: 37, 4: 43}  # kAuto* in fast_v4.py (these also get all four hint modes)
HINTS = {1: "plain", 2: "ldcs", 3: "stcs", 4: "cs/cs"}
# Variant classes to check and time (--classes; children inherit it through the environment).
CLASSES = {int(c) for c in os.environ.get("BENCH_CLASSES", "0,1,2,3,4").split(",") if c}


def load_module(name):
    """Imports solutions/softmax/<name>.py, built in the harness's build directory (reused when
    `python3 -m harness build` already built it)."""
    path = Path(ROOT, "solutions", "softmax", f"{name}.py")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from harness.build import prepare_build_env
    from harness.problem import load_module as import_file
    prepare_build_env(path, "softmax")
    return import_file(path, f"softmax_{name}")


def draw(batch, dim, dtype, seed, special=False, misalign=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    scale = SCALES[seed % len(SCALES)] * (0.9 + 0.2 * ((seed * 0.618) % 1.0))
    offset = ((seed * 0.377) % 1.0 * 2 - 1) * 60.0
    n = batch * dim + (1 if misalign else 0)
    x = (torch.randn(n, device="cuda", generator=g) * scale + offset).to(dtype)
    x = (x[1:] if misalign else x).view(batch, dim)
    if special:
        x[:, ::5] = float("-inf")  # threads whose whole slice may be -inf
        x[min(3, batch - 1)] = float("-inf")  # all -inf row: NaN in torch
        if batch > 5:
            x[5, dim // 2] = float("inf")  # +inf: NaN row in torch
        if batch > 7:
            x[7, dim - 1] = float("nan")
    return x


def cases(quick):
    """[(label, make_input, variant, hint)], same order in parent and children."""
    out = []
    for i, (sname, b, d) in enumerate(SHAPES):
        for dtype in (F32, BF16):
            out.append((f"{sname} {b}x{d} {str(dtype)[6:]}", functools.partial(draw, b, d, dtype, 100 + i), 0, 0))
    for dtype in (F32, BF16):
        tag = str(dtype)[6:]
        for b, d in ((64, 16384), (40, 4096), (9, 32768), (5, 4000), (4, 393216)):
            out.append((f"misaligned {b}x{d} {tag}", functools.partial(draw, b, d, dtype, b + d, False, True), 0, 0))
        for b, d in ((16, 16384), (16, 4096), (16, 32768), (16, 393216)):
            out.append((f"special {b}x{d} {tag}", functools.partial(draw, b, d, dtype, 7, True), 0, 0))
    for c, (ids, width, dtype) in VARIANTS.items():
        if c not in CLASSES:
            continue
        tag = str(dtype)[6:]
        n = 16 // (4 if dtype == F32 else 2)
        for v in ids:
            hints = (1, 3) if width > 65536 else (1,) if quick else (1, 4)
            for h in hints:
                full = 64 if width > 65536 else 1000  # long rows: 64 rows are already 1.5 GB of float64 reference
                for b, d, sp in ((full, width, False), (37, width - 3 * n, True), (3, width // 2 + n, False)):
                    out.append((f"v{v} h{h} {b}x{d} {tag}{' special' if sp else ''}",
                                functools.partial(draw, b, d, dtype, v * 10 + h + b, sp), v, h))
    return out


def poison(nbytes):
    junk = torch.full((nbytes // 4 + 16,), float("nan"), device="cuda")
    del junk


def compare(y, x):
    dtype = x.dtype
    atol, rtol, l2tol = TOL[dtype]
    if not isinstance(y, torch.Tensor) or y.shape != x.shape or y.dtype != x.dtype or y.device != x.device:
        return False, f"bad output {getattr(y, 'shape', None)} {getattr(y, 'dtype', None)}"
    rows_per = max(1, (1 << 26) // max(1, x.shape[-1]))
    max_abs = sq_diff = sq_ref = 0.0
    nbad = 0
    for r0 in range(0, x.shape[0], rows_per):
        want = torch.softmax(x[r0:r0 + rows_per].double(), dim=-1)
        got = y[r0:r0 + rows_per].double()
        if not torch.equal(torch.isnan(got), torch.isnan(want)):
            return False, f"NaN positions differ (rows {r0}+: {int(got.isnan().sum())} NaN vs {int(want.isnan().sum())})"
        if not torch.equal(torch.isinf(got), torch.isinf(want)):
            return False, f"inf positions differ (rows {r0}+)"
        fin = torch.isfinite(want)
        diff = (got - want).abs().where(fin, torch.zeros_like(got))
        ref = want.abs().where(fin, torch.zeros_like(want))
        max_abs = max(max_abs, float(diff.max()))
        sq_diff += float((diff * diff).sum())
        sq_ref += float((ref * ref).sum())
        nbad += int((diff > atol + rtol * ref).sum())
    l2 = math.sqrt(sq_diff) / math.sqrt(sq_ref) if sq_ref > 0 else 0.0
    ok = nbad == 0 and l2 <= l2tol
    return ok, f"abs {max_abs:.2e} l2 {l2:.2e}" + ("" if ok else f" ({nbad} out of tol)")


def child_correct(start, quick):
    ext = load_module("fast_v4")._ext
    for i, (label, make, v, h) in enumerate(cases(quick)):
        if i < start:
            continue
        try:
            x = make()
            x_before = x.clone()
            poison(x.numel() * x.element_size())
            y = ext.softmax_fast_v4(x, v, h, 0)
            torch.cuda.synchronize()
            ok, msg = (False, "input was modified") if not torch.equal(x.nan_to_num(), x_before.nan_to_num()) else compare(y, x)
            del x, x_before, y
        except Exception as e:
            print(f"CASE {i} FAIL {label:40s} EXCEPTION {str(e)[:300]!r}", flush=True)
            sys.exit(3)  # CUDA errors are sticky: the parent restarts after this case
        print(f"CASE {i} {'PASS' if ok else 'FAIL'} {label:40s} {msg}", flush=True)
        torch.cuda.empty_cache()


def timing_impls(si, mods, quick):
    """[(name, fn)] for timing shape si."""
    out = []
    if "fast" in mods:
        out.append(("fast", mods["fast"].ModelNew()))
    if "fast_v4" in mods:
        ext = mods["fast_v4"]._ext
        mk = lambda v, h, c: (lambda x: ext.softmax_fast_v4(x, v, h, c))
        out.append(("v4 auto", mk(0, 0, 0)))
        for v in VARIANTS[si][0]:
            hints = (3,) if TIMING[si][2] > 65536 else (1,) if quick else ((1, 2, 3, 4) if v == AUTO[si] else (1, 4))
            for h in hints:
                out.append((f"v4 v{v} {HINTS[h]}", mk(v, h, 0)))
            if v in MULTI_CTA_PERSISTENT and not quick:
                for c in (2, 4, 6):
                    out.append((f"v4 v{v} plain cps{c}", mk(v, 1, c)))
    out.append(("eager", lambda x: torch.softmax(x, dim=-1)))
    try:
        from quack.softmax import softmax_fwd
        out.append(("quack", softmax_fwd))
    except Exception:
        pass
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
        out.append(("liger", LigerSoftmaxFunction.apply))
    except Exception:
        pass
    return out


def child_timing(names, skip, quick):
    import triton.testing
    mods = {}
    for n in names:
        try:
            mods[n] = load_module(n)
        except Exception as e:
            print(f"TERR 0 load:{n} {str(e)[:150]!r}", flush=True)
    for si, (sname, b, d, dtype) in enumerate(TIMING):
        if si not in CLASSES:
            continue
        try:
            x = draw(b, d, dtype, seed=11)
            ref = torch.softmax(x.float(), dim=-1)
        except Exception as e:
            print(f"TERR {si} input {str(e)[:150]!r}", flush=True)
            continue
        for iname, fn in timing_impls(si, mods, quick):
            key = f"{si}:{iname.replace(' ', '_')}"
            if key in skip:
                continue
            print(f"TSTART {key}", flush=True)
            try:
                err = float((fn(x).float() - ref).abs().max())
                note = "" if err <= 2 * TOL[dtype][0] else f"MISMATCH({err:.1e})"
                ms = triton.testing.do_bench(lambda: fn(x), warmup=25, rep=100, return_mode="median")
                print(f"TIME {key} {ms:.5f} {note}", flush=True)
            except Exception as e:
                print(f"TERR {key} {str(e)[:150]!r}", flush=True)
                if "CUDA" in str(e) or "cuda" in str(e):
                    sys.exit(3)
        del x, ref
        torch.cuda.empty_cache()


def spawn(args, on_line, hang_s=HANG_S):
    cmd = [sys.executable, os.path.abspath(__file__)] + args
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)
    lines = queue.Queue()
    threading.Thread(target=lambda: ([lines.put(l) for l in proc.stdout], lines.put(None)), daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=hang_s)
        except queue.Empty:
            proc.kill()
            proc.wait()
            return proc.returncode, True
        if line is None:
            return proc.wait(), False
        on_line(line.rstrip("\n"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer hint/CTA variants")
    ap.add_argument("--child", choices=["correct", "timing"])
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--names", default="fast,fast_v4")
    ap.add_argument("--skip", default="")
    ap.add_argument("--classes", help="variant classes to check and time, e.g. 3,4 (default: all)")
    args = ap.parse_args()
    if args.classes:
        os.environ["BENCH_CLASSES"] = args.classes
        CLASSES.clear()
        CLASSES.update(int(c) for c in args.classes.split(","))
    if args.child == "correct":
        return child_correct(args.start, args.quick)
    if args.child == "timing":
        return child_timing([n for n in args.names.split(",") if n], set(args.skip.split(",")), args.quick)

    t0 = time.time()
    failures, built = [], []
    with ThreadPoolExecutor(3) as pool:
        futs = {n: pool.submit(load_module, n) for n in args.names.split(",") if n}
    for n, f in futs.items():
        try:
            f.result()
            built.append(n)
            print(f"built {n}.py ({time.time() - t0:.0f}s)", flush=True)
        except Exception as e:
            failures.append(f"{n}: build failed")
            print(f"BUILD FAILED {n}.py: {e!r}", flush=True)
            traceback.print_exception(type(e), e, e.__traceback__)
    qa = ["--quick"] if args.quick else []

    print("\n== correctness (fast_v4) ==", flush=True)
    all_cases = cases(args.quick)
    k = 0
    while "fast_v4" in built and k < len(all_cases):
        state = {"next": k}

        def on_line(line, state=state):
            if line.startswith("CASE "):
                _, idx, verdict, rest = (line.split(" ", 3) + [""])[:4]
                state["next"] = int(idx) + 1
                if verdict == "FAIL" or not args.quick:
                    print(f"  {verdict} {rest}", flush=True)
                if verdict == "FAIL":
                    failures.append(all_cases[int(idx)][0].replace(" ", "/"))
            else:
                print(f"    | {line}", flush=True)

        rc, hung = spawn(["--child", "correct", "--start", str(k)] + qa, on_line)
        k = state["next"]
        if (rc != 0 and rc != 3) or hung:
            if k < len(all_cases):
                why = f"HANG > {HANG_S}s" if hung else f"CRASH rc={rc}"
                print(f"  FAIL {all_cases[k][0]:40s} {why}", flush=True)
                failures.append(f"{all_cases[k][0].replace(' ', '/')}({why})")
            k += 1
    print(f"  ({len(all_cases)} cases, {time.time() - t0:.0f}s so far)", flush=True)

    print("\n== timing (median ms, L2 flushed; % of 4.24 TB/s read+write) ==", flush=True)
    results, skip = {}, set()
    for _ in range(8):
        last = {}

        def on_line(line, last=last):
            p = line.split(" ")
            if p[0] == "TSTART":
                last["key"] = p[1]
            elif p[0] == "TIME":
                results[p[1]] = (float(p[2]), " ".join(p[3:]))
                skip.add(p[1])
            elif p[0] == "TERR":
                print(f"  {p[1]} failed: {' '.join(p[2:])}", flush=True)
                skip.add(p[1])
            else:
                print(f"    | {line}", flush=True)

        n_before = len(skip)
        rc, hung = spawn(["--child", "timing", "--names", ",".join(built), "--skip", ",".join(sorted(skip))] + qa,
                         on_line, hang_s=150)
        if rc == 0 and not hung:
            break
        why = "hung" if hung else f"died rc={rc}"
        if "key" in last and last["key"] not in skip:
            print(f"  timing child {why} in {last['key']}; skipping it", flush=True)
            skip.add(last["key"])
            if "v4" in last["key"]:
                failures.append(f"timing {last['key']} {why}")
        if len(skip) == n_before:
            print(f"  timing child {why}; no further timing", flush=True)
            break
    for si, (sname, b, d, dtype) in enumerate(TIMING):
        nbytes = 2 * b * d * (4 if dtype == F32 else 2)
        rows = [(k.split(":", 1)[1].replace("_", " "), ms, note) for k, (ms, note) in results.items()
                if k.split(":", 1)[0] == str(si)]
        if not rows:
            continue
        best_other = min([ms for n, ms, _ in rows if n in ("quack", "liger")] or [float("nan")])
        print(f"  {sname}  floor {nbytes / PEAK_BW * 1e3:.4f} ms")
        ours = sorted([r for r in rows if r[0].startswith("v4")], key=lambda r: r[1])
        for n, ms, note in [r for r in rows if not r[0].startswith("v4")] + ours:
            pct = 100 * nbytes / (ms * 1e-3) / PEAK_BW
            vs = f"{best_other / ms:6.3f}x" if best_other == best_other else ""
            print(f"    {n:22s} {ms:8.4f} ms {pct:5.1f}%  vs best ext {vs} {note}")
            if note and n.startswith("v4"):
                failures.append(f"{sname}/{n.replace(' ', '_')} timing mismatch")
        if ours:
            print(f"    -> best v4: {ours[0][0]} {ours[0][1]:.4f} ms")
    print(f"\n(total {time.time() - t0:.0f}s)")
    print("ALL CORRECT" if not failures else "FAILURES: " + ", ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
