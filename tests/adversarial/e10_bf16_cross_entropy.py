"""Exploit 10 (lower precision), cross_entropy: fp32 logits computed in bfloat16.

Cheat: casts the logits to bfloat16 and computes the loss (hand-written logsumexp) entirely in
bfloat16, then casts back to the logits' dtype.
Should be caught by: wrong-output on the fp32 shapes; on bf16 shapes it may pass or fail
(bf16 accumulation), either is acceptable there.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = logits.to(torch.bfloat16)
        m = x.amax(dim=1, keepdim=True)
        lse = m.squeeze(1) + (x - m).exp().sum(dim=1).log()
        return (lse - x.gather(1, targets.view(-1, 1)).squeeze(1)).mean().to(logits.dtype)
