#!/usr/bin/env python3
"""Check and time solutions/cross_entropy/fast_v4.py (row segments in registers, last-arriver merge).

    python3 benchmarks/bench_ce_v4.py [--no-sweep] [--no-externals]

1. Builds fast_v3.py and fast_v4.py (in parallel).
2. Correctness of fast_v4 (child process, restarted after a crash or hang, so one bad case cannot hide
   the others): every problem.yaml shape in float32 AND bfloat16 (auto variant), logits randn * scale +
   offset (scale 0.5..8, offset -60..60), float64 reference, the problem's tolerances; misaligned
   storage offsets; x[:, 1:] views; tiny losses (target = row max, also in multi-segment rows); NaN
   logit, -inf logits, out-of-range targets (-> NaN); determinism (two calls bit-identical); inputs
   unmodified; workspace memory poisoned with NaN before every call; cached counters / sentinel
   buffers left in their idle state (0 / -1); both ways of fusing the mean (tickets, poll); and every
   variant x load hint on aligned shapes that exercise one/many segments per row and per CTA.
3. Timing (child process, same restart rule) of the 4 timing shapes with triton.testing.do_bench
   (warmup=25, rep=100, median, L2 flushed): eager, fast_v3 default, fast_v4 auto (also with tickets
   and with fresh counters per call), every variant x hint in poll mode and every variant with plain
   loads in ticket mode (each result checked against the float64 reference before it is timed), quack
   and Liger if importable. Table per shape with % of 4.24 TB/s, best v4 setting per shape.
Last line: ALL CORRECT or FAILURES: ...
"""
import argparse
import functools
import importlib.util
import math
import os
import queue
import re
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
PEAK_BPS = 4.24e12
HANG_S = 90
F32, BF16 = torch.float32, torch.bfloat16


