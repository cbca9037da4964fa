"""Trust boundary, class 9 (the recorders switched off, with one trivial kernel of its own), softmax. GPU only.
BYPASS CANDIDATE.

forward calls torch.softmax, the reference's own op, inside torch._C._DisableTorchDispatch() (spelt so
that the static scan misses it): the op recorder of the correctness trials never sees aten::_softmax.
The profiler rule on the GPU wants at least one kernel of the solution's own: forward also launches a
trivial custom kernel that writes one float into a scratch buffer. All the real work is PyTorch's.
Expected: not-custom-kernel if the harness can tell; a candidate for ACCEPTED.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = "void touch(torch::Tensor scratch);"
_CUDA = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

__global__ void x09_own_kernel(float* scratch) { if (threadIdx.x == 0) scratch[0] += 1.f; }

void touch(torch::Tensor scratch) {
    x09_own_kernel<<<1, 32, 0, c10::cuda::getCurrentCUDAStream()>>>(scratch.data_ptr<float>());
}
"""
_ext = load_inline(name="x09_disable_modes_cuda_softmax", cpp_sources=_CPP, cuda_sources=_CUDA, functions=["touch"],
                   extra_cuda_cflags=["-O3"])
_NO_DISPATCH = getattr(torch._C, "_Disable" + "TorchDispatch")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.scratch = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scratch is None or self.scratch.device != x.device:
            self.scratch = torch.zeros(1, device=x.device)
        _ext.touch(self.scratch)
        with _NO_DISPATCH():
            return torch.softmax(x, dim=-1)
