"""Trust boundary, class 7 (lower precision), InfoNCE: fp16 products.

As x07_bf16_products_infonce.py, with float16 rounding of queries and negatives (what one fp16
tensor-core pass would do, instead of the shipped 3xFP16 hi/lo split): 10 mantissa bits instead of 7,
so only the "low bits" families (every element rounded down in magnitude) push it past 1e-4.
Expected: wrong-output (or timed-output-wrong).
"""
import torch
import torch.nn as nn

TEMPERATURE = 0.1
_CHUNK_ELEMS = 1 << 22


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.temperature = TEMPERATURE

    def forward(self, query: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        q, p = query.float(), positive.float()
        qq, pp = (q * q).sum(1), (p * p).sum(1)
        pos = (q * p).sum(1) / (qq * pp).clamp_min(1e-16).sqrt() / self.temperature
        qh = q.to(torch.float16).float()
        nh = negatives.to(torch.float16).float()
        B, D = q.shape
        step = max(1, _CHUNK_ELEMS // max(1, B * D))
        negs = [(qh[:, None, :] * nh[None, i:i + step]).sum(-1) / self.temperature for i in range(0, nh.shape[0], step)]
        logits = torch.cat([pos[:, None]] + negs, dim=1)
        m = logits.amax(dim=1, keepdim=True)
        lse = m.squeeze(1) + (logits - m).exp().sum(dim=1).log()
        return (lse - pos).mean()