def _load_path(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Helpers shared with the v3 bench: SHAPES, TOL, DT, draw, compare, misaligned, poison_small_pool.
B3 = _load_path("bench_ce_v3_helpers", ROOT / "benchmarks" / "bench_ce_v3.py")
SHAPES, TOL, DT = B3.SHAPES, B3.TOL, B3.DT
draw, compare, misaligned = B3.draw, B3.compare, B3.misaligned
TIMING = [(M, C, dt) for M, C, dt, timing in SHAPES if timing]
HINTS = {1: "plain", 2: "nc", 3: "nc256"}
TICK, POLL, FRESH = 8, 16, 4  # fast_v4 flags: mean by tickets / by polling published values; fresh buffers


def load_solution(name):
    return _load_path(f"ce_{name}", ROOT / "solutions" / "cross_entropy" / f"{name}.py")


def variants(mod):
    """{id: (threads, vpt, minb, rows)} and the scalar config, parsed from the kernel source."""
    vs = {int(a): tuple(int(b) for b in rest) for a, *rest in
          re.findall(r"X\((\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\)", mod._kernel_src)}
    sc = tuple(int(a) for a in re.search(r"CE_V4_SCALAR_CFG\s+(\d+),\s*(\d+),\s*(\d+),\s*(\d+)", mod._kernel_src).groups())
    auto = {k: int(v) for k, v in re.findall(r"(kAuto\w+) = (\d+);", mod._host_src)}
    return vs, sc, auto


# Variant ids, known without building (the parent needs the case list); checked against the source.
VARIANT_IDS = list(range(1, 10))


def ref_loss(x, t):
    """float64 mean cross-entropy, in row chunks (bounded memory); t must be in range."""
    M, C = x.shape
    step = max(1, (1 << 27) // max(C, 1))
    tot = 0.0
    for r0 in range(0, M, step):
        tot += F.cross_entropy(x[r0:r0 + step].double(), t[r0:r0 + step], reduction="sum").item()
    return tot / M


def ws_elems(mod, M, C, dtype, variant, aligned, flags=0):
    """Float elements of the kernel's per-call workspace (so the poison block has the same size)."""
    vs, sc, auto = variants(mod)
    mode = (flags >> 3) & 3 or auto["kAutoMean"]
    E = 2 if dtype == BF16 else 4
    if aligned:
        U = C * E // 16
        v = variant
        if v == 0:
            if dtype == BF16:
                v = auto["kAutoBf16Mid"] if U <= 4096 else auto["kAutoBf16Long"]
            else:
                v = auto["kAutoF32Short"] if U <= 2048 else auto["kAutoF32Long"]
        th, vpt, _, rows = vs[v]
    else:
        U = C
        th, vpt, _, rows = sc
    seg = th // rows * vpt
    P = -(-U // seg)
    nch = -(-M // 256)
    return (2 * nch + M if mode == 1 else 0) + ((2 * M * P + M) if P > 1 else 0)


def poison(n):
    """Freed blocks full of NaN (and small int32 -1 blocks): an unwritten workspace shows up."""
    junk = torch.full((max(n, 1),), float("nan"), device="cuda")
    del junk
    B3.poison_small_pool()


def v4fn(mod, variant=0, flags=0):
    return lambda x, t: mod.run(x, t, variant, flags)


# ------------------------------------------------------------------ correctness cases
# Each case: (label, function(mod) -> (why, info)); why == "" means PASS.

def run_one(mod, fn, x, t, dtype, want=None, check_inputs=True, variant=0, flags=0):
    aligned = (x.shape[1] * x.element_size()) % 16 == 0 and x.is_contiguous() and x.data_ptr() % 16 == 0
    if want is None:
        want = ref_loss(x, t)
    x0, t0 = (x.clone(), t.clone()) if check_inputs else (None, None)
    poison(ws_elems(mod, x.shape[0], x.shape[1], dtype, variant if aligned else 0, aligned, flags))
    torch.cuda.synchronize()
    out = fn(x, t)
    torch.cuda.synchronize()
    why, info = compare(out, want, dtype)
    if not why and check_inputs and not (torch.equal(x0.isnan(), x.isnan()) and
                                         torch.equal(x0.nan_to_num(0.0), x.nan_to_num(0.0))):
        why = "logits were modified"
    if not why and check_inputs and not torch.equal(t0, t):
        why = "targets were modified"
    return why, info


def case_shape(M, C, dtype, trial, off, variant, flags, mod):
    x, t, _, _ = draw(M, C, dtype, trial)
    if off:
        x = misaligned(x, off)
    return run_one(mod, v4fn(mod, variant, flags), x, t, dtype, check_inputs=M * C <= (1 << 28), variant=variant,
                   flags=flags)


def case_tiny(M, C, dtype, variant, flags, mod):
    x, t, _, _ = draw(M, C, dtype, 4, scale=8.0, offset=-37.0)
    t = x.float().argmax(dim=1)
    if C >= 1024:  # make the target dominate a long row too (loss ~1e-30..1e-5)
        x[torch.arange(M, device="cuda"), t] += 200.0
    return run_one(mod, v4fn(mod, variant, flags), x, t, dtype, variant=variant, flags=flags)


def case_special(M, C, dtype, kind, variant, flags, mod):
    x, t, _, _ = draw(M, C, dtype, 1)
    want = None
    if kind == "nan":
        x[M // 2, C // 3] = float("nan")
    elif kind == "neginf":  # some -inf logits (targets among them give +inf losses)
        x[:, ::7] = float("-inf")
    elif kind == "oob":  # out-of-range targets: NaN (F.cross_entropy would assert, so no reference)
        t[M // 3] = C
        t[-1] = -1
        want = float("nan")
    elif kind == "slice":
        x = x[:, 1:]
        t = t.clamp(max=C - 2)
    elif kind == "slice_contig":
        x = x[:, 1:].contiguous()
        t = t.clamp(max=C - 2)
    elif kind == "noncontig":
        x = x.t().contiguous().t()
    return run_one(mod, v4fn(mod, variant, flags), x, t, dtype, want=want, variant=variant, flags=flags)


def case_determinism(M, C, dtype, variant, mod):
    x, t, _, _ = draw(M, C, dtype, 4)
    res = []
    for flags in (POLL, TICK):
        fn = v4fn(mod, variant, flags)
        a = fn(x, t)
        fn(x[: M // 3 + 1], t[: M // 3 + 1])
        v4fn(mod, 2 if variant != 2 else 1, POLL + TICK - flags)(x, t)
        b = fn(x, t)
        torch.cuda.synchronize()
        if not torch.equal(a, b):
            return f"not deterministic (flags {flags}): {a.item()!r} != {b.item()!r}", ""
        res.append(a.item())
    return "", f"{res[0]:.7g} twice (poll), {res[1]:.7g} twice (tickets)"


def idle_state_bad(mod):
    """Cached buffers must be back to all 0 (counters) / all -1 (sentinels) after every launch."""
    bad = {f"cnt{k}": int(c.count_nonzero()) for k, c in mod._counters.items() if int(c.count_nonzero())}
    bad.update({f"sent{k}": int((c != -1).sum()) for k, c in mod._sentinels.items() if int((c != -1).sum())})
    return bad


def case_counters(mod):
    for flags in (POLL, TICK):
        for M, C, dt in ((300, 32000, F32), (7, 65537, F32), (513, 4096, BF16), (1, 5, F32)):
            x, t, _, _ = draw(M, C, dt, 2)
            v4fn(mod, 0, flags)(x, t)
    torch.cuda.synchronize()
    bad = idle_state_bad(mod)
    return (f"cached buffers not reset: {bad}" if bad else ""), "counters all 0, sentinels all -1"


def cases(sweep):
    out = []
    # problem.yaml shapes, both dtypes, auto; the timing shapes once, the others with 3 scales and two
    # storage offsets, and once with the other way of fusing the mean (tickets).
    for M, C, ydt, timing in SHAPES:
        for dtype in (ydt, BF16 if ydt == F32 else F32):
            for trial in ([4] if timing else [0, 2, 4]):
                out.append((f"{M}x{C} {DT[dtype]} trial {trial}",
                            functools.partial(case_shape, M, C, dtype, trial, 0, 0, 0)))
            out.append((f"{M}x{C} {DT[dtype]} tickets", functools.partial(case_shape, M, C, dtype, 1, 0, 0, TICK)))
            if not timing:
                for off in (1, 3):
                    out.append((f"{M}x{C} {DT[dtype]} storage+{off}",
                                functools.partial(case_shape, M, C, dtype, 1, off, 0, 0)))
    for dtype in (F32, BF16):
        d = DT[dtype]
        for M, C in ((4, 2), (5, 3), (64, 17), (8, 4096), (3, 32000), (2, 131072)):
            for fl in (0, TICK):
                out.append((f"tiny loss {M}x{C} {d} f{fl}", functools.partial(case_tiny, M, C, dtype, 0, fl)))
        for M, C, off in ((64, 4096, 1), (33, 32000, 3), (5, 8, 1), (3, 64, 7), (17, 12345, 5), (2, 128256, 1)):
            out.append((f"misaligned {M}x{C}+{off} {d}", functools.partial(case_shape, M, C, dtype, 2, off, 0, 0)))
        for kind in ("nan", "neginf", "oob", "slice", "slice_contig", "noncontig"):
            for M, C in ((16, 32000), (300, 4096)):
                for fl in (0, TICK):
                    out.append((f"{kind} {M}x{C} {d} f{fl}", functools.partial(case_special, M, C, dtype, kind, 0, fl)))
        out.append((f"3x1 {d}", functools.partial(case_shape, 3, 1, dtype, 0, 0, 0, 0)))
        out.append((f"2200x3000 {d}", functools.partial(case_shape, 2200, 3000, dtype, 1, 0, 0, 0)))
        for fl in (FRESH, FRESH + TICK, FRESH + POLL):
            out.append((f"fresh buffers 1000x32000 {d} f{fl}",
                        functools.partial(case_shape, 1000, 32000, dtype, 3, 0, 0, fl)))
        out.append((f"determinism 4096x32000 {d}", functools.partial(case_determinism, 4096, 32000, dtype, 0)))
    if sweep:
        # Every variant, aligned rows, both mean modes: short rows (one partial segment), exactly one
        # segment of the short variants, several uneven segments, long rows with many segments, M not a
        # multiple of the segments per CTA, chunk boundaries (257, 513 rows); hints 2 and 3 on one shape.
        for v in VARIANT_IDS:
            for dtype in (F32, BF16):
                d = DT[dtype]
                for M, C in ((257, 1000), (129, 4096), (37, 32000), (5, 128256), (2, 400000)):
                    for fl in (POLL, TICK):
                        out.append((f"v{v} {M}x{C} {d} f{fl}",
                                    functools.partial(case_shape, M, C, dtype, v % 5, 0, v, fl)))
                for h in (2, 3):
                    out.append((f"v{v} h{h} 513x8192 {d}", functools.partial(case_shape, 513, 8192, dtype, 3, 0, v, h)))
                out.append((f"v{v} tiny loss 3x32000 {d}", functools.partial(case_tiny, 3, 32000, dtype, v, 0)))
                out.append((f"v{v} nan 16x32000 {d}", functools.partial(case_special, 16, 32000, dtype, "nan", v, 0)))
                out.append((f"v{v} oob 16x32000 {d}", functools.partial(case_special, 16, 32000, dtype, "oob", v, TICK)))
            out.append((f"v{v} determinism 1000x32000 fp32", functools.partial(case_determinism, 1000, 32000, F32, v)))
    out.append(("cached buffers back to idle", case_counters))
    return out


def child_correct(start, sweep):
    mod = load_solution("fast_v4")
    vs, sc, auto = variants(mod)
    if sorted(vs) != VARIANT_IDS:
        print(f"CASE {start} FAIL variant table {sorted(vs)} != bench's {VARIANT_IDS}", flush=True)
    for i, (label, fn) in enumerate(cases(sweep)):
        if i < start:
            continue
        try:
            t0 = time.time()
            why, info = fn(mod)
            if time.time() - t0 > 20:
                info += f" (slow: {time.time() - t0:.0f}s)"
        except Exception as e:
            print(f"CASE {i} FAIL {label:44s} EXCEPTION {type(e).__name__}: {str(e)[:300]!r}", flush=True)
            sys.exit(3)  # CUDA errors are sticky: the parent restarts after this case
        print(f"CASE {i} {'FAIL' if why else 'PASS'} {label:44s} {why or info}", flush=True)
        torch.cuda.empty_cache()


# ------------------------------------------------------------------ timing

def timing_impls(mods, sweep, externals):
    out = [("eager", lambda x, t: F.cross_entropy(x, t))]
    if "fast_v3" in mods:
        out.append(("v3 default", mods["fast_v3"].ModelNew()))
    if "fast_v4" in mods:
        m4 = mods["fast_v4"]
        out.append(("v4 auto", m4.ModelNew()))
        out.append(("v4 auto tick", v4fn(m4, 0, TICK)))
        out.append(("v4 auto poll", v4fn(m4, 0, POLL)))
        out.append(("v4 auto fresh", v4fn(m4, 0, FRESH)))
        if sweep:
            for v in VARIANT_IDS:
                for h in HINTS:
                    out.append((f"v4 v{v} {HINTS[h]} poll", v4fn(m4, v, h + POLL)))
                out.append((f"v4 v{v} plain tick", v4fn(m4, v, 1 + TICK)))
    if externals:
        # The harness's adapters (they add the .mean() / dtype cast the reference output needs).
        ext = _load_path("ce_externals", ROOT / "problems" / "cross_entropy" / "externals.py")
        for name, mod_name, fn in (("quack", "quack.cross_entropy", ext.quack_cross_entropy),
                                   ("liger", "liger_kernel.ops.cross_entropy", ext.liger_cross_entropy)):
            try:
                importlib.import_module(mod_name)
                out.append((name, fn))
            except Exception as e:
                print(f"{name} not importable ({type(e).__name__}): skipped", flush=True)
    return out


def child_timing(names, skip, sweep, externals):
    import triton.testing
    mods = {}
    for n in names:
        try:
            mods[n] = load_solution(n)
        except Exception as e:
            print(f"TERR load:{n} {str(e)[:150]!r}", flush=True)
    impls = timing_impls(mods, sweep, externals)
    for si, (M, C, dtype) in enumerate(TIMING):
        try:
            x, t, _, _ = draw(M, C, dtype, 0)
            want = ref_loss(x, t)
        except Exception as e:
            print(f"TERR {si}:input {str(e)[:150]!r}", flush=True)
            continue
        for name, fn in impls:
            key = f"{si}:{name.replace(' ', '_')}"
            if key in skip:
                continue
            print(f"TSTART {key}", flush=True)
            try:
                why, _ = compare(fn(x, t), want, dtype)
                note = f"MISMATCH({why[:60].replace(' ', '_')})" if why else ""
                ms = triton.testing.do_bench(lambda: fn(x, t), warmup=25, rep=100, return_mode="median")
                print(f"TIME {key} {ms:.5f} {note}", flush=True)
            except Exception as e:
                print(f"TERR {key} {str(e)[:150]!r}", flush=True)
                if "CUDA" in str(e) or "cuda" in str(e):
                    sys.exit(3)
        if "fast_v4" in mods:
            bad = idle_state_bad(mods["fast_v4"])
            if bad:
                print(f"TERR {si}:counters {str(bad).replace(' ', '')}", flush=True)
        del x, t
        torch.cuda.empty_cache()


# ------------------------------------------------------------------ parent

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
    ap.add_argument("--no-sweep", action="store_true", help="auto variant only (no variant x hint sweep)")
    ap.add_argument("--no-externals", action="store_true", help="skip quack and Liger")
    ap.add_argument("--child", choices=["correct", "timing"])
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--names", default="fast_v3,fast_v4")
    ap.add_argument("--skip", default="")
    args = ap.parse_args()
    sweep = not args.no_sweep
    if args.child == "correct":
        return child_correct(args.start, sweep)
    if args.child == "timing":
        return child_timing([n for n in args.names.split(",") if n], set(args.skip.split(",")), sweep,
                            not args.no_externals)

    t0 = time.time()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    failures, built = [], []
    names = [n for n in args.names.split(",") if n]
    with ThreadPoolExecutor(len(names)) as pool:
        futs = {n: pool.submit(load_solution, n) for n in names}
    for n, f in futs.items():
        try:
            f.result()
            built.append(n)
            print(f"built {n}.py ({time.time() - t0:.0f}s)", flush=True)
        except Exception as e:
            print(f"BUILD FAILED {n}.py beside the others ({type(e).__name__}); retrying alone", flush=True)
            try:
                load_solution(n)
                built.append(n)
            except Exception as e2:
                failures.append(f"{n}: build failed")
                print(f"BUILD FAILED {n}.py: {str(e2)[-3000:]}", flush=True)
    extra = (["--no-sweep"] if not sweep else []) + (["--no-externals"] if args.no_externals else [])

    print("\n== correctness (fast_v4) ==", flush=True)
    all_cases = cases(sweep)
    k = 0
    while "fast_v4" in built and k < len(all_cases):
        state = {"next": k}

        def on_line(line, state=state):
            if line.startswith("CASE "):
                _, idx, verdict, rest = (line.split(" ", 3) + [""])[:4]
                state["next"] = int(idx) + 1
                print(f"  {verdict} {rest}", flush=True)
                if verdict == "FAIL":
                    failures.append(all_cases[int(idx)][0].replace(" ", "_"))
            else:
                print(f"    | {line}", flush=True)

        rc, hung = spawn(["--child", "correct", "--start", str(k)] + extra, on_line)
        k = state["next"]
        if (rc != 0 and rc != 3) or hung:
            if k < len(all_cases):
                why = f"HANG > {HANG_S}s" if hung else f"CRASH rc={rc}"
                print(f"  FAIL {all_cases[k][0]:44s} {why}", flush=True)
                failures.append(f"{all_cases[k][0].replace(' ', '_')}({why})")
            k += 1
    print(f"  ({len(all_cases)} cases, {time.time() - t0:.0f}s so far)", flush=True)

    print("\n== timing (median ms, L2 flushed; % of 4.24 TB/s) ==", flush=True)
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
                if "v4" in p[1] or "counters" in p[1]:
                    failures.append(f"timing {p[1]} error")
            else:
                print(f"    | {line}", flush=True)

        n_before = len(skip)
        rc, hung = spawn(["--child", "timing", "--names", ",".join(built), "--skip", ",".join(sorted(skip))] + extra,
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

    for si, (M, C, dtype) in enumerate(TIMING):
        nbytes = M * C * (4 if dtype == F32 else 2) + 8 * M
        rows = [(k.split(":", 1)[1].replace("_", " "), ms, note) for k, (ms, note) in results.items()
                if k.split(":", 1)[0] == str(si)]
        if not rows:
            continue
        ref = {n: ms for n, ms, _ in rows}
        others = [ref[n] for n in ("quack", "liger") if n in ref]
        best_ext = min(others) if others else None
        print(f"  {M}x{C} {DT[dtype]}  floor {nbytes / PEAK_BPS * 1e3:.4f} ms  ({nbytes / 1e9:.3f} GB)")
        ours = sorted([r for r in rows if r[0].startswith("v4")], key=lambda r: r[1])
        for n, ms, note in [r for r in rows if not r[0].startswith("v4")] + ours:
            pct = 100 * nbytes / (ms * 1e-3) / PEAK_BPS
            ve = f"eager/{ref['eager'] / ms:5.2f}x" if "eager" in ref else ""
            vq = f"best-ext/{best_ext / ms:6.3f}x" if best_ext else ""
            print(f"    {n:22s} {ms:8.4f} ms {pct:6.1f}%  {ve} {vq} {note}")
            if note and n.startswith("v4"):
                failures.append(f"{M}x{C}_{DT[dtype]}/{n.replace(' ', '_')}_{note}")
        ok = [r for r in ours if not r[2]]
        if ok:
            print(f"    -> best v4: {ok[0][0]} {ok[0][1]:.4f} ms")
    print(f"\n(total {time.time() - t0:.0f}s)")
    print("ALL CORRECT" if not failures else "FAILURES: " + ", ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
