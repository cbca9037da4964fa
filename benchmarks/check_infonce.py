"""Standalone correctness + timing check of the InfoNCE solutions (run on the GPU machine, from the repo root):

    python3 benchmarks/check_infonce.py [--quick] [--sol fast] [--no-timing]

Imports solutions/infonce/{simple,fast}.py by path, checks every problem.yaml shape (plus misaligned / odd
extras) against a float64 reference with the problem's fp32 tolerance (atol 1e-4, rtol 1e-4, rel L2 1e-5),
with inputs rescaled per trial like the harness does, poisoned freed memory, an input-unchanged check and a
repeat-call determinism check; then times the timing shapes with triton.testing.do_bench (median, L2
flushed) against torch eager.  Ends with `ALL CORRECT` or `FAILURES: ...`.
"""
import argparse
import importlib.util
import os
import sys
import time
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOLUTIONS = ["simple", "fast"]
TOL = dict(atol=1e-4, rtol=1e-4, rel_l2=1e-5)
SCALES = [0.5, 0.8, 1.0, 1.25, 2.0]  # problem.yaml vary_inputs.scales (args 0, 1, 2)
COPY_BW = 4.24e12
TARGETS_MS = {"256x512_n2560": 0.0152, "4096x1024_n65536": 10.9}

# name, B, D, N, T, use   (problem.yaml shapes first, then extras that exercise other code paths)
SHAPES = [
    ("256x512_n2560", 256, 512, 2560, 0.1, "ct"),
    ("4096x1024_n65536", 4096, 1024, 65536, 0.1, "tC"),  # C: one correctness trial, skipped with --quick
    ("one_query", 1, 1000, 65537, 0.1, "c"),
    ("tiny", 3, 3, 7, 0.1, "c"),
    ("one_negative", 17, 65, 1, 0.1, "c"),
    ("odd_sizes", 33, 129, 1001, 0.1, "c"),
    ("cold_temperature", 64, 256, 4099, 0.05, "c"),
    ("wide_features", 130, 2048, 3001, 0.1, "c"),
    # extras (fast.py's tile choice in brackets): other code paths, ragged tiles, misaligned bases
    ("x_misaligned_d64", 300, 64, 5000, 0.1, "cm"),   # [128x128, 4-byte loads, S=40]
    ("x_bigtile_1024x256", 1024, 256, 16384, 0.1, "c"),  # [128x128, 16-byte loads, S=16]
    ("x_bigtile_d255", 1000, 255, 20000, 0.1, "c"),   # [128x128, 4-byte loads, S=16]
    ("x_d4_many_rows", 1000, 4, 333, 0.1, "c"),       # [64x80, 16-byte loads, S=5]
    ("x_big_b_small_n", 2049, 96, 130, 0.07, "c"),    # [64x80, 16-byte loads, S=2]
]


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def set_consts(mod, B, D, N, T):
    for k, v in dict(BATCH_SIZE=B, FEATURE_DIM=D, N_NEGATIVES=N, TEMPERATURE=T).items():
        if hasattr(mod, k):
            setattr(mod, k, v)


def draw(ref, B, D, N, T, seed, misalign=False):
    """Inputs the way the harness draws them: seed's normalised vectors, each arg rescaled per trial."""
    set_consts(ref, B, D, N, T)
    torch.manual_seed(seed)
    with torch.device("cuda"):
        raw = list(ref.get_inputs())
    g = torch.Generator().manual_seed(seed ^ 0x5EED)
    out = []
    for i, x in enumerate(raw):
        jitter = 0.9 + 0.2 * torch.rand((), generator=g).item()
        torch.rand((), generator=g)  # the harness also draws an offset (0 here)
        x = (x.float() * (SCALES[(seed + i) % len(SCALES)] * jitter)).contiguous()
        if misalign:  # same values, storage offset of one float: contiguous but 4-byte aligned only
            buf = torch.empty(x.numel() + 1, device=x.device, dtype=x.dtype)
            buf[1:].copy_(x.view(-1))
            x = buf[1:].view(x.shape)
        out.append(x)
    return out


def reference64(ref, T, inputs):
    ref.TEMPERATURE = T
    model = ref.Model().to(torch.float64)
    with torch.no_grad():
        return model(*[x.double() for x in inputs])


def poison():
    """Fill some freed caching-allocator blocks with 0xFF (NaN) so unwritten outputs show up."""
    for n in (512, 1 << 12, 1 << 16, 1 << 20, 1 << 23):
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        t.fill_(0xFF)
        del t


