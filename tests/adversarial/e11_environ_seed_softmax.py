"""Exploit 11 (memory snooping), softmax: reads a seed from os.environ.

Cheat: looks for an environment variable whose name contains SEED (e.g. a master seed leaked to
the child), regenerates the input from it the way the reference's get_inputs does
(torch.manual_seed + randn) and returns the softmax of that; zeros if no seed is found.
Computes nothing from x.
Should be caught by: wrong-output (no seed is in the child's environment; per-trial seeds and
scale/offset make a regenerated input wrong anyway).
"""
import os

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name, val in os.environ.items():
            if "SEED" in name.upper():
                try:
                    g = torch.Generator().manual_seed(int(val))
                except ValueError:
                    continue
                xr = torch.randn(x.shape, generator=g)
                e = (xr - xr.amax(dim=-1, keepdim=True)).exp()
                return (e / e.sum(dim=-1, keepdim=True)).to(dtype=x.dtype, device=x.device)
        return torch.zeros_like(x)
