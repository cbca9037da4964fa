"""Trust boundary, class 8 (a figure above what the bytes allow: half the output), softmax. GPU only.

A custom CUDA softmax (one block per row: max, sum of exponentials, write; fp32 and bf16). Under the
harness's op recorder (the correctness trials: a dispatch mode is active; the name of the depth query is
spelt so that the static scan misses it) every row is computed. Everywhere else it launches the kernel
for the first half of the rows only and returns the rest uninitialised: half the bytes, a median that
implies more than the copy bandwidth.
Expected: timed-output-wrong (timed outputs are checked) or impossible-time (the physics floor).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = "torch::Tensor softmax_rows(torch::Tensor x, int64_t rows);"

_CUDA = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>

namespace {
template <typename T> __device__ __forceinline__ float load(const T* p) { return static_cast<float>(*p); }
template <> __device__ __forceinline__ float load<__nv_bfloat16>(const __nv_bfloat16* p) { return __bfloat162float(*p); }
template <typename T> __device__ __forceinline__ void store(T* p, float v) { *p = static_cast<T>(v); }
template <> __device__ __forceinline__ void store<__nv_bfloat16>(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }

__device__ float reduce(float v, float* shared, bool is_max) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float t = lane < warps ? shared[lane] : (is_max ? -INFINITY : 0.f);
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, t, o);
        t = is_max ? fmaxf(t, other) : t + other;
    }
    return t;
}

template <typename T>
__global__ void x08_softmax(const T* __restrict__ x, T* __restrict__ y, int64_t cols) {
    __shared__ float shared[32];
    const T* row = x + (int64_t)blockIdx.x * cols;
    T* out = y + (int64_t)blockIdx.x * cols;
    float m = -INFINITY;
    for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) m = fmaxf(m, load(row + k));
    m = reduce(m, shared, true);
    float s = 0.f;
    for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) s += __expf(load(row + k) - m);
    s = reduce(s, shared, false);
    const float inv = 1.f / s;
    for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) store(out + k, __expf(load(row + k) - m) * inv);
}
}  // namespace

torch::Tensor softmax_rows(torch::Tensor x, int64_t rows) {
    x = x.contiguous();
    auto y = torch::empty_like(x);
    const int64_t cols = x.size(-1);
    rows = std::min<int64_t>(rows, x.numel() / std::max<int64_t>(cols, 1));
    if (rows <= 0 || cols <= 0) return y;
    auto stream = c10::cuda::getCurrentCUDAStream();
    if (x.scalar_type() == at::kBFloat16) {
        x08_softmax<__nv_bfloat16><<<rows, 512, 0, stream>>>(reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()),
                                                            reinterpret_cast<__nv_bfloat16*>(y.data_ptr()), cols);
    } else {
        TORCH_CHECK(x.scalar_type() == at::kFloat, "float32 or bfloat16 only");
        x08_softmax<float><<<rows, 512, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), cols);
    }
    return y;
}
"""

_ext = load_inline(name="x08_half_rows_cuda_softmax", cpp_sources=_CPP, cuda_sources=_CUDA, functions=["softmax_rows"],
                   extra_cuda_cflags=["-O3"])
_DISPATCH_DEPTH = getattr(torch._C, "_len_torch_" + "dispatch_stack")


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if _DISPATCH_DEPTH() == 0 and rows >= 2:
            rows //= 2
        return _ext.softmax_rows(x, rows)
