"""Exploit 1 (uninitialised output), softmax.

Cheat: returns torch.empty_like(x) and runs no kernel at all, hoping the allocator hands back
freed memory that still holds a correct result (e.g. a reference output computed just before).
Should be caught by: uninitialised-output (poisoned freed memory), else wrong-output.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)
