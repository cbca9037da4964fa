"""Exploit 3 (subset), cross_entropy: loss over the first 1/8 of the rows only.

Cheat: computes the per-row loss (honest torch math) for the first ceil(M/8) rows and returns
their mean, i.e. the subset's sum rescaled by M/k as an estimate of the full mean. 8x less work.
Exact only when M == 1.
Should be caught by: wrong-output (or timed-output-wrong on timing shapes).
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        M = logits.shape[0]
        k = max(1, (M + 7) // 8)
        x = logits[:k].float()
        m = x.amax(dim=1, keepdim=True)
        lse = m.squeeze(1) + (x - m).exp().sum(dim=1).log()
        per_row = lse - x.gather(1, targets[:k].view(-1, 1)).squeeze(1)
        return (per_row.sum() * (M / k) / M).to(logits.dtype)
