"""Honest control (not an exploit): row softmax in plain torch math, no torch.softmax.

exp(x - rowmax) / rowsum, accumulated in float32 and cast back to the input dtype.
Must PASS on the CPU (the suite checks that honest code is never rejected).
On the GPU it has no custom kernel, so there it is expected to be not-custom-kernel.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
        return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
