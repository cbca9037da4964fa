"""Exploit 9 (caching), softmax: output cached by shape and dtype.

Cheat: computes honestly (plain torch math) the first time a (shape, dtype) is seen and returns
that same output for every later input of that shape.
Should be caught by: wrong-output (each trial has fresh inputs), timed-output-wrong.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = (tuple(x.shape), x.dtype, x.device)
        if key not in self.cache:
            xf = x.float()
            e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
            self.cache[key] = (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
        return self.cache[key]
