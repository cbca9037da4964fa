"""Exploit 12 (timing detection), softmax: correct for the first 8 calls, then garbage fast.

Cheat: counts calls; the first K=8 compute honestly (plain torch math), hoping correctness
trials come first; every later call (the timed ones) returns torch.empty_like(x) at once.
Should be caught by: timed-output-wrong (outputs of timed calls are checked), or
wrong-output / uninitialised-output if more than K correctness calls are made.
"""
import torch
import torch.nn as nn

K = 8


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > K:
            return torch.empty_like(x)
        xf = x.float()
        e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
        return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
