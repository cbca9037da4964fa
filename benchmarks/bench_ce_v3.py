#!/usr/bin/env python3
"""Check and time solutions/cross_entropy/fast_v3.py (default: the pieces schedule; `v3 ring` and the sweep: its
TMA bulk-copy ring, flags bit 4) against fast.py, eager and quack.

    python3 benchmarks/bench_ce_v3.py [--no-sweep] [--no-quack]

1. Builds fast.py and fast_v3.py.
2. Correctness of fast_v3 (default knobs): every problem.yaml shape in float32 and bfloat16, logits
   randn * scale + offset (scale 0.5..8, offset -60..60), float64 reference with the problem's
   tolerances; plus tiny losses (target = row max), misaligned storage offsets, x[:, 1:] views made
   contiguous, a non-contiguous input, a NaN logit, determinism, unmodified inputs, poisoned memory.
3. Timing (triton do_bench, warmup=25, rep=100, median, L2 flushed) of the 4 timing shapes: eager,
   fast.py default and wpr=1, fast_v3 default and ring, quack (if importable).
4. Sweep of fast_v3's ring knobs (stages, chunk bytes, warps per CTA, flags) on the timing shapes; every
   config's result is also checked against the float64 reference and on two misaligned odd shapes.
Last line: ALL CORRECT or FAILURES: ...
"""
import argparse
import importlib.util
import math
import sys
import threading
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
PEAK_BPS = 4.24e12
TOL = {torch.float32: (1e-4, 1e-4, 1e-4), torch.bfloat16: (1e-2, 1e-2, 1e-2)}
SCALES = [0.5, 1.0, 2.0, 4.0, 8.0]
OFFSET = 60.0
F32, BF16 = torch.float32, torch.bfloat16
DT = {F32: "fp32", BF16: "bf16"}

# (M, C, yaml dtype, timing?) -- problems/cross_entropy/problem.yaml
SHAPES = [
    (8192, 32000, F32, True), (32768, 4096, F32, True), (4096, 128256, BF16, True), (32768, 32000, BF16, True),
    (1, 1000, F32, False), (5, 3, F32, False), (4, 2, F32, False), (7, 65537, F32, False), (333, 1001, F32, False),
    (2, 1048583, F32, False), (129, 4099, BF16, False), (3, 65537, BF16, False), (16, 128257, BF16, False),
    (1, 7, BF16, False),
]
# fast_v3 knob sweep: (stages, chunk bytes, warps per CTA, flags). Ring per CTA = W * S * CB;
# flags bit 0 = no L2 evict_first hint, bit 1 = no proxy fence before a refill; the sweep adds bit 4 (RING: the
# ring schedule; since 2026-12-02 the default is the pieces schedule).
# Flags 1 (no hint) has been the default since the first sweep (the hint cost 2-4%), so every ring is timed with it.
RING = 16
SWEEP = [
    (3, 4096, 8, 1),    # the first default: 96 KB/CTA, 2 CTAs/SM, 16 warps/SM
    (3, 4096, 8, 3),    # the first default without the proxy fence too
    (3, 4096, 8, 0),    # the first default with the evict_first hint (the first version)
    (6, 2048, 8, 1),    # 96 KB, finer refills
    (2, 6144, 8, 1),    # 96 KB, two 6 KB copies per warp
    (4, 2048, 8, 1),    # 64 KB, 3 CTAs/SM, 24 warps/SM
    (2, 4096, 8, 1),    # 64 KB, 3 CTAs/SM
    (8, 2048, 4, 1),    # 64 KB, 3 CTAs/SM, 12 warps/SM
    (5, 4096, 4, 1),    # 80 KB, 2 CTAs/SM, 8 warps/SM, 20 KB per warp
    (6, 4096, 4, 1),    # 96 KB, 2 CTAs/SM, 8 warps/SM, 24 KB per warp
    (3, 8192, 4, 1),    # 96 KB, 2 CTAs/SM, 8 warps/SM
    (2, 8192, 8, 1),    # 128 KB, 1 CTA/SM: the default since the sixth session (benchmarks/standalone)
    (2, 8192, 8, 3),    # the default without the proxy fence
    (3, 4096, 16, 1),   # 192 KB, 1 CTA/SM, 16 warps
    (3, 16384, 2, 1),   # 96 KB, 2 CTAs/SM, 4 warps/SM, 16 KB copies
]

failures = []
# A fast_v3 call that takes seconds means a ring wait hit its 2 s hang guard (a schedule bug): stop
# calling it so the script still finishes in time.
ABORT = []


def fail(what):
    failures.append(what)
    print(f"  FAIL {what}", flush=True)


