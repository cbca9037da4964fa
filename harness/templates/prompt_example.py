"""Element-wise sum of two float32 tensors of one shape, for the tiny reference `Model.forward(a, b) = a + b`.

One CUDA thread per element in a grid-stride loop: the grid is capped, each thread steps by the grid's size,
and every index is checked against the element count, so any size works (zero elements included). The host
function checks device, dtype and shape, reads contiguous copies of the inputs (never writing them), allocates
a fresh output and launches on the current CUDA stream of the inputs' device."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# The C++ declaration of every host function named in `functions=` below (load_inline writes the bindings).
_cpp_src = "torch::Tensor add_tensors(torch::Tensor a, torch::Tensor b);"

_cuda_src = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <algorithm>

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

__global__ void add_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                           int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = a[i] + b[i];
    }
}

torch::Tensor add_tensors(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "a and b must be CUDA tensors");
    TORCH_CHECK(a.device() == b.device(), "a and b must be on one device");
    TORCH_CHECK(a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32, "a and b must be float32");
    TORCH_CHECK(a.sizes() == b.sizes(), "a and b must have the same shape");
    const c10::cuda::CUDAGuard guard(a.device());
    const torch::Tensor ac = a.contiguous();
    const torch::Tensor bc = b.contiguous();
    torch::Tensor out = torch::empty_like(ac);
    const int64_t n = ac.numel();
    if (n == 0) return out;
    const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks);
    add_kernel<<<(unsigned)blocks, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        ac.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(
    name="prompt_example_add",
    cpp_sources=_cpp_src,
    cuda_sources=_cuda_src,
    functions=["add_tensors"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):  # the reference Model's constructor arguments (none here)
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # the reference's inputs, nothing more
        return _ext.add_tensors(a, b)
