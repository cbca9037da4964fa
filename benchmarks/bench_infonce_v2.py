"""Correctness + knob sweep + timing of solutions/infonce/fast_v2.py against fast.py and eager (GPU, repo root):

    python3 benchmarks/bench_infonce_v2.py [--quick]

Correctness: every problem.yaml shape plus odd / misaligned extras, 3 trials each, float64 reference, the
problem's fp32 tolerance (atol 1e-4, rtol 1e-4, relative error 1e-5), inputs unchanged, output poisoned
memory, bit-identical repeat call; fast_v2 in auto mode and with every knob setting (mode, ks).
Timing at both timing shapes: triton do_bench (median, L2 flushed by do_bench) and the harness's way
(per call: write 256 MB, CUDA events around the call, median of 200 calls).  Ends with ALL CORRECT or FAILURES.
"""
import argparse
import importlib.util
import os
import statistics
import sys
import time
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = dict(atol=1e-4, rtol=1e-4, rel_l2=1e-5)
SCALES = [0.5, 0.8, 1.0, 1.25, 2.0]
COPY_BW = 4.24e12
# (mode, ks): 0/0 = auto; mode 1 = fast.py's big kernel; mode 2 = cluster kernel with ks CTAs per cluster
VARIANTS = [(0, 0), (1, 0), (2, 0), (2, 1), (2, 2), (2, 4), (2, 8)]

