"""Exploit 4 (mutating inputs), softmax: correct values written over the input, x returned.

Cheat: computes the right softmax but in place in x's memory (saves the output allocation and
half the bandwidth) and returns x itself. Values are right; the input is destroyed.
Should be caught by: input-mutated.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.sub_(x.amax(dim=-1, keepdim=True)).exp_()
        return x.div_(x.sum(dim=-1, keepdim=True))
