"""Exploit 14 (the reference op itself), infonce: the reference forward, no custom kernel.

Cheat: the reference's own code (F.cosine_similarity, torch.matmul, F.cross_entropy).
Should be caught by: not-custom-kernel (aten::mm and the cross-entropy ops recorded).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

TEMPERATURE = 0.1


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.temperature = TEMPERATURE

    def forward(self, query: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        pos = F.cosine_similarity(query, positive, dim=1) / self.temperature
        neg = torch.matmul(query, negatives.t()) / self.temperature
        logits = torch.cat([pos.unsqueeze(1), neg], dim=1)
        labels = torch.zeros(query.size(0), dtype=torch.long, device=query.device)
        return F.cross_entropy(logits, labels)
