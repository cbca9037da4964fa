"""Correctness + knob sweep for solutions/softmax/fast_v3.py (run on the GPU machine, from the repo root).

    python3 benchmarks/bench_softmax_v3.py

Correctness (fast_v3 only; fast.py is already verified): every problem.yaml shape in float32 and
bfloat16 (randn * scale + offset, offset in +-60), misaligned rows (storage offset 1), odd widths,
rows that take the long-row v3 path (incl. fewer slices than SMs, a 16-byte last slice, -inf / NaN /
+inf rows), each knob variant on two long-row shapes, and 4096x393216 fp32, 2048x262144 fp32,
1024x786432 bf16 once. float64 reference, problem.yaml tolerances; outputs poisoned with NaN.
Timing: 4096x393216 fp32 with triton.testing.do_bench(warmup=25, rep=100) median (L2 flushed):
fast.py, every fast_v3 knob variant, torch eager, quack if importable; then 2048x262144 fp32 and
1024x786432 bf16 for fast vs fast_v3 default. Every case runs in a child process that is restarted
after a crash or a hang (so a hang costs 60 s, not the run). Last line: ALL CORRECT or FAILURES: ...
"""
import importlib.util
import math
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEAK_BW = 4.24e12
TOL = {torch.float32: (1e-4, 1e-4, 1e-4), torch.bfloat16: (1e-2, 1e-2, 1e-2)}
HANG_S = 60

# (label, slice_kb, nbuf, lag, ctas_per_sm, workers); 0 = auto (32 KB, 7 buffers, lag 2, 1 CTA/SM, 16 warps)
VARIANTS = [
    ("auto", 0, 0, 0, 0, 0),
    ("s32n7d1", 32, 7, 1, 1, 16),
    ("s32n7d3", 32, 7, 3, 1, 16),
    ("s24n9d3", 24, 9, 3, 1, 16),
    ("s16n14d5", 16, 14, 5, 1, 16),
    ("s48n4d1", 48, 4, 1, 1, 16),
    ("s64n3d1", 64, 3, 1, 1, 16),
    ("s32n7d2w8", 32, 7, 2, 1, 8),
    ("s32n7d2w24", 32, 7, 2, 1, 24),
    ("c2s16n6d2", 16, 6, 2, 2, 8),
    ("c2s24n4d1", 24, 4, 1, 2, 8),
    ("c2s32n3d1", 32, 3, 1, 2, 8),
]

YAML_SHAPES = [(8192, 16384), (4096, 393216), (32768, 4096), (16384, 32768), (1, 1000), (5, 3), (3, 1),
               (7, 65537), (33, 1001), (2, 1048583), (129, 4099), (3, 65537), (4, 393217), (1, 7)]


