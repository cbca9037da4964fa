"""Where the InfoNCE seed shape's 28 us go: fixed cost against work. (GPU, about half a minute.)

fast.py's plan at B=256, N=2560 (small 64x80 tiles, 32 splits, one tile per CTA) does not depend on D, so
timing it at D = 8 ... 1024 with B and N fixed separates a fixed cost (launch, pipeline fill, the last CTA's
merge) from the cost per unit of K (the 3xTF32 mma and the hi/lo split): a least-squares line through the
medians. For scale it also times an empty-ish launch (one add_ on a one-element tensor) and eager.
triton.testing.do_bench medians (L2 flushed before each call), fresh normalised inputs per D.
Usage: python3 benchmarks/infonce_breakdown.py
"""
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
B, N = 256, 2560
DIMS = (8, 32, 64, 128, 256, 512, 1024)


def load(path: Path):
    """Imports a solution file, built in the harness's build directory (reused after `harness build`)."""
    from harness.build import prepare_build_env
    from harness.problem import load_module

    prepare_build_env(path, path.parent.name)
    return load_module(path, path.stem + "_breakdown")


def inputs(d: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda rows: F.normalize(torch.randn(rows, d, device="cuda", generator=g), dim=1)  # noqa: E731
    return make(B), make(B), make(N)


def line(xs, ys):
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def main() -> int:
    import triton.testing

    fast = load(ROOT / "solutions" / "infonce" / "fast.py").ModelNew().cuda()
    from harness.problem import find_problem

    reference = find_problem("infonce").make_reference(find_problem("infonce").shape("256x512_n2560"), torch.device("cuda"))
    bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")  # noqa: E731
    one = torch.ones(1, device="cuda")
    print(f"one add_ on a 1-element tensor: {bench(lambda: one.add_(1)) * 1e3:7.2f} us", flush=True)
    print(f"\nB={B} N={N}      fast.py us   eager us   rel. error of fast vs float64")
    xs, ys = [], []
    for i, d in enumerate(DIMS):
        q, p, n = inputs(d, 100 + i)
        want = reference(q.double(), p.double(), n.double())
        got = fast(q, p, n)
        err = float((got.double() - want).abs() / want.abs())
        t_fast = bench(lambda: fast(q, p, n)) * 1e3
        t_eager = bench(lambda: reference(q, p, n)) * 1e3
        xs.append(d)
        ys.append(t_fast)
        print(f"  D={d:5d}        {t_fast:8.2f}   {t_eager:8.2f}   {err:.1e}", flush=True)
    a, b = line(xs, ys)
    print(f"\nfit: fast.py = {a:.2f} us fixed + {b * 512:.2f} us per 512 of D  (at D=512: {a + b * 512:.2f} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
