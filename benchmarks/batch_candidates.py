"""Write a folder of softmax candidates mixed in quality, for timing `eval-batch` as a researcher would use it.

    python benchmarks/batch_candidates.py OUT_DIR [--count 100]
    python benchmarks/batch_candidates.py OUT_DIR --check RESULTS_DIR   # verdicts against expected.json

Every file is a different source (as sampled candidates are), so a cold build cache builds each CUDA one.
Out of 100 (other counts keep the shares):
  40 correct   one block per row, three passes (as solutions/softmax/simple.py), block size and unroll varied
  10 slow      correct, one warp per row, unrolled once (slow on long rows)
  15 wrong     a forgotten max subtraction (overflows: the inputs are offset), a half-row sum, or no 1/sum
  10 crashing  writes far past the output (an illegal address: the child dies)
  10 broken    CUDA that does not compile (an undeclared name)
   5 hanging   three spin on the GPU forever, two on the host (killed after eval-batch's --timeout)
  10 reference plain torch.softmax, no kernel of its own (rejected as not-custom-kernel on a GPU)
The expected verdict of each file is in its first line, and in expected.json beside them.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

# name, share of 100, expected (status, rule)
MIX = [("correct", 40, ("ok", "")), ("slow", 10, ("ok", "")), ("wrong", 15, ("failed", "wrong-output")),
       ("crashing", 10, ("failed", "cuda-error")), ("broken", 10, ("failed", "compile-error")),
       ("hanging", 5, ("failed", "timeout")), ("reference", 10, ("failed", "not-custom-kernel"))]

KERNEL = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }

template <bool is_max>
__device__ float block_reduce(float v, float* scratch) {
    for (int off = 16; off > 0; off /= 2) {
        float o = __shfl_xor_sync(0xffffffff, v, off);
        v = is_max ? fmaxf(v, o) : v + o;
    }
    if (blockDim.x == 32) return v;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < blockDim.x / 32 ? scratch[lane] : (is_max ? -INFINITY : 0.f);
    for (int off = 16; off > 0; off /= 2) {
        float o = __shfl_xor_sync(0xffffffff, v, off);
        v = is_max ? fmaxf(v, o) : v + o;
    }
    __syncthreads();
    return v;
}

template <typename T>
__global__ void softmax_rows(const T* __restrict__ x, T* __restrict__ y, int64_t cols, int spin) {
    __shared__ float scratch[32];
    const T* xr = x + blockIdx.x * cols;
    T* yr = y + blockIdx.x * cols;
    while (spin) { __nanosleep(1000); }  // HANG
    float m = -INFINITY;
    #pragma unroll UNROLL
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, load(xr + i));
    m = MAX_OF_ROW;
    float s = 0.f;
    #pragma unroll UNROLL
    for (int64_t i = threadIdx.x; i < SUM_END; i += blockDim.x) s += expf(load(xr + i) - m);
    s = block_reduce<false>(s, scratch);
    const float inv = INVERSE;
    #pragma unroll UNROLL
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) store(yr + i OFFSET, expf(load(xr + i) - m) * inv);
}

torch::Tensor softmax_candidate(torch::Tensor x, int64_t spin) {
    x = x.contiguous();
    auto y = torch::empty_like(x);
    const int64_t cols = x.size(-1), rows = cols ? x.numel() / cols : 0;
    if (rows == 0) return y;
    auto stream = c10::cuda::getCurrentCUDAStream();
    if (x.scalar_type() == torch::kFloat32)
        softmax_rows<float><<<rows, THREADS, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), cols, (int)spin);
    else
        softmax_rows<__nv_bfloat16><<<rows, THREADS, 0, stream>>>(
            reinterpret_cast<const __nv_bfloat16*>(x.data_ptr<at::BFloat16>()),
            reinterpret_cast<__nv_bfloat16*>(y.data_ptr<at::BFloat16>()), cols, (int)spin);
    return y;
}
"""

