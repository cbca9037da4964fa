#!/usr/bin/env python3
"""Check and time solutions/cross_entropy/{simple,fast,fast_v2}.py on a GPU (standalone, no harness).

    python3 benchmarks/check_cross_entropy.py [--quick] [--no-quack] [--only fast]

Correctness: every problem.yaml shape in float32 and bfloat16, logits drawn like the harness
(randn * scale*jitter + offset, scale in 0.5..8, offset in -60..60), compared with F.cross_entropy in
float64 (atol/rtol and relative L2, the problem's tolerances), plus edge cases: tiny losses (target is
the max), misaligned row starts, a non-contiguous input, a NaN logit, determinism, poisoned output
memory and unmodified inputs. Timing: the timing shapes with triton.testing.do_bench (median, L2
flushed) against eager F.cross_entropy and quack (when importable). Last line: ALL CORRECT or FAILURES.
"""
import argparse
import importlib.util
import math
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ["simple", "fast", "fast_v2"]
PEAK_BPS = 4.24e12
TOL = {torch.float32: (1e-4, 1e-4, 1e-5), torch.bfloat16: (1e-2, 1e-2, 1e-2)}
SCALES = [0.5, 1.0, 2.0, 4.0, 8.0]
OFFSET = 60.0
F32, BF16 = torch.float32, torch.bfloat16
DT = {F32: "fp32", BF16: "bf16"}

# (M, C, yaml dtype, timing?)
SHAPES = [
    (8192, 32000, F32, True), (32768, 4096, F32, True), (4096, 128256, BF16, True), (32768, 32000, BF16, True),
    (1, 1000, F32, False), (5, 3, F32, False), (4, 2, F32, False), (7, 65537, F32, False), (333, 1001, F32, False),
    (2, 1048583, F32, False), (129, 4099, BF16, False), (3, 65537, BF16, False), (16, 128257, BF16, False),
    (1, 7, BF16, False),
]

failures = []
MODULES = {}


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
    MODULES[name] = mod
    return mod.ModelNew()


def draw(M, C, dtype, trial, scale=None, offset=None):
    g = torch.Generator(device="cuda").manual_seed(1234 + 17 * trial + M + C)
    x = torch.randn(M, C, device="cuda", generator=g)
    t = torch.randint(0, max(C, 1), (M,), device="cuda", generator=g)
    rg = torch.Generator().manual_seed(trial)
    if scale is None:
        scale = SCALES[trial % len(SCALES)] * (0.9 + 0.2 * torch.rand((), generator=rg).item())
    if offset is None:
        offset = (2 * torch.rand((), generator=rg).item() - 1) * OFFSET
    return (x * scale + offset).to(dtype).contiguous(), t, scale, offset


def poison_small_pool():
    # Freed blocks full of 0xFF (NaN): an output that is never written shows up as NaN.
    junk = [torch.full((256,), -1, dtype=torch.int32, device="cuda") for _ in range(64)]
    del junk


def compare(out, x, t, dtype):
    """'' if out matches the float64 reference, else the reason; plus an error summary."""
    ref = F.cross_entropy(x.double(), t)
    if type(out) is not torch.Tensor:
        return f"returned {type(out)}", ""
    if out.shape != ref.shape or out.dtype != torch.float32 or not out.is_cuda:  # float32 at bf16 too (problem.yaml)
        return f"got shape {tuple(out.shape)} {out.dtype} {out.device}, want () float32 cuda", ""
    got, want = out.double().item(), ref.item()
    if math.isnan(want) or math.isnan(got):
        return ("" if math.isnan(want) and math.isnan(got) else f"NaN mismatch got {got} want {want}"), f"got {got}"
    if math.isinf(want) or math.isinf(got):
        return ("" if got == want else f"inf mismatch got {got} want {want}"), f"got {got}"
    atol, rtol, rl2 = TOL[dtype]
    err = abs(got - want)
    rel = err / max(abs(want), 1e-30)
    info = f"got {got:.7g} want {want:.7g} abs {err:.2e} rel {rel:.2e}"
    if err > atol + rtol * abs(want):
        return f"outside atol/rtol: {info}", info
    if (rel if want != 0 else err) > rl2:
        return f"rel L2 {rel:.2e} > {rl2:g}: {info}", info
    return "", info


def run_case(name, model, x, t, dtype, label, check_inputs=True):
    try:
        x0, t0 = (x.clone(), t.clone()) if check_inputs else (None, None)
        poison_small_pool()
        out = model(x, t)
        torch.cuda.synchronize()
        why, info = compare(out, x, t, dtype)
        if not why and check_inputs and not (torch.equal(x0.isnan(), x.isnan()) and
                                             torch.equal(x0.nan_to_num(0.0), x.nan_to_num(0.0))):
            why = "logits were modified"
        if not why and check_inputs and not torch.equal(t0, t):
            why = "targets were modified"
        if why:
            fail(f"{name} {label}: {why}")
        return out
    except Exception as e:  # one failing case must not stop the others
        fail(f"{name} {label}: {type(e).__name__}: {e}")
        traceback.print_exc(limit=2)
        return None