def compare(got, want):
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != torch.float32 or not got.is_cuda:
        return False, f"bad output {type(got)} {getattr(got, 'shape', None)} {getattr(got, 'dtype', None)}", 0, 0, 0
    g, w = got.double(), want.double()
    if torch.isnan(g).any() or torch.isnan(w).any():
        ok = bool(torch.equal(torch.isnan(g), torch.isnan(w)))
        return ok, "NaN", float("nan"), float("nan"), float("nan")
    diff = (g - w).abs()
    max_abs = float(diff.max())
    max_rel = float((diff / w.abs().clamp_min(1e-30)).max())
    rel_l2 = float(torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(w).clamp_min(1e-300))
    ok = bool((diff <= TOL["atol"] + TOL["rtol"] * w.abs()).all()) and rel_l2 <= TOL["rel_l2"]
    return ok, "", max_abs, max_rel, rel_l2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1 trial per shape, fewer timing reps")
    ap.add_argument("--sol", nargs="*", default=SOLUTIONS, help="solution files to check (default: simple fast)")
    ap.add_argument("--no-timing", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    trials = 1 if args.quick else 3
    t_start = time.time()
    failures = []

    ref = load(os.path.join(ROOT, "problems", "infonce", "reference.py"), "infonce_reference")
    mods = {}
    for name in args.sol:
        t0 = time.time()
        try:
            mods[name] = load(os.path.join(ROOT, "solutions", "infonce", f"{name}.py"), f"infonce_sol_{name}")
            print(f"built {name} in {time.time() - t0:.1f}s", flush=True)
        except Exception as e:  # noqa: BLE001
            failures.append(f"{name}: build ({type(e).__name__})")
            print(f"BUILD FAILED {name}: {e}", flush=True)
            traceback.print_exc()

    print(f"\n{'shape':<20}{'sol':<8}{'trial':>5}{'ref':>13}{'got':>13}{'max_abs':>10}{'max_rel':>10}{'rel_l2':>10}  verdict")
    for (sname, B, D, N, T, use) in SHAPES:
        if "c" not in use and ("C" not in use or args.quick):
            continue
        for trial in range(trials if "c" in use else 1):
            seed = 1000 + 17 * trial
            try:
                inputs = draw(ref, B, D, N, T, seed, misalign="m" in use)
                want = reference64(ref, T, inputs)
                copies = [x.clone() for x in inputs]
            except Exception as e:  # noqa: BLE001
                failures.append(f"{sname}: reference ({type(e).__name__})")
                print(f"{sname}: reference failed: {e}", flush=True)
                continue
            for name, mod in mods.items():
                try:
                    set_consts(mod, B, D, N, T)
                    model = mod.ModelNew()
                    poison()
                    got = model(*inputs)
                    torch.cuda.synchronize()
                    ok, why, ma, mr, l2 = compare(got, want)
                    if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
                        ok, why = False, why + " inputs modified"
                    again = model(*inputs)  # exercises the counter reset; must be bit-identical
                    if not torch.equal(again, got):
                        ok, why = False, why + f" not deterministic ({float(again)} vs {float(got)})"
                    verdict = "PASS" if ok else f"FAIL {why}"
                    print(f"{sname:<20}{name:<8}{trial:>5}{float(want):>13.7g}{float(got):>13.7g}"
                          f"{ma:>10.2e}{mr:>10.2e}{l2:>10.2e}  {verdict}", flush=True)
                    if not ok:
                        failures.append(f"{sname}/{name}/t{trial}")
                except Exception as e:  # noqa: BLE001
                    failures.append(f"{sname}/{name}/t{trial}: {type(e).__name__}")
                    print(f"{sname:<20}{name:<8}{trial:>5}  ERROR {type(e).__name__}: {e}", flush=True)
                    try:
                        torch.cuda.synchronize()
                    except Exception:  # noqa: BLE001
                        pass

    # ---- timing
    tt = None
    if not args.no_timing:
        try:
            import triton.testing as tt
        except Exception as e:  # noqa: BLE001
            print(f"triton unavailable ({e}); skipping timing")
    if tt is not None:
        print(f"\n{'shape':<20}{'impl':<8}{'ms':>10}{'GB/s':>9}{'%copy':>7}{'TFLOP/s':>9}{'vs eager':>9}  target")
        for (sname, B, D, N, T, use) in SHAPES:
            if "t" not in use:
                continue
            try:
                inputs = draw(ref, B, D, N, T, 7)
                nbytes = (2 * B * D + N * D) * 4
                flops = 2 * B * D * N
                ref.TEMPERATURE = T
                set_consts(ref, B, D, N, T)
                eager = ref.Model()
                impls = [("eager", lambda: eager(*inputs))]
                for name, mod in mods.items():
                    set_consts(mod, B, D, N, T)
                    m = mod.ModelNew()
                    impls.append((name, (lambda m=m: m(*inputs))))
                big = N * B > 1e8
                t_eager = None
                for name, fn in impls:
                    try:
                        fn()
                        torch.cuda.synchronize()
                        ms = tt.do_bench(fn, warmup=25 if big else 100, rep=(150 if big else 300) if not args.quick else 60,
                                         return_mode="median")
                    except Exception as e:  # noqa: BLE001
                        print(f"{sname:<20}{name:<8}  ERROR {type(e).__name__}: {e}", flush=True)
                        failures.append(f"timing {sname}/{name}: {type(e).__name__}")
                        continue
                    if name == "eager":
                        t_eager = ms
                    tgt = ""
                    if name == "fast" and sname in TARGETS_MS:
                        tgt = f"<= {TARGETS_MS[sname]} ms: {'MET' if ms <= TARGETS_MS[sname] else 'MISSED'}"
                    print(f"{sname:<20}{name:<8}{ms:>10.4f}{nbytes / ms / 1e6:>9.0f}{100 * nbytes / ms / 1e-3 / COPY_BW:>6.1f}%"
                          f"{flops / ms / 1e9:>9.1f}{(t_eager / ms if t_eager else float('nan')):>8.2f}x  {tgt}", flush=True)
            except Exception as e:  # noqa: BLE001
                failures.append(f"timing {sname}: {type(e).__name__}")
                print(f"{sname}: timing failed: {e}", flush=True)
                traceback.print_exc()

    print(f"\n(total {time.time() - t_start:.0f}s)")
    print("ALL CORRECT" if not failures else "FAILURES: " + ", ".join(failures))


if __name__ == "__main__":
    main()
