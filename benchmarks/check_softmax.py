"""Correctness + timing check for solutions/softmax/*.py (run on the GPU machine, from the repo root).

    python3 benchmarks/check_softmax.py [--quick]

Correctness: every problem.yaml shape in float32 and bfloat16 (--quick: each shape in its own dtype,
one trial), inputs drawn like the harness (randn * scale*jitter + offset, offset in +-60), compared
with a float64 reference (max abs, max rel, relative L2); outputs are poisoned (NaN-filled memory freed
just before the call) so unwritten elements show up; inputs must come back unchanged. Extra cases:
misaligned base pointer (scalar path), aligned rows that need clusters of 2..16, -inf masks, an
all -inf row. Timing: the timing shapes with triton.testing.do_bench (median, L2 flushed) for fast, fast_v2
(+ two values of fast's slice knob), simple, torch eager and quack (when importable).
Each solution runs in a child process restarted after a crash, a CUDA error or a hang (60 s; timing 150 s), so one
bad case cannot hide the others. Last line: ALL CORRECT or FAILURES: ...
"""
import argparse
import functools
import importlib.util
import math
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")  # what the harness sets on the H200

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEAK_BW = 4.24e12  # measured H200 device copy bandwidth (read + write), bytes/s
TOL = {torch.float32: (1e-4, 1e-4, 1e-5), torch.bfloat16: (1e-2, 1e-2, 1e-2)}
SCALES = [0.5, 1.0, 2.0, 4.0, 8.0]
HANG_S = 60

# (name, batch, dim, dtype listed in problem.yaml, timing?)
SHAPES = [
    ("8192x16384_fp32", 8192, 16384, torch.float32, True),
    ("4096x393216_fp32", 4096, 393216, torch.float32, True),
    ("32768x4096_bf16", 32768, 4096, torch.bfloat16, True),
    ("16384x32768_bf16", 16384, 32768, torch.bfloat16, True),
    ("one_row", 1, 1000, torch.float32, False),
    ("tiny", 5, 3, torch.float32, False),
    ("width_one", 3, 1, torch.float32, False),
    ("odd_prime_width", 7, 65537, torch.float32, False),
    ("not_vector_multiple", 33, 1001, torch.float32, False),
    ("huge_row", 2, 1048583, torch.float32, False),
    ("mid_bf16", 129, 4099, torch.bfloat16, False),
    ("odd_prime_width_bf16", 3, 65537, torch.bfloat16, False),
    ("big_row_bf16", 4, 393217, torch.bfloat16, False),
    ("one_row_bf16", 1, 7, torch.bfloat16, False),
]
TIMING = [s for s in SHAPES if s[4]]


