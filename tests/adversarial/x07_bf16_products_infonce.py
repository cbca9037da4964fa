"""Trust boundary, class 7 (lower precision), InfoNCE.

The negatives' dot products (the bulk of the work) are taken from bfloat16-rounded queries and
negatives, accumulated in float32, as a bf16 tensor-core GEMM would (on the CPU: cast to bfloat16 and
back before a broadcast multiply-and-sum; no matmul, so the op recorder has nothing to object to). The
positive's cosine and the loss are exact float32. On plain Gaussian inputs the rounding errors average
out and the loss stays within 1e-4; the "low bits" input families round every element the same way, so
the errors add up.
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
        qb = q.to(torch.bfloat16).float()
        nb = negatives.to(torch.bfloat16).float()
        B, D = q.shape
        step = max(1, _CHUNK_ELEMS // max(1, B * D))
        negs = [(qb[:, None, :] * nb[None, i:i + step]).sum(-1) / self.temperature for i in range(0, nb.shape[0], step)]
        logits = torch.cat([pos[:, None]] + negs, dim=1)
        m = logits.amax(dim=1, keepdim=True)
        lse = m.squeeze(1) + (logits - m).exp().sum(dim=1).log()
        return (lse - pos).mean()
