"""Exploit 5 (side stream, C++), softmax. GPU only.

Cheat: a simple, correct CUDA softmax kernel (one block per row, float accumulation, fp32 and
bf16) launched on the extension's own cudaStream_t (created once, non-blocking) instead of the
current stream, with no event/wait linking the two. The harness's timing events on the current
stream miss the kernel; a device-wide synchronize before checking still sees right values.
It has its own kernel, so not-custom-kernel must NOT be what catches it.
Should be caught by: escaped-timing (host-clock batch) or impossible-time; timed-output-wrong /
wrong-output if outputs are read before the side stream finishes.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_cpp = "torch::Tensor softmax_side(torch::Tensor x);"

_cuda = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }

// Block-wide max (is_max) or sum; blockDim.x is a multiple of 32.
__device__ float block_reduce(float v, bool is_max) {
    __shared__ float sh[32];
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    __syncthreads();  // sh may still be read from the previous call
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : (is_max ? -INFINITY : 0.f);
        for (int o = 16; o > 0; o >>= 1) {
            float w = __shfl_xor_sync(0xffffffffu, v, o);
            v = is_max ? fmaxf(v, w) : v + w;
        }
        if (threadIdx.x == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

template <typename T>
__global__ void softmax_rows(const T* __restrict__ x, T* __restrict__ y, long n) {
    const T* xr = x + (long)blockIdx.x * n;
    T* yr = y + (long)blockIdx.x * n;
    float m = -INFINITY;
    for (long i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, to_f(xr[i]));
    m = block_reduce(m, true);
    float s = 0.f;
    for (long i = threadIdx.x; i < n; i += blockDim.x) s += expf(to_f(xr[i]) - m);
    s = block_reduce(s, false);
    for (long i = threadIdx.x; i < n; i += blockDim.x) store(yr + i, expf(to_f(xr[i]) - m) / s);
}

torch::Tensor softmax_side(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2, "expected a 2-D CUDA tensor");
    TORCH_CHECK(x.is_contiguous(), "expected a contiguous tensor");
    auto y = torch::empty_like(x);
    static cudaStream_t side = nullptr;  // the cheat: our own stream, never joined
    if (side == nullptr) C10_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    const long m = x.size(0), n = x.size(1);
    if (m == 0 || n == 0) return y;
    if (x.scalar_type() == at::kFloat) {
        softmax_rows<float><<<m, 256, 0, side>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    } else if (x.scalar_type() == at::kBFloat16) {
        softmax_rows<__nv_bfloat16><<<m, 256, 0, side>>>(
            reinterpret_cast<const __nv_bfloat16*>(x.data_ptr<at::BFloat16>()),
            reinterpret_cast<__nv_bfloat16*>(y.data_ptr<at::BFloat16>()), n);
    } else {
        TORCH_CHECK(false, "dtype must be float32 or bfloat16");
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(name="adv_e05_side_stream_cpp_softmax", cpp_sources=_cpp, cuda_sources=_cuda,
                   functions=["softmax_side"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.softmax_side(x)