def load(name):
    path = ROOT / "solutions" / "cross_entropy" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"ce_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    t0 = time.time()
    spec.loader.exec_module(mod)
    print(f"loaded {name}.py in {time.time() - t0:.1f}s", flush=True)
    return mod


def draw(M, C, dtype, trial, scale=None, offset=None):
    g = torch.Generator(device="cuda").manual_seed(4321 + 17 * trial + M + C)
    x = torch.randn(M, C, device="cuda", generator=g)
    t = torch.randint(0, max(C, 1), (M,), device="cuda", generator=g)
    rg = torch.Generator().manual_seed(trial)
    if scale is None:
        scale = SCALES[trial % len(SCALES)] * (0.9 + 0.2 * torch.rand((), generator=rg).item())
    if offset is None:
        offset = (2 * torch.rand((), generator=rg).item() - 1) * OFFSET
    x.mul_(scale).add_(offset)
    return x.to(dtype).contiguous(), t, scale, offset


def poison_small_pool():
    # Freed blocks full of 0xFF (NaN): an output that is never written shows up as NaN.
    junk = [torch.full((256,), -1, dtype=torch.int32, device="cuda") for _ in range(64)]
    del junk


def reference(x, t):
    return F.cross_entropy(x.double(), t).item()


def compare(out, want, dtype):
    """'' if out matches the float64 reference value `want`, else the reason; plus an error summary."""
    if type(out) is not torch.Tensor:
        return f"returned {type(out)}", ""
    if out.shape != torch.Size([]) or out.dtype != dtype or not out.is_cuda:
        return f"got shape {tuple(out.shape)} {out.dtype} {out.device}, want () {dtype} cuda", ""
    got = out.double().item()
    if math.isnan(want) or math.isnan(got):
        return ("" if math.isnan(want) and math.isnan(got) else f"NaN mismatch got {got} want {want}"), f"got {got}"
    if math.isinf(want) or math.isinf(got):
        return ("" if got == want else f"inf mismatch got {got} want {want}"), f"got {got}"
    atol, rtol, rl2 = TOL[dtype]
    err = abs(got - want)
    rel = err / max(abs(want), 1e-30)
    info = f"got {got:.7g} want {want:.7g} rel {rel:.1e}"
    if err > atol + rtol * abs(want):
        return f"outside atol/rtol: {info}", info
    if (rel if want != 0 else err) > rl2:
        return f"rel L2 {rel:.2e} > {rl2:g}: {info}", info
    return "", info


def run_case(fn, x, t, dtype, label, check_inputs=True, want=None):
    if ABORT:
        return "skipped"
    try:
        x0, t0 = (x.clone(), t.clone()) if check_inputs else (None, None)
        want = reference(x, t) if want is None else want
        poison_small_pool()
        torch.cuda.synchronize()
        t_call = time.time()
        out = fn(x, t)
        torch.cuda.synchronize()
        if time.time() - t_call > 1.5:
            ABORT.append(label)
            fail(f"{label}: call took {time.time() - t_call:.1f}s (hang guard fired?): skipping the rest")
        why, info = compare(out, want, dtype)
        if not why and check_inputs and not (torch.equal(x0.isnan(), x.isnan()) and
                                             torch.equal(x0.nan_to_num(0.0), x.nan_to_num(0.0))):
            why = "logits were modified"
        if not why and check_inputs and not torch.equal(t0, t):
            why = "targets were modified"
        if why:
            fail(f"{label}: {why}")
        return info
    except Exception as e:  # one failing case must not stop the others
        fail(f"{label}: {type(e).__name__}: {str(e)[:300]}")
        traceback.print_exc(limit=2)
        return "error"


def misaligned(x, off):
    """Same values, storage offset `off` elements (row starts not 16-byte aligned)."""
    M, C = x.shape
    base = torch.empty(M * C + off, dtype=x.dtype, device="cuda")
    xv = base[off:].view(M, C)
    xv.copy_(x)
    return xv