# ---------------------------------------------------------------- inputs and comparison
def load_module(name):
    path = os.path.join(ROOT, "solutions", "softmax", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"softmax_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def draw(batch, dim, dtype, seed, scale=None, offset=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(batch, dim, device="cuda", generator=g)
    if scale is None:
        scale = SCALES[seed % len(SCALES)] * (0.9 + 0.2 * ((seed * 0.618) % 1.0))
    if offset is None:
        offset = ((seed * 0.377) % 1.0 * 2 - 1) * 60.0
    return (x * scale + offset).to(dtype).contiguous()


def misaligned(batch, dim, dtype, seed):
    flat = draw(1, batch * dim + 1, dtype, seed).view(-1)
    return flat[1:].view(batch, dim)  # contiguous, base pointer one element past 16-byte alignment


def masked(batch, dim, dtype, seed, keep):
    x = draw(batch, dim, dtype, seed)
    if keep is None:
        x[:, ::3] = float("-inf")
        x[min(5, batch - 1)] = float("-inf")  # a whole -inf row: NaN in the reference
    else:
        x[:, keep:] = float("-inf")  # cluster CTAs whose whole slice is -inf
    return x


def cases(quick):
    """[(label, make_input, big)] in a fixed order (parent and children enumerate the same list)."""
    out = []
    for sname, b, d, dt0, _ in SHAPES:
        dtypes = [dt0] if quick else [torch.float32, torch.bfloat16]
        trials = [(1, None, None)] if quick else [(1, None, None), (2, 8.0, 60.0), (3, 8.8, -60.0)]
        for dtype in dtypes:
            for seed, sc, off in trials:
                label = f"{sname} {str(dtype)[6:]} seed={seed}"
                out.append((label, functools.partial(draw, b, d, dtype, seed, sc, off), b * d > (1 << 27) and seed != 1))
    for dtype in (torch.float32, torch.bfloat16):
        tag = str(dtype)[6:]
        for b, d in ((64, 16384), (8, 4096), (4, 262144)):
            out.append((f"misaligned {b}x{d} {tag}", functools.partial(misaligned, b, d, dtype, b + d), False))
        if not quick:
            for b, d in ((16, 32768), (8, 65536), (4, 131072), (6, 100000), (3, 200008)):
                out.append((f"cluster {b}x{d} {tag}", functools.partial(draw, b, d, dtype, d), False))
        out.append((f"neg_inf_mask 16x8192 {tag}", functools.partial(masked, 16, 8192, dtype, 7, None), False))
        out.append((f"neg_inf_cluster 8x393216 {tag}", functools.partial(masked, 8, 393216, dtype, 9, 1000), False))
    return out


def poison(nbytes):
    """Fill soon-to-be-reused allocator memory with NaN so that unwritten outputs fail."""
    junk = torch.full((nbytes // 4 + 16,), float("nan"), device="cuda")
    del junk


def compare(y, x, dtype):
    """(ok, message) against a float64 reference, computed in row chunks to bound memory."""
    atol, rtol, l2tol = TOL[dtype]
    if not isinstance(y, torch.Tensor) or y.shape != x.shape or y.dtype != x.dtype or y.device != x.device:
        return False, f"bad output {getattr(y, 'shape', None)} {getattr(y, 'dtype', None)} {getattr(y, 'device', None)}"
    rows_per = max(1, (1 << 26) // max(1, x.shape[-1]))
    max_abs = max_rel = sq_diff = sq_ref = 0.0
    nbad = 0
    for r0 in range(0, x.shape[0], rows_per):
        want = torch.softmax(x[r0:r0 + rows_per].double(), dim=-1)
        got = y[r0:r0 + rows_per].double()
        if not torch.equal(torch.isnan(got), torch.isnan(want)):
            return False, f"NaN positions differ (rows {r0}+: {int(got.isnan().sum())} NaN vs {int(want.isnan().sum())} in ref)"
        if not torch.equal(torch.isinf(got), torch.isinf(want)):
            return False, f"inf positions differ (rows {r0}+)"
        fin = torch.isfinite(want)
        diff = (got - want).abs().where(fin, torch.zeros_like(got))
        ref = want.abs().where(fin, torch.zeros_like(want))
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float((diff / ref.clamp_min(1e-30)).max()))
        sq_diff += float((diff * diff).sum())
        sq_ref += float((ref * ref).sum())
        nbad += int((diff > atol + rtol * ref).sum())
    l2 = math.sqrt(sq_diff) / math.sqrt(sq_ref) if sq_ref > 0 else 0.0
    ok = nbad == 0 and l2 <= l2tol
    return ok, f"abs {max_abs:.2e} rel {max_rel:.2e} l2 {l2:.2e}" + ("" if ok else f"  ({nbad} elems out of tol)")


def run_case(model, x):
    x_before = x.clone()
    poison(x.numel() * x.element_size())
    y = model(x)
    torch.cuda.synchronize()
    if not torch.equal(x, x_before):  # inputs here hold no NaN, so equal() is exact
        return False, "input was modified"
    return compare(y, x, x.dtype)


# ---------------------------------------------------------------- child processes
def child_correct(name, start, quick):
    model = load_module(name).ModelNew().cuda()
    for i, (label, make, big) in enumerate(cases(quick)):
        if i < start:
            continue
        if big and name == "simple":
            print(f"CASE {i} SKIP", flush=True)  # the simple kernel is slow on the largest shapes
            continue
        try:
            x = make()
            ok, msg = run_case(model, x)
            del x
        except Exception as e:
            print(f"CASE {i} FAIL {name:6s} {label:34s} EXCEPTION {str(e)[:300]!r}", flush=True)
            sys.exit(3)  # a CUDA error is sticky: let the parent restart after this case
        print(f"CASE {i} {'PASS' if ok else 'FAIL'} {name:6s} {label:34s} {msg}", flush=True)
        torch.cuda.empty_cache()


def child_timing(names, skip):
    import triton.testing
    impls = {}
    mods = {n: load_module(n) for n in names}
    for n, m in mods.items():
        impls[n] = m.ModelNew().cuda()
    impls["torch"] = lambda x: torch.softmax(x, dim=-1)
    if "fast" in mods and hasattr(mods["fast"], "_ext"):
        ext = mods["fast"]._ext
        for kb in (16, 32):  # neighbours of fast.py's slice knob (default 64 KB)
            impls[f"fast{kb}K"] = (lambda t: (lambda x: ext.softmax_fast(x, t)))(kb * 1024)
    try:
        import quack.softmax as qs
        impls["quack"] = next(getattr(qs, n) for n in ("softmax_fwd", "_softmax_fwd", "softmax") if hasattr(qs, n))
    except Exception:
        pass
    for si, (sname, b, d, dtype, _) in enumerate(TIMING):
        try:
            x = draw(b, d, dtype, seed=11)
            ref = torch.softmax(x.float(), dim=-1)
        except Exception as e:
            print(f"TERR {si} input {str(e)[:150]!r}", flush=True)
            continue
        for iname, fn in impls.items():
            if f"{si}:{iname}" in skip:
                continue
            print(f"TSTART {si} {iname}", flush=True)
            try:
                err = float((fn(x).float() - ref).abs().max())  # sanity only; knob variants skip the full pass
                note = "" if err <= 2 * TOL[dtype][0] else f"MISMATCH(max abs {err:.2e})"
                ms = triton.testing.do_bench(lambda: fn(x), warmup=25, rep=100, return_mode="median")
                print(f"TIME {si} {iname} {ms:.5f} {note}", flush=True)
            except Exception as e:
                print(f"TERR {si} {iname} {str(e)[:150]!r}", flush=True)
                if "CUDA" in str(e) or "cuda" in str(e):
                    sys.exit(3)
        del x, ref
        torch.cuda.empty_cache()


def spawn(args, on_line, hang_s=HANG_S):
    """Run this script as a child; feed each stdout line to on_line. Returns (returncode, hung)."""
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


# ---------------------------------------------------------------- parent
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="listed dtype only, one trial, fewer extras")
    ap.add_argument("--child", choices=["correct", "timing"])
    ap.add_argument("--model", default="fast")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--names", default="fast,fast_v2,simple")
    ap.add_argument("--skip", default="")
    args = ap.parse_args()
    if args.child == "correct":
        return child_correct(args.model, args.start, args.quick)
    if args.child == "timing":
        return child_timing([n for n in args.names.split(",") if n], set(args.skip.split(",")))

    t_start = time.time()
    failures = []
    # Build both extensions once here (in parallel: nvcc runs in subprocesses); children reuse the cache.
    built = []
    with ThreadPoolExecutor(3) as pool:
        futures = {name: pool.submit(load_module, name) for name in ("fast", "fast_v2", "simple")}
    for name, fut in futures.items():
        try:
            fut.result()
            built.append(name)
            print(f"built {name}.py ({time.time() - t_start:.0f}s)", flush=True)
        except Exception as e:
            failures.append(f"{name}: build failed")
            print(f"BUILD FAILED {name}.py: {e!r}")
            traceback.print_exception(type(e), e, e.__traceback__)

    print("\n== correctness ==", flush=True)
    all_cases = cases(args.quick)
    for name in built:
        k = 0
        while k < len(all_cases):
            state = {"next": k}

            def on_line(line, name=name, state=state):
                if line.startswith("CASE "):
                    _, idx, verdict, rest = (line.split(" ", 3) + [""])[:4]
                    state["next"] = int(idx) + 1
                    if verdict != "SKIP":
                        print(f"  {verdict} {rest}", flush=True)
                    if verdict == "FAIL":
                        failures.append(f"{name}/{all_cases[int(idx)][0].replace(' ', '/')}")
                else:
                    print(f"    | {line}", flush=True)

            extra = ["--quick"] if args.quick else []
            rc, hung = spawn(["--child", "correct", "--model", name, "--start", str(k)] + extra, on_line)
            k = state["next"]
            if (rc != 0 and rc != 3) or hung:  # died inside case k without reporting it
                if k < len(all_cases):
                    why = f"HANG > {HANG_S}s" if hung else f"CRASH rc={rc}"
                    print(f"  FAIL {name:6s} {all_cases[k][0]:34s} {why}", flush=True)
                    failures.append(f"{name}/{all_cases[k][0].replace(' ', '/')}({why})")
                k += 1

    print("\n== timing (median ms, L2 flushed; bytes = read x + write y) ==", flush=True)
    results, skip = {}, set()
    for _ in range(6):
        last = {}

        def on_line(line, last=last):
            parts = line.split(" ")
            if parts[0] == "TSTART":
                last["key"] = f"{parts[1]}:{parts[2]}"
            elif parts[0] == "TIME":
                results[(int(parts[1]), parts[2])] = (float(parts[3]), " ".join(parts[4:]))
                skip.add(f"{parts[1]}:{parts[2]}")
            elif parts[0] == "TERR":
                print(f"  {TIMING[int(parts[1])][0]} {parts[2]} failed: {' '.join(parts[3:])}", flush=True)
                skip.add(f"{parts[1]}:{parts[2]}")
                if parts[2].startswith(("fast", "simple")):
                    failures.append(f"{parts[2]}/{TIMING[int(parts[1])][0]} timing-run error")
            else:
                print(f"    | {line}", flush=True)

        n_skip_before = len(skip)
        rc, hung = spawn(["--child", "timing", "--names", ",".join(built), "--skip", ",".join(sorted(skip))], on_line,
                         hang_s=150)  # quack JIT-compiles per shape
        if rc == 0 and not hung:
            break
        why = "hung" if hung else f"died rc={rc}"
        if "key" in last and last["key"] not in skip:
            print(f"  timing child {why} in {last['key']}; skipping it", flush=True)
            skip.add(last["key"])
            si, iname = last["key"].split(":")
            if iname.startswith(("fast", "simple")):
                failures.append(f"{iname}/{TIMING[int(si)][0]} timing-run {why}")
        if len(skip) == n_skip_before:  # no progress: give up rather than loop
            print(f"  timing child {why}; no further timing", flush=True)
            break
    print(f"  {'shape':18s} {'impl':7s} {'ms':>8s} {'GB/s':>7s} {'%peak':>6s} {'vs torch':>8s}")
    for si, (sname, b, d, dtype, _) in enumerate(TIMING):
        nbytes = 2 * b * d * (4 if dtype == torch.float32 else 2)
        base = results.get((si, "torch"), (None,))[0]
        for (sj, iname), (ms, note) in results.items():
            if sj != si:
                continue
            gbs = nbytes / (ms * 1e-3) / 1e9
            sp = f"{base / ms:7.2f}x" if base else ""
            print(f"  {sname:18s} {iname:7s} {ms:8.4f} {gbs:7.0f} {100 * gbs * 1e9 / PEAK_BW:5.1f}% {sp} {note}")
            if note and iname.startswith("fast"):
                failures.append(f"{iname}/{sname} timing-run mismatch")

    print(f"\n(total {time.time() - t_start:.0f}s)")
    print("ALL CORRECT" if not failures else "FAILURES: " + ", ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
