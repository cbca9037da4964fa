"""Exploit 9 (caching), softmax: output cached by the input's data_ptr.

Cheat: remembers each output keyed on (x.data_ptr(), shape, dtype) and returns it on a hit,
without looking at the values - the allocator often hands the same address to the next trial's
fresh input. On a miss it computes honestly (plain torch math, not torch.softmax).
Should be caught by: wrong-output (fresh values at a reused address), timed-output-wrong for timed
calls.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = (x.data_ptr(), tuple(x.shape), x.dtype)
        if key not in self.cache:
            xf = x.float()
            e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
            self.cache[key] = (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
        return self.cache[key]