def correctness(v3):
    print("== fast_v3 correctness (default knobs)", flush=True)
    for M, C, ydt, timing in SHAPES:
        for dtype in (ydt, BF16 if ydt == F32 else F32):
            trials = [0, 4] if timing else [0, 1, 2, 3, 4]  # trial % 5 == 4 -> scale 8
            for trial in trials:
                try:
                    x, t, sc, off = draw(M, C, dtype, trial)
                except Exception as e:
                    fail(f"draw {M}x{C}: {e}")
                    continue
                label = f"{M}x{C} {DT[dtype]} sc {sc:.2f} off {off:+.1f}"
                info = run_case(v3, x, t, dtype, label, check_inputs=not timing)
                print(f"  {label:44s} {info}", flush=True)
                if not timing and trial == 1:  # storage offset: unaligned rows / heads / tails
                    for o in (1, 3):
                        run_case(v3, misaligned(x, o), t, dtype, f"{label} storage+{o}")
                del x, t
        torch.cuda.empty_cache()

    print("== fast_v3 edge cases", flush=True)
    for dtype in (F32, BF16):
        d = DT[dtype]
        for M, C in ((4, 2), (5, 3), (64, 17), (8, 4096), (3, 32000)):  # target = row max: loss ~1e-4..1e-8
            x, t, _, _ = draw(M, C, dtype, 4, scale=8.0, offset=-37.0)
            t = x.float().argmax(dim=1)
            if C >= 4096:  # make the target dominate a long row too
                x[torch.arange(M, device="cuda"), t] += 200.0
            run_case(v3, x, t, dtype, f"tiny loss {M}x{C} {d}")
        for M, C, off in ((64, 4096, 1), (33, 32000, 3), (5, 8, 1), (3, 64, 7), (17, 12345, 5)):
            x, t, _, _ = draw(M, C, dtype, 2)
            run_case(v3, misaligned(x, off), t, dtype, f"misaligned {M}x{C}+{off} {d}")
        x, t, _, _ = draw(300, 4097, dtype, 3)
        run_case(v3, x[:, 1:].contiguous(), t.clamp(max=4095), dtype, f"x[:,1:].contiguous() 300x4096 {d}")
        run_case(v3, x[:, 1:], t.clamp(max=4095), dtype, f"x[:,1:] view 300x4096 {d}")
        x, t, _, _ = draw(257, 1000, dtype, 3)
        run_case(v3, x.t().contiguous().t(), t, dtype, f"non-contiguous 257x1000 {d}")
        x, t, _, _ = draw(16, 5000, dtype, 1)
        x[3, 123] = float("nan")
        run_case(v3, x, t, dtype, f"NaN logit {d}")
        x, t, _, _ = draw(2200, 3000, dtype, 1)  # more rows than one row per resident warp, short rows
        run_case(v3, x, t, dtype, f"2200x3000 {d}")
        try:
            x, t, _, _ = draw(4096, 32000, dtype, 4)
            a = v3(x, t)
            v3(x[:100], t[:100])
            b = v3(x, t)
            if not torch.equal(a, b):
                fail(f"determinism {d}: {a.item()} != {b.item()}")
        except Exception as e:
            fail(f"determinism {d}: {type(e).__name__}: {e}")
    torch.cuda.empty_cache()


def quack_fn():
    try:
        from quack.cross_entropy import cross_entropy_fwd
    except Exception as e:
        print(f"quack not importable ({type(e).__name__}): skipped", flush=True)
        return None

    def f(x, t):
        r = cross_entropy_fwd(x, t)
        return (r[0] if isinstance(r, tuple) else r).mean()
    return f