def correctness(models, quick):
    print("== correctness", flush=True)
    for M, C, ydt, timing in SHAPES:
        for dtype in (ydt, BF16 if ydt == F32 else F32):
            if quick and dtype != ydt and timing:
                continue
            trials = [0, 4] if quick or timing else [0, 1, 2, 3, 4, 9]  # trial % 5 == 4 -> scale 8
            for trial in trials:
                x, t, sc, off = draw(M, C, dtype, trial)
                label = f"{M}x{C} {DT[dtype]} scale {sc:.2f} offset {off:+.1f}"
                infos = []
                for name, model in models.items():
                    out = run_case(name, model, x, t, dtype, label, check_inputs=not timing or not quick)
                    if out is not None:
                        infos.append(f"{name}: {compare(out, x, t, dtype)[1]}")
                print(f"  {label:46s} " + " | ".join(infos), flush=True)
                del x, t
        torch.cuda.empty_cache()


def edge_cases(models):
    print("== edge cases", flush=True)
    for name, model in models.items():
        for dtype in (F32, BF16):
            d = DT[dtype]
            # Target is the row max and the other logits are far below: loss ~1e-4..1e-8.
            for M, C in ((4, 2), (5, 3), (64, 17)):
                x, t, _, _ = draw(M, C, dtype, 4, scale=8.0, offset=-37.0)
                t = x.float().argmax(dim=1)
                run_case(name, model, x, t, dtype, f"tiny loss {M}x{C} {d}")
            # Row starts not 16-byte aligned (storage offset), widths that are vector multiples.
            for M, C, off in ((64, 4096, 1), (33, 32000, 3), (5, 8, 1), (3, 64, 7)):
                x, t, _, _ = draw(M, C, dtype, 2)
                base = torch.empty(M * C + off, dtype=dtype, device="cuda")
                xv = base[off:].view(M, C)
                xv.copy_(x)
                run_case(name, model, xv, t, dtype, f"misaligned {M}x{C}+{off} {d}")
            # Non-contiguous logits (column-major view).
            x, t, _, _ = draw(257, 1000, dtype, 3)
            run_case(name, model, x.t().contiguous().t(), t, dtype, f"non-contiguous 257x1000 {d}")
            # A NaN logit: the mean must be NaN.
            x, t, _, _ = draw(16, 5000, dtype, 1)
            x[3, 123] = float("nan")
            run_case(name, model, x, t, dtype, f"NaN logit {d}")
            # Deterministic (fixed-order reduction) and repeatable across calls with other grid sizes.
            try:
                x, t, _, _ = draw(4096, 32000, dtype, 4)
                a = model(x, t)
                model(x[:100], t[:100])
                b = model(x, t)
                if not torch.equal(a, b):
                    fail(f"{name} determinism {d}: {a.item()} != {b.item()}")
            except Exception as e:
                fail(f"{name} determinism {d}: {type(e).__name__}: {e}")
        print(f"  {name}: edge cases done", flush=True)
    torch.cuda.empty_cache()


def quack_fn():
    try:
        from quack.cross_entropy import cross_entropy_fwd
    except Exception:
        return None

    def f(x, t):
        r = cross_entropy_fwd(x, t)
        return (r[0] if isinstance(r, tuple) else r).mean()
    return f


def timing(models, use_quack):
    from triton.testing import do_bench
    print("== timing (median ms, L2 flushed)", flush=True)
    impls = {"eager": lambda x, t: F.cross_entropy(x, t)}
    impls.update({n: m for n, m in models.items()})
    q = quack_fn() if use_quack else None
    if q is not None:
        impls["quack"] = q
    print(f"  {'shape':22s} {'impl':7s} {'ms':>9s} {'GB/s':>8s} {'%4.24TB/s':>9s} {'vs eager':>8s}")
    for M, C, dtype, is_timing in SHAPES:
        if not is_timing:
            continue
        x, t, _, _ = draw(M, C, dtype, 0)
        nbytes = M * C * x.element_size() + M * 8
        base = None
        for name, fn in impls.items():
            try:
                fn(x, t)
                torch.cuda.synchronize()
                ms = do_bench(lambda: fn(x, t), warmup=25, rep=150, return_mode="median")
                base = ms if name == "eager" else base
                gbs = nbytes / ms / 1e6
                sp = f"{base / ms:7.2f}x" if base else "       -"
                print(f"  {M}x{C} {DT[dtype]:5s} {name:7s} {ms:9.4f} {gbs:8.0f} {100 * gbs * 1e9 / PEAK_BPS:8.1f}% {sp}",
                      flush=True)
            except Exception as e:
                print(f"  {M}x{C} {DT[dtype]:5s} {name:7s} error {type(e).__name__}: {str(e)[:120]}", flush=True)
                if name != "quack" and name != "eager":
                    fail(f"{name} timing {M}x{C}: {type(e).__name__}")
        del x, t
        torch.cuda.empty_cache()