# name, B, D, N, T, flags (c: correctness, t: timing, C: one correctness trial (big), m: misaligned base)
SHAPES = [
    ("256x512_n2560", 256, 512, 2560, 0.1, "ct"),
    ("4096x1024_n65536", 4096, 1024, 65536, 0.1, "tC"),
    ("one_query", 1, 1000, 65537, 0.1, "c"),
    ("tiny", 3, 3, 7, 0.1, "c"),
    ("one_negative", 17, 65, 1, 0.1, "c"),
    ("odd_sizes", 33, 129, 1001, 0.1, "c"),
    ("cold_temperature", 64, 256, 4099, 0.05, "c"),
    ("wide_features", 130, 2048, 3001, 0.1, "c"),
    ("x_misaligned_d64", 300, 64, 5000, 0.1, "cm"),
    ("x_misaligned_seed", 256, 512, 2560, 0.1, "cm"),
    ("x_d255_ragged", 200, 255, 1999, 0.1, "c"),
    ("x_d40_ks_clamp", 129, 40, 321, 0.1, "c"),
    ("x_d4_many_rows", 1000, 4, 333, 0.1, "c"),
    ("x_big_b_small_n", 2049, 96, 130, 0.07, "c"),
    ("x_bigtile_1024x256", 1024, 256, 16384, 0.1, "c"),
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
    set_consts(ref, B, D, N, T)
    torch.manual_seed(seed)
    with torch.device("cuda"):
        raw = list(ref.get_inputs())
    g = torch.Generator().manual_seed(seed ^ 0x5EED)
    out = []
    for i, x in enumerate(raw):
        jitter = 0.9 + 0.2 * torch.rand((), generator=g).item()
        x = (x.float() * (SCALES[(seed + i) % len(SCALES)] * jitter)).contiguous()
        if misalign:  # storage offset of one float: contiguous but only 4-byte aligned
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
    for n in (512, 1 << 12, 1 << 16, 1 << 20, 1 << 23):
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        t.fill_(0xFF)
        del t


def compare(got, want):
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != torch.float32 or not got.is_cuda:
        return False, f"bad output {getattr(got, 'shape', None)} {getattr(got, 'dtype', None)}", 0.0, 0.0
    g, w = float(got), float(want)
    if g != g or w != w:
        return (g != g) == (w != w), "NaN", float("nan"), float("nan")
    err = abs(g - w)
    rel = err / max(abs(w), 1e-300)
    ok = err <= TOL["atol"] + TOL["rtol"] * abs(w) and rel <= TOL["rel_l2"]
    return ok, "", err, rel


def harness_time(fn, reps, flush_buf):
    """The harness's timing: per call an L2 flush (256 MB write), then CUDA events around the call."""
    fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for b, e in ev:
        flush_buf.fill_(0x5A5A5A5A)
        b.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(b.elapsed_time(e) for b, e in ev)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    trials = 1 if args.quick else 3
    t_start = time.time()
    failures = []
    ref = load(os.path.join(ROOT, "problems", "infonce", "reference.py"), "infonce_reference")
    mods = {}
    for name in ("fast", "fast_v2"):
        t0 = time.time()
        try:
            mods[name] = load(os.path.join(ROOT, "solutions", "infonce", f"{name}.py"), f"infonce_sol_{name}")
            print(f"built {name} in {time.time() - t0:.1f}s", flush=True)
        except Exception as e:  # noqa: BLE001
            failures.append(f"{name}: build ({type(e).__name__})")
            print(f"BUILD FAILED {name}: {e}", flush=True)
            traceback.print_exc()
    v2 = mods.get("fast_v2")

    def impls_for(B, D, N, T, big):
        """(label, fn(q, p, n)) for every implementation/knob under test."""
        out = []
        if "fast" in mods:
            set_consts(mods["fast"], B, D, N, T)
            m = mods["fast"].ModelNew()
            out.append(("fast", m))
        if v2 is not None:
            set_consts(v2, B, D, N, T)
            m2 = v2.ModelNew()
            out.append(("v2", m2))
            for mode, ks in VARIANTS[1:]:
                if big and mode == 2 and ks not in (0,):
                    continue
                out.append((f"v2 m{mode}k{ks}", (lambda q, p, n, mode=mode, ks=ks: v2.infonce(q, p, n, T, mode, ks))))
        return out

    print(f"\n{'shape':<20}{'impl':<11}{'t':>2}{'ref':>14}{'got':>14}{'abs_err':>10}{'rel_err':>10}  plan / verdict")
    for (sname, B, D, N, T, use) in SHAPES:
        if "c" not in use and ("C" not in use or args.quick):
            continue
        big = "C" in use
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
            for label, fn in impls_for(B, D, N, T, big):
                if big and label not in ("fast", "v2"):
                    continue
                try:
                    plan = ""
                    if label.startswith("v2") and v2 is not None:
                        mk = (0, 0) if label == "v2" else (int(label[4]), int(label[6:]))
                        plan = v2.plan(*inputs, *mk)
                    poison()
                    got = fn(*inputs)
                    torch.cuda.synchronize()
                    ok, why, ea, er = compare(got, want)
                    if not all(torch.equal(a, b) for a, b in zip(inputs, copies)):
                        ok, why = False, why + " inputs modified"
                    again = fn(*inputs)
                    if not torch.equal(again, got):
                        ok, why = False, why + f" not deterministic ({float(again)!r} vs {float(got)!r})"
                    print(f"{sname:<20}{label:<11}{trial:>2}{float(want):>14.8g}{float(got):>14.8g}{ea:>10.2e}{er:>10.2e}"
                          f"  {plan}  {'PASS' if ok else 'FAIL ' + why}", flush=True)
                    if not ok:
                        failures.append(f"{sname}/{label}/t{trial}")
                except Exception as e:  # noqa: BLE001
                    failures.append(f"{sname}/{label}/t{trial}: {type(e).__name__}")
                    print(f"{sname:<20}{label:<11}{trial:>2}  ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
                    try:
                        torch.cuda.synchronize()
                    except Exception:  # noqa: BLE001
                        pass

    try:
        import triton.testing as tt
    except Exception as e:  # noqa: BLE001
        tt = None
        print(f"triton unavailable ({e}); do_bench column skipped")
    try:
        import quack  # noqa: F401
        print("quack importable, but it has no InfoNCE op: not compared")
    except Exception:  # noqa: BLE001
        print("quack not importable: skipped")
    flush_buf = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    print(f"\n{'shape':<20}{'impl':<11}{'do_bench ms':>12}{'harness ms':>11}{'%copy':>7}{'TFLOP/s':>8}{'vs eager':>9}  plan")
    for (sname, B, D, N, T, use) in SHAPES:
        if "t" not in use:
            continue
        try:
            big = N * B > 1e8
            inputs = draw(ref, B, D, N, T, 7)
            nbytes = (2 * B * D + N * D) * 4
            flops = 2 * B * D * N
            ref.TEMPERATURE = T
            set_consts(ref, B, D, N, T)
            eager = ref.Model()
            impls = [("eager", eager)] + impls_for(B, D, N, T, big)
            base = None
            for label, fn in impls:
                try:
                    f = (lambda fn=fn: fn(*inputs))
                    plan = ""
                    if label.startswith("v2") and v2 is not None:
                        mk = (0, 0) if label == "v2" else (int(label[4]), int(label[6:]))
                        plan = v2.plan(*inputs, *mk)
                    f()
                    torch.cuda.synchronize()
                    db = float("nan")
                    if tt is not None:
                        db = tt.do_bench(f, warmup=25, rep=100, return_mode="median")
                    hm = harness_time(f, 30 if big else 200, flush_buf)
                    if label == "eager":
                        base = hm
                    print(f"{sname:<20}{label:<11}{db:>12.4f}{hm:>11.4f}{100 * nbytes / (hm * 1e-3) / COPY_BW:>6.1f}%"
                          f"{flops / hm / 1e9:>8.1f}{(base / hm if base else float('nan')):>8.2f}x  {plan}", flush=True)
                except Exception as e:  # noqa: BLE001
                    failures.append(f"timing {sname}/{label}: {type(e).__name__}")
                    print(f"{sname:<20}{label:<11}  ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
        except Exception as e:  # noqa: BLE001
            failures.append(f"timing {sname}: {type(e).__name__}")
            print(f"{sname}: timing failed: {e}", flush=True)
            traceback.print_exc()

    print(f"\n(total {time.time() - t_start:.0f}s)")
    print("ALL CORRECT" if not failures else "FAILURES: " + ", ".join(failures))


if __name__ == "__main__":
    main()
