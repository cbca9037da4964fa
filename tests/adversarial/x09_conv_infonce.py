"""Trust boundary, class 9 (the reference under another name), InfoNCE (red team).

The logits q . n^T from a 1x1 convolution (queries as a (B, D, 1, 1) image, the negatives as N filters; on the
CPU aten::mkldnn_convolution, never aten::mm), the loss from exp and log. Expected: not-custom-kernel
('*conv[!e]*' is on the list).
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
        rows, features = query.shape
        qn = query.norm(dim=1).clamp_min(1e-8)
        pn = positive.norm(dim=1).clamp_min(1e-8)
        pos = ((query / qn[:, None]) * (positive / pn[:, None])).sum(1) / self.temperature
        sims = F.conv2d(query.reshape(rows, features, 1, 1), negatives.reshape(-1, features, 1, 1)).reshape(rows, -1)
        logits = torch.cat([pos[:, None], sims / self.temperature], dim=1).double()
        top = logits.amax(1, keepdim=True)
        lse = top[:, 0] + (logits - top).exp().sum(1).log()
        return (lse - logits[:, 0]).mean().float()