def sweep():
    """fast.py launch-shape sweep (threads-per-row warps `wpr`, grid size) on the timing shapes."""
    from triton.testing import do_bench
    mod = MODULES.get("fast")
    if mod is None:
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print("== sweep fast.py (wpr, ctas): median ms", flush=True)
    for M, C, dtype, is_timing in SHAPES:
        if not is_timing:
            continue
        x, t, _, _ = draw(M, C, dtype, 0)
        cnt = mod._counter(x.device)
        ref = mod._ext.cross_entropy_fast(x, t, cnt, 0, 0)
        res = []
        for wpr in (0, 1, 2, 4, 8):
            for ctas in (0, 2 * sms, 3 * sms, 4 * sms, 8 * sms):
                if wpr and ctas:
                    continue
                try:
                    out = mod._ext.cross_entropy_fast(x, t, cnt, wpr, ctas)
                    ok = abs(out.double().item() - ref.double().item()) <= 1e-3 * abs(ref.double().item())
                    ms = do_bench(lambda: mod._ext.cross_entropy_fast(x, t, cnt, wpr, ctas), warmup=10, rep=60,
                                  return_mode="median")
                    res.append(f"({wpr},{ctas}){'' if ok else '!'} {ms:.4f}")
                except Exception as e:
                    res.append(f"({wpr},{ctas}) err {type(e).__name__}")
        print(f"  {M}x{C} {DT[dtype]}: " + "  ".join(res), flush=True)
        del x, t
        torch.cuda.empty_cache()


def sweep_v2():
    """fast_v2.py grid sweep: auto (balanced, all co-resident) against 1 CTA per SM and 3 CTAs per SM (2 waves)."""
    from triton.testing import do_bench
    mod = MODULES.get("fast_v2")
    if mod is None:
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print("== sweep fast_v2.py (ctas): median ms", flush=True)
    for M, C, dtype, is_timing in SHAPES:
        if not is_timing:
            continue
        x, t, _, _ = draw(M, C, dtype, 0)
        cnt = mod._counter(x.device)
        ref = mod._ext.cross_entropy_fast_v2(x, t, cnt, 0)
        res = []
        for ctas in (0, sms, 3 * sms):
            try:
                out = mod._ext.cross_entropy_fast_v2(x, t, cnt, ctas)
                ok = abs(out.double().item() - ref.double().item()) <= 1e-3 * abs(ref.double().item())
                ms = do_bench(lambda: mod._ext.cross_entropy_fast_v2(x, t, cnt, ctas), warmup=10, rep=60,
                              return_mode="median")
                res.append(f"({ctas}){'' if ok else '!'} {ms:.4f}")
            except Exception as e:
                res.append(f"({ctas}) err {type(e).__name__}")
        print(f"  {M}x{C} {DT[dtype]}: " + "  ".join(res), flush=True)
        del x, t
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer trials, timing-shape correctness in yaml dtype only")
    ap.add_argument("--no-quack", action="store_true")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--only", choices=SOLUTIONS)
    ap.add_argument("--sweep", action="store_true", help="also sweep fast.py's and fast_v2.py's launch shapes (~1 min)")
    args = ap.parse_args()
    t0 = time.time()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    models = {}
    for name in ([args.only] if args.only else SOLUTIONS):
        try:
            models[name] = load(name)
        except Exception as e:
            fail(f"{name}.py did not build/import: {type(e).__name__}: {str(e)[-2000:]}")
    if models:
        for step in (lambda: correctness(models, args.quick), lambda: edge_cases(models)):
            try:
                step()
            except Exception as e:
                fail(f"check crashed: {type(e).__name__}: {e}")
                traceback.print_exc()
        if not args.no_timing:
            try:
                timing(models, not args.no_quack)
            except Exception as e:
                fail(f"timing crashed: {type(e).__name__}: {e}")
                traceback.print_exc()
        if args.sweep:
            try:
                sweep()
                sweep_v2()
            except Exception as e:
                print(f"sweep crashed: {type(e).__name__}: {e}")
    print(f"({time.time() - t0:.0f}s)")
    print("ALL CORRECT" if not failures else "FAILURES: " + "; ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
