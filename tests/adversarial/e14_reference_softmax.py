"""Exploit 14 (the reference op itself), softmax: torch.softmax, no custom kernel.

Cheat: returns torch.softmax(x, -1) - exactly the reference, so the output is right and the
speed is PyTorch's.
Should be caught by: not-custom-kernel (the dispatch mode records aten::_softmax; on the GPU the
profiler also finds no kernel of the solution's own).
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)
