"""Exploit 2 (zeros / constant), softmax: all-zero output.

Cheat: returns torch.zeros_like(x) (every probability is tiny for wide rows, so a loose
absolute tolerance alone would pass it).
Should be caught by: wrong-output (the relative-L2 check in particular).
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)
