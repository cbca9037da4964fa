"""Is the 4096x393216 softmax slow because its rows are long, or because the tensor is big? (GPU, ~1 min)

Every fast kernel (ours v1-v3, quack) reaches ~77% of copy bandwidth at 4096x393216 fp32 (6.4 GB in,
6.4 GB out) but 97% at 8192x16384 fp32 (0.5 GB in). This times, with an L2 flush before every call:
  copy_      at 0.5 GB and at 6.4 GB (bytes read + written), one buffer pair reused, and rotating
             over three source buffers (what the harness does: fresh inputs every call);
  fast_v4    (short rows in registers) at 8192x16384 and at 98304x16384 (the same 6.4 GB as the long
             rows, but 64 KB rows);
  fast_v3 / fast (long rows) and eager at 4096x393216.
If fast_v4 drops to ~77% at 98304x16384 the cause is the tensor's size (TLB reach, page layout), and
the 3.4 ms goal is a size problem; if it holds ~97%, the long-row kernels leave bandwidth unused.
Usage: python3 benchmarks/probe_size.py   (prints one line per case)
"""
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from harness.build import prepare_build_env  # noqa: E402
from harness.problem import load_module  # noqa: E402

DEV = torch.device("cuda")
FLUSH = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device=DEV)
COPY_BW = 4.24e12


def solution(name: str):
    path = ROOT / "solutions" / "softmax" / f"{name}.py"
    prepare_build_env(path, "softmax")
    return load_module(path, f"probe_{name}").ModelNew()


def timed(fn, inputs: list, reps: int) -> float:
    """Median ms of fn(inputs[i % len]) with a flush before each call."""
    for x in inputs[:2]:
        fn(x)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        FLUSH.fill_(i)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn(inputs[i % len(inputs)])
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


def report(label: str, ms: float, nbytes: float):
    rate = nbytes / (ms * 1e-3)  # bytes per second
    print(f"{label:48s} {ms:8.4f} ms  {rate / 1e12:5.2f} TB/s  {100 * rate / COPY_BW:5.1f}% of 4.24 TB/s", flush=True)


def main():
    for rows, cols in ((8192, 16384), (98304, 16384)):
        srcs = [torch.randn(rows, cols, device=DEV) for _ in range(3)]
        dst = torch.empty_like(srcs[0])
        nbytes = 2 * srcs[0].numel() * 4
        report(f"copy_ {rows}x{cols} fp32, one source", timed(lambda x: dst.copy_(x), srcs[:1], 20), nbytes)
        report(f"copy_ {rows}x{cols} fp32, three sources", timed(lambda x: dst.copy_(x), srcs, 21), nbytes)
        del dst
        v4 = solution("fast_v4")
        report(f"fast_v4 {rows}x{cols} fp32, one input", timed(v4, srcs[:1], 20), nbytes)
        report(f"fast_v4 {rows}x{cols} fp32, three inputs", timed(v4, srcs, 21), nbytes)
        del srcs
        torch.cuda.empty_cache()
    srcs = [torch.randn(4096, 393216, device=DEV) for _ in range(3)]
    nbytes = 2 * srcs[0].numel() * 4
    for name in ("fast_v3", "fast"):
        model = solution(name)
        report(f"{name} 4096x393216 fp32, one input", timed(model, srcs[:1], 15), nbytes)
        report(f"{name} 4096x393216 fp32, three inputs", timed(model, srcs, 15), nbytes)
    report("eager 4096x393216 fp32, three inputs", timed(lambda x: torch.softmax(x, -1), srcs, 9), nbytes)
    report("sum (read only) 4096x393216 fp32", timed(lambda x: x.sum(), srcs, 9), nbytes / 2)
    report("fill_ (write only) 4096x393216 fp32", timed(lambda x: x.fill_(1.0), srcs, 9), nbytes / 2)


if __name__ == "__main__":
    main()