MODULE = '''"""{kind}: {why}"""
import torch
from torch.utils.cpp_extension import load_inline

_ext = load_inline(name="{name}", cpp_sources="torch::Tensor softmax_candidate(torch::Tensor x, int64_t spin);",
                   cuda_sources=r"""{kernel}""", functions=["softmax_candidate"], extra_cuda_cflags=["-O3"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        {forward}
'''

REFERENCE = '''"""reference: torch.softmax itself (sample {k})"""
import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
'''


def kernel(threads: int = 256, unroll: int = 1, max_of_row: str = "block_reduce<true>(m, scratch)",
           sum_end: str = "cols", inverse: str = "1.f / s", offset: str = "", broken: bool = False) -> str:
    """KERNEL with its knobs filled in; `broken` adds a line that does not compile."""
    text = (KERNEL.replace("THREADS", str(threads)).replace("UNROLL", str(unroll)).replace("MAX_OF_ROW", max_of_row)
            .replace("SUM_END", sum_end).replace("INVERSE", inverse).replace("OFFSET", offset))
    return text.replace("float s = 0.f;", "float s = undeclared_total;") if broken else text


def candidate(kind: str, k: int) -> tuple:
    """(file text, one line on what it is) for the k-th candidate of `kind`."""
    threads = [64, 128, 256, 512, 1024][k % 5]
    unroll = 1 + k // 5 % 4
    forward = "return _ext.softmax_candidate(x, 0)"
    if kind == "correct":
        why, text = f"{threads} threads a row, unrolled {unroll}x", kernel(threads, unroll)
    elif kind == "slow":
        why, text = f"one warp a row (variant {k})", kernel(32, 1 + k)
    elif kind == "wrong":
        why, text = [("no max subtraction", kernel(threads, unroll, max_of_row="0.f")),
                     ("sums half the row", kernel(threads, unroll, sum_end="(cols + 1) / 2")),
                     ("never divides by the sum", kernel(threads, unroll, inverse="1.f + 0.f * s"))][k % 3]
    elif kind == "crashing":
        why, text = "writes 2^34 elements past the output", kernel(threads, unroll, offset="+ (int64_t(1) << 34)")
    elif kind == "broken":
        why, text = "an undeclared name", kernel(threads, unroll, broken=True)
    elif kind == "hanging":
        on_gpu = k % 5 < 3
        why, text = ("spins on the GPU" if on_gpu else "spins on the host"), kernel(threads, unroll)
        forward = "return _ext.softmax_candidate(x, 1)" if on_gpu else "while True:\n            pass"
    else:
        return REFERENCE.format(k=k), "torch.softmax"
    return MODULE.format(kind=kind, why=why, name=f"batch_{kind}_{k}", kernel=text, forward=forward), why


def check(out: Path, results: Path) -> int:
    """Print each candidate whose verdict in RESULTS/runs.jsonl differs from expected.json; 1 when any does."""
    expected = json.loads((out / "expected.json").read_text())
    got = {}
    for line in (results / "runs.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "solution":
            got[Path(record["path"]).name] = (record["status"], record.get("rule") or "")
    wrong = {name: (want, got.get(name)) for name, want in expected.items() if got.get(name) != (want["status"], want["rule"])}
    for name, (want, seen) in sorted(wrong.items()):
        print(f"{name}: expected {want['status']} {want['rule']}, got {seen}")
    print(f"{len(expected) - len(wrong)} of {len(expected)} verdicts as expected")
    return 1 if wrong else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write the candidates into (created)")
    parser.add_argument("--count", type=int, default=100, help="candidates in all (the shares above scale with it)")
    parser.add_argument("--check", type=Path, metavar="RESULTS", help="compare a batch's records with expected.json instead")
    args = parser.parse_args()
    if args.check:
        return check(args.out, args.check)
    args.out.mkdir(parents=True, exist_ok=True)
    expected = {}
    for kind, share, verdict in MIX:
        for k in range(max(1, round(share * args.count / 100))):
            text, why = candidate(kind, k)
            name = f"{kind}_{k:02d}.py"
            (args.out / name).write_text(f"# expected: {verdict[0]} {verdict[1]}\n" + text)
            expected[name] = {"status": verdict[0], "rule": verdict[1], "what": why}
    (args.out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"{len(expected)} candidates in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
