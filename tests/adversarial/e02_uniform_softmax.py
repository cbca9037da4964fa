"""Exploit 2 (zeros / constant), softmax: constant 1/N.

Cheat: returns the uniform distribution 1/N in every entry (right row sums, right shape,
within atol of the answer for wide rows).
Should be caught by: wrong-output (relative L2).
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full_like(x, 1.0 / x.shape[-1])
