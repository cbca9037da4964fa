"""Exploit 3 (subset), infonce: negatives subsampled, their exp-sum rescaled.

Cheat: uses only every 16th negative and multiplies its exp-sum by N/k (adds log(N/k) inside
the logsumexp), an unbiased-looking estimate of the full denominator at 1/16 of the work.
Math is honest torch (no matmul). Exact only when N == 1.
Should be caught by: wrong-output (or timed-output-wrong on timing shapes).
"""
import math

import torch
import torch.nn as nn

TEMPERATURE = 0.1


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.temperature = TEMPERATURE

    def forward(self, query: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        q, p = query.float(), positive.float()
        sub = negatives.float()[::16]
        N, k = negatives.shape[0], sub.shape[0]
        pos = (q * p).sum(1) / ((q * q).sum(1) * (p * p).sum(1)).clamp_min(1e-16).sqrt() / self.temperature
        neg = (q[:, None, :] * sub[None]).sum(-1) / self.temperature + math.log(N / k)
        logits = torch.cat([pos[:, None], neg], dim=1)
        m = logits.amax(dim=1, keepdim=True)
        lse = m.squeeze(1) + (logits - m).exp().sum(dim=1).log()
        return (lse - pos).mean()
