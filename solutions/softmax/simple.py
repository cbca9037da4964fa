"""Row-wise softmax, the straightforward CUDA version.

One thread block per row, three passes over the row in global memory:
  1. max of the row (subtracting it keeps exp() from overflowing),
  2. sum of exp(x - max),
  3. y = exp(x - max) / sum.
float32 and bfloat16 inputs; the math is always done in float32.
Any width works: threads stride over the row, so there is no vector width to respect.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_cuda_src = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>  // lighter than ATen/cuda/CUDAContext.h (no cuBLAS/cuSPARSE headers)
#include <c10/cuda/CUDAException.h>
#include <cuda_bf16.h>
#include <cfloat>

constexpr int kThreads = 256;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }

// Reduce one value per thread to one value for the whole block (result returned to every thread).
// `is_max` picks max or sum. `scratch` must hold one float per warp.
template <bool is_max>
__device__ float block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int off = 16; off > 0; off /= 2) {
        float o = __shfl_xor_sync(0xffffffff, v, off);
        v = is_max ? fmaxf(v, o) : v + o;
    }
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int nwarps = blockDim.x / 32;
    v = lane < nwarps ? scratch[lane] : (is_max ? -INFINITY : 0.f);
    for (int off = 16; off > 0; off /= 2) {
        float o = __shfl_xor_sync(0xffffffff, v, off);
        v = is_max ? fmaxf(v, o) : v + o;
    }
    __syncthreads();  // scratch may be reused by the next reduction
    return v;
}

template <typename T>
__global__ void softmax_simple_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t cols) {
    __shared__ float scratch[32];
    const T* xr = x + blockIdx.x * cols;
    T* yr = y + blockIdx.x * cols;

    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, to_float(xr[i]));
    m = block_reduce<true>(m, scratch);

    float s = 0.f;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) s += expf(to_float(xr[i]) - m);
    s = block_reduce<false>(s, scratch);

    const float inv = 1.f / s;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) store(&yr[i], expf(to_float(xr[i]) - m) * inv);
}

torch::Tensor softmax_simple(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.dim() >= 1, "x must have at least one dimension");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16,
                "x must be float32 or bfloat16");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    const int64_t cols = x.size(-1);
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    if (rows == 0 || cols == 0) return y;
    TORCH_CHECK(rows <= 0x7fffffff, "too many rows");
    auto stream = c10::cuda::getCurrentCUDAStream();
    if (x.scalar_type() == torch::kFloat32) {
        softmax_simple_kernel<float><<<(unsigned)rows, kThreads, 0, stream>>>(
            x.data_ptr<float>(), y.data_ptr<float>(), cols);
    } else {
        softmax_simple_kernel<__nv_bfloat16><<<(unsigned)rows, kThreads, 0, stream>>>(
            reinterpret_cast<const __nv_bfloat16*>(x.data_ptr<at::BFloat16>()),
            reinterpret_cast<__nv_bfloat16*>(y.data_ptr<at::BFloat16>()), cols);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_cpp_src = "torch::Tensor softmax_simple(torch::Tensor x);"

_ext = load_inline(
    name="softmax_simple_v1",
    cpp_sources=_cpp_src,
    cuda_sources=_cuda_src,
    functions=["softmax_simple"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.softmax_simple(x)