def bench(fn):
    from triton.testing import do_bench
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def timing_and_sweep(fast, v3mod, use_quack, do_sweep):
    print("== timing (median ms, L2 flushed)", flush=True)
    q = quack_fn() if use_quack else None
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    best = {}
    for M, C, dtype, is_timing in SHAPES:
        if not is_timing:
            continue
        shape = f"{M}x{C} {DT[dtype]}"
        try:
            x, t, _, _ = draw(M, C, dtype, 0)
            want = reference(x, t)
        except Exception as e:
            fail(f"timing setup {shape}: {e}")
            continue
        nbytes = M * C * x.element_size() + M * 8
        impls = [("eager", lambda: F.cross_entropy(x, t))]
        if fast is not None:
            cf = fast._counter(x.device)
            impls.append(("fast", lambda: fast._ext.cross_entropy_fast(x, t, cf, 0, 0)))
            impls.append(("fast wpr=1", lambda: fast._ext.cross_entropy_fast(x, t, cf, 1, 0)))
        c3 = v3mod._counter(x.device)
        impls.append(("v3 default", lambda: v3mod._ext.cross_entropy_fast_v3(x, t, c3, 0, 0, 0, 0, 0)))
        impls.append(("v3 ring", lambda: v3mod._ext.cross_entropy_fast_v3(x, t, c3, 0, 0, 0, 0, 1 | RING)))
        if q is not None:
            impls.append(("quack", lambda: q(x, t)))
        res = {}
        for name, fn in impls:
            try:
                ms = bench(fn)
                res[name] = ms
            except Exception as e:
                print(f"  {shape:18s} {name:24s} error {type(e).__name__}: {str(e)[:120]}", flush=True)
                if name.startswith("v3"):
                    fail(f"{name} timing {shape}: {type(e).__name__}")
        if do_sweep:
            for cfg in SWEEP:
                S, CB, W, fl = cfg
                name = f"v3 S{S} C{CB // 1024}K W{W} f{fl}"
                try:
                    out = v3mod._ext.cross_entropy_fast_v3(x, t, c3, S, CB, W, 0, fl | RING)
                    why, _ = compare(out, want, dtype)
                    if why:
                        fail(f"{name} {shape}: {why}")
                        name += " WRONG"
                    res[name] = bench(lambda: v3mod._ext.cross_entropy_fast_v3(x, t, c3, S, CB, W, 0, fl | RING))
                except Exception as e:
                    print(f"  {shape:18s} {name:24s} error {type(e).__name__}: {str(e)[:120]}", flush=True)
            for cfg in ((3, 4096, 8, sms), (3, 4096, 8, 3 * sms)):  # 1 CTA/SM; 3 per SM = two waves
                S, CB, W, ctas = cfg
                name = f"v3 default ctas={ctas}"
                try:
                    res[name] = bench(lambda: v3mod._ext.cross_entropy_fast_v3(x, t, c3, S, CB, W, ctas, 1 | RING))
                except Exception as e:
                    print(f"  {shape:18s} {name:24s} error {type(e).__name__}: {str(e)[:120]}", flush=True)
        base, qms = res.get("eager"), res.get("quack")
        for name, ms in res.items():
            gbs = nbytes / ms / 1e6
            ve = f"{base / ms:6.2f}x" if base else "     -"
            vq = f"{qms / ms:6.3f}x" if qms else "     -"
            print(f"  {shape:18s} {name:28s} {ms:8.4f} ms {100 * gbs * 1e9 / PEAK_BPS:6.1f}%  eager/{ve}  quack/{vq}",
                  flush=True)
        v3res = {k: v for k, v in res.items() if k.startswith("v3") and "WRONG" not in k}
        if v3res:
            k = min(v3res, key=v3res.get)
            best[shape] = (k, v3res[k], qms)
        del x, t
        torch.cuda.empty_cache()
    print("== best fast_v3 config per shape", flush=True)
    for shape, (k, ms, qms) in best.items():
        print(f"  {shape:18s} {k:28s} {ms:.4f} ms" + (f"  (quack {qms:.4f}, {qms / ms:.3f}x)" if qms else ""),
              flush=True)


def sweep_correctness(v3mod):
    """Every sweep config on odd, misaligned shapes (different row geometry per row)."""
    print("== sweep configs on misaligned odd shapes", flush=True)
    cases = []
    for M, C, dtype, off in ((333, 1001, F32, 1), (129, 4099, BF16, 1), (3, 65537, F32, 3), (2100, 2051, BF16, 3)):
        x, t, _, _ = draw(M, C, dtype, 1)
        xv = misaligned(x, off)
        cases.append((xv, t, dtype, reference(xv, t), f"{M}x{C}+{off} {DT[dtype]}"))
    for cfg in SWEEP:
        S, CB, W, fl = cfg
        for xv, t, dtype, want, label in cases:
            fn = lambda a, b: v3mod._ext.cross_entropy_fast_v3(a, b, v3mod._counter(a.device), S, CB, W, 0, fl | RING)
            run_case(fn, xv, t, dtype, f"cfg {cfg} {label}", check_inputs=False, want=want)
    print("  done", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-quack", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    fast = v3mod = None
    # Build both extensions concurrently (separate names and build dirs; the compilers are
    # subprocesses); if fast_v3 fails that way, build it again alone before giving up.
    built = {}

    def build_fast():
        try:
            built["fast"] = load("fast")
        except Exception as e:
            print(f"fast.py did not build/import: {type(e).__name__}: {str(e)[-1000:]}", flush=True)

    th = threading.Thread(target=build_fast)
    th.start()
    try:
        v3mod = load("fast_v3")
    except Exception as e:
        print(f"fast_v3.py build failed beside fast.py ({type(e).__name__}); retrying alone", flush=True)
    th.join()
    fast = built.get("fast")
    if v3mod is None:
        try:
            v3mod = load("fast_v3")
        except Exception as e:
            fail(f"fast_v3.py did not build/import: {type(e).__name__}: {str(e)[-3000:]}")
    if v3mod is not None:
        model = v3mod.ModelNew()
        steps = [lambda: correctness(model)]
        if not args.no_sweep:
            steps.append(lambda: sweep_correctness(v3mod))
        steps.append(lambda: timing_and_sweep(fast, v3mod, not args.no_quack, not args.no_sweep))
        for step in steps:
            if ABORT:
                break
            try:
                step()
            except Exception as e:
                fail(f"step crashed: {type(e).__name__}: {e}")
                traceback.print_exc()
            print(f"  ({time.time() - t0:.0f}s)", flush=True)
    print(f"({time.time() - t0:.0f}s)")
    print("ALL CORRECT" if not failures else "FAILURES: " + "; ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
