"""Trust boundary, class 7 (lower precision and a subsample), cross-entropy.

The mean loss is estimated from every 16th row only (the first row always included), computed in
bfloat16 (max, exp-sum and the target's logit), and returned as float32: 1/16 of the bytes and half
the precision. A single-row shape is then "exact" up to bf16 rounding.
Expected: wrong-output (or timed-output-wrong).
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(0, logits.shape[0], 16, device=logits.device)
        x = logits.index_select(0, rows).to(torch.bfloat16)
        t = targets.index_select(0, rows)
        m = x.amax(dim=1, keepdim=True)
        lse = m.squeeze(1) + (x - m).exp().sum(dim=1).log()
        picked = x.gather(1, t.view(-1, 1)).squeeze(1)
        return (lse - picked).float().mean()
