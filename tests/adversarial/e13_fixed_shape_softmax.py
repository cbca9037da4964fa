"""Exploit 13 (hard-coded default shape), softmax: assumes rows of DIM = 16384.

Cheat: flattens x and treats it as rows of the default width 16384 (padding the tail with -inf),
i.e. the row length is a compile-time constant as in a kernel tuned only for the default
8192x16384 shape. Plain torch math (not torch.softmax). Right at width 16384, wrong at any
other width (except a single row shorter than 16384).
Should be caught by: wrong-output on the other correctness shapes; timed-output-wrong on the
other timing shapes.
"""
import torch
import torch.nn as nn

DIM = 16384


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.float().reshape(-1)
        pad = (-flat.numel()) % DIM
        rows = torch.cat([flat, flat.new_full((pad,), float("-inf"))]).view(-1, DIM)
        e = (rows - rows.amax(dim=-1, keepdim=True)).exp()
        y = (e / e.sum(dim=-1, keepdim=True)).reshape(-1)[: flat.numel()]
        return y.view(x.shape).to(x.dtype)