def load_module(name):
    spec = importlib.util.spec_from_file_location(f"softmax_{name}", os.path.join(ROOT, "solutions", "softmax", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def draw(b, d, dtype, seed, offset_elems=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    scale = [0.5, 1.0, 2.0, 4.0, 8.0][seed % 5]
    offset = ((seed * 0.377) % 1.0 * 2 - 1) * 60.0
    flat = torch.randn(b * d + offset_elems, device="cuda", generator=g).mul_(scale).add_(offset).to(dtype)
    return flat[offset_elems:].view(b, d)  # contiguous; offset 1 -> misaligned base pointer


def special(b, d, dtype, seed):
    x = draw(b, d, dtype, seed)
    x[0, 1000:] = float("-inf")   # slices that are all -inf
    x[1] = float("-inf")          # whole row -inf -> NaN
    x[2, d // 2] = float("nan")   # NaN row
    x[3, d - 1] = float("inf")    # +inf -> NaN row
    x[4, ::7] = float("-inf")
    return x


def cases():
    """[(label, make_x, knobs)] in a fixed order (parent and child enumerate the same list)."""
    out = []
    for i, (b, d) in enumerate(YAML_SHAPES):
        for dt in (torch.float32, torch.bfloat16):
            if b * d > (1 << 28) and dt == torch.float32 and (b, d) == (4096, 393216):
                continue  # checked below, once
            out.append((f"{b}x{d} {str(dt)[6:]}", lambda b=b, d=d, dt=dt, i=i: draw(b, d, dt, 100 + i), None))
    for dt in (torch.float32, torch.bfloat16):
        tag = str(dt)[6:]
        for b, d in ((64, 16384), (4, 262144), (8, 393216), (3, 65536)):
            out.append((f"misaligned {b}x{d} {tag}", lambda b=b, d=d, dt=dt: draw(b, d, dt, b + d, 1), None))
        for b, d in ((16, 32768), (8, 65536), (6, 100000), (3, 200008), (2, 393216), (37, 262148), (300, 131072)):
            out.append((f"v3path {b}x{d} {tag}", lambda b=b, d=d, dt=dt: draw(b, d, dt, 7 * b + d), None))
        out.append((f"special 8x393216 {tag}", lambda dt=dt: special(8, 393216, dt, 5), None))
    for v in VARIANTS:
        for b, d, dt in ((256, 393216, torch.float32), (37, 262148, torch.float32), (64, 786432, torch.bfloat16)):
            out.append((f"knob {v[0]} {b}x{d} {str(dt)[6:]}", lambda b=b, d=d, dt=dt: draw(b, d, dt, 3), v[1:]))
    for b, d, dt in ((4096, 393216, torch.float32), (2048, 262144, torch.float32), (1024, 786432, torch.bfloat16)):
        out.append((f"big {b}x{d} {str(dt)[6:]}", lambda b=b, d=d, dt=dt: draw(b, d, dt, 42), None))
    return out


def compare(y, x):
    atol, rtol, l2tol = TOL[x.dtype]
    if y.shape != x.shape or y.dtype != x.dtype or y.device != x.device:
        return False, f"bad output {tuple(y.shape)} {y.dtype} {y.device}"
    rows_per = max(1, (1 << 26) // x.shape[-1])
    max_abs = sq_d = sq_r = 0.0
    nbad = 0
    for r0 in range(0, x.shape[0], rows_per):
        want = torch.softmax(x[r0:r0 + rows_per].double(), dim=-1)
        got = y[r0:r0 + rows_per].double()
        if not torch.equal(got.isnan(), want.isnan()):
            return False, f"NaN positions differ (rows {r0}+: {int(got.isnan().sum())} vs {int(want.isnan().sum())})"
        fin = torch.isfinite(want)
        diff = (got - want).abs().where(fin, torch.zeros_like(got))
        ref = want.abs().where(fin, torch.zeros_like(want))
        max_abs = max(max_abs, float(diff.max()))
        sq_d += float((diff * diff).sum())
        sq_r += float((ref * ref).sum())
        nbad += int((diff > atol + rtol * ref).sum())
        del want, got, fin, diff, ref
    l2 = math.sqrt(sq_d / sq_r) if sq_r > 0 else 0.0
    ok = nbad == 0 and l2 <= l2tol
    return ok, f"abs {max_abs:.1e} l2 {l2:.1e}" + ("" if ok else f" ({nbad} out of tol)")


# ---------------------------------------------------------------- children
def child_correct(start):
    ext = load_module("fast_v3")._ext
    for i, (label, make, knobs) in enumerate(cases()):
        if i < start:
            continue
        try:
            x = make()
            x0 = x.clone() if x.numel() < (1 << 28) else None
            junk = torch.full((x.numel() * x.element_size() // 4 + 64,), float("nan"), device="cuda")
            del junk  # poison: the output is allocated from this memory
            y = ext.softmax_fast_v3(x, *(knobs or (0, 0, 0, 0, 0)))
            torch.cuda.synchronize()
            if x0 is not None and not torch.equal(x.nan_to_num(), x0.nan_to_num()):
                ok, msg = False, "input modified"
            else:
                ok, msg = compare(y, x)
            b, d = x.shape
            plan = ext.softmax_v3_plan(b, d, x.dtype == torch.bfloat16, *(knobs or (0, 0, 0, 0, 0)))
            path = "v3" if plan[0] and (x.data_ptr() % 16 == 0) and (d * x.element_size()) % 16 == 0 \
                and d * x.element_size() > 65536 else "v1"
            del x, x0, y
        except Exception as e:
            print(f"CASE {i} FAIL {label} EXCEPTION {str(e)[:200]!r}", flush=True)
            sys.exit(3)
        print(f"CASE {i} {'PASS' if ok else 'FAIL'} {label:36s} [{path}] {msg}", flush=True)
        torch.cuda.empty_cache()


def child_timing(skip):
    import triton.testing
    v1 = load_module("fast").ModelNew()
    ext = load_module("fast_v3")._ext
    quack = None
    try:
        from quack.softmax import softmax_fwd as quack
    except Exception as e:
        print(f"NOTE quack not importable ({str(e)[:80]})", flush=True)
    shapes = [(4096, 393216, torch.float32), (2048, 262144, torch.float32), (1024, 786432, torch.bfloat16)]
    for si, (b, d, dt) in enumerate(shapes):
        impls = [("fast(v1)", v1)]
        vs = VARIANTS if si == 0 else VARIANTS[:1]
        for v in vs:
            impls.append((f"v3:{v[0]}", (lambda k: (lambda x: ext.softmax_fast_v3(x, *k)))(v[1:])))
        if si == 0:
            impls.append(("eager", lambda x: torch.softmax(x, dim=-1)))
            if quack is not None:
                impls.append(("quack", quack))
        x = draw(b, d, dt, 11)
        ref = ext.softmax_fast_v3(x, 0, 0, 0, 0, 0)  # verified in the correctness stage
        for name, fn in impls:
            key = f"{si}:{name}"
            if key in skip:
                continue
            print(f"TSTART {key}", flush=True)
            try:
                y = fn(x)
                err = float((y.float() - ref.float()).abs().max())
                del y
                note = "" if err <= TOL[dt][0] else f"MISMATCH(max abs vs v3 auto {err:.1e})"
                ms = triton.testing.do_bench(lambda: fn(x), warmup=25, rep=100, return_mode="median")
                extra = ""
                if name.startswith("v3:"):
                    k = next(v[1:] for v in VARIANTS if v[0] == name[3:])
                    p = ext.softmax_v3_plan(b, d, dt == torch.bfloat16, *k)
                    extra = (f"grid={p[1]} cps={p[2]} thr={p[3]} P={p[4]} slice={p[5] // 1024}K nbuf={p[6]} "
                             f"lag={p[7]} occ={p[8]}" if p[0] else "v1-path")
                print(f"TIME {si} {name} {ms:.4f} {note} {extra}", flush=True)
            except Exception as e:
                print(f"TERR {si} {name} {str(e)[:150]!r}", flush=True)
                if "CUDA" in str(e):
                    sys.exit(3)
            torch.cuda.empty_cache()
        del x, ref
        torch.cuda.empty_cache()


def spawn(args, on_line, hang_s):
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)] + args, stdout=subprocess.PIPE, text=True, bufsize=1)
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


SHAPE_NAMES = ["4096x393216 fp32", "2048x262144 fp32", "1024x786432 bf16"]


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--child-correct":
        return child_correct(int(sys.argv[2]))
    if len(sys.argv) > 1 and sys.argv[1] == "--child-timing":
        return child_timing(set(sys.argv[2].split(",")) if len(sys.argv) > 2 else set())

    t0 = time.time()
    failures = []
    with ThreadPoolExecutor(2) as pool:
        futs = {n: pool.submit(load_module, n) for n in ("fast", "fast_v3")}
    for n, f in futs.items():
        try:
            f.result()
            print(f"built {n}.py ({time.time() - t0:.0f}s)", flush=True)
        except Exception as e:
            print(f"BUILD FAILED {n}.py: {str(e)[-2000:]}", flush=True)
            failures.append(f"{n}: build failed")
    if "fast_v3: build failed" in failures:
        print("FAILURES: " + ", ".join(failures))
        return 1

    print("\n== correctness (fast_v3) ==", flush=True)
    all_cases = cases()
    k = 0
    while k < len(all_cases):
        st = {"next": k}

        def on_line(line, st=st):
            if line.startswith("CASE "):
                _, idx, verdict, rest = (line.split(" ", 3) + [""])[:4]
                st["next"] = int(idx) + 1
                print(f"  {verdict} {rest}", flush=True)
                if verdict == "FAIL":
                    failures.append(all_cases[int(idx)][0].replace(" ", "/"))
            else:
                print(f"    | {line}", flush=True)

        rc, hung = spawn(["--child-correct", str(k)], on_line, HANG_S)
        k = st["next"]
        if (rc not in (0, 3)) or hung:
            if k < len(all_cases):
                why = f"HANG > {HANG_S}s" if hung else f"CRASH rc={rc}"
                print(f"  FAIL {all_cases[k][0]} {why}", flush=True)
                failures.append(f"{all_cases[k][0].replace(' ', '/')}({why})")
            k += 1
    print(f"  ({time.time() - t0:.0f}s)", flush=True)

    print("\n== timing (median ms, L2 flushed; bytes = read x + write y) ==", flush=True)
    results, skip = [], set()
    for _ in range(5):
        last = {}

        def on_line(line, last=last):
            p = line.split(" ")
            if p[0] == "TSTART":
                last["key"] = p[1]
            elif p[0] == "TIME":
                results.append((int(p[1]), p[2], float(p[3]), " ".join(p[4:])))
                skip.add(f"{p[1]}:{p[2]}")
            elif p[0] == "TERR":
                print(f"  {SHAPE_NAMES[int(p[1])]} {p[2]} failed: {' '.join(p[3:])}", flush=True)
                skip.add(f"{p[1]}:{p[2]}")
                if p[2].startswith(("v3", "fast")):
                    failures.append(f"timing-error/{p[2]}")
            else:
                print(f"    | {line}", flush=True)

        n_before = len(skip)
        rc, hung = spawn(["--child-timing", ",".join(sorted(skip))], on_line, 120)
        if rc == 0 and not hung:
            break
        why = "hung" if hung else f"died rc={rc}"
        if "key" in last and last["key"] not in skip:
            print(f"  timing child {why} in {last['key']}; skipping it", flush=True)
            skip.add(last["key"])
            failures.append(f"timing-{why}/{last['key']}")
        if len(skip) == n_before:
            break
    print(f"  {'shape':17s} {'impl':12s} {'ms':>7s} {'%4.24TB/s':>9s}  notes")
    for si, name, ms, note in results:
        b, d, dt = [(4096, 393216, 4), (2048, 262144, 4), (1024, 786432, 2)][si]
        pct = 100 * 2 * b * d * dt / (ms * 1e-3) / PEAK_BW
        print(f"  {SHAPE_NAMES[si]:17s} {name:12s} {ms:7.4f} {pct:8.1f}%  {note}")
        if "MISMATCH" in note and name.startswith("v3"):
            failures.append(f"{name}/{SHAPE_NAMES[si].replace(' ', '_')} mismatch")
    best = min((r for r in results if r[0] == 0 and r[1].startswith("v3")), key=lambda r: r[2], default=None)
    if best:
        print(f"  best v3 variant at 4096x393216: {best[1]} {best[2]:.4f} ms")
    print(f"\n(total {time.time() - t0:.0f}s)")
    print("ALL CORRECT" if not failures else "FAILURES: " + ", ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
