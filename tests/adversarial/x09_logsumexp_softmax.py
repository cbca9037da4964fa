"""Trust boundary, class 9 (the reference under another name), softmax (red team).

exp(x - logsumexp(x)): aten::logsumexp computes the row's log-sum-exp itself, and it was not on softmax's list.
Expected: not-custom-kernel ('*logsumexp*' is on the list now).
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return torch.exp(xf - torch.logsumexp(xf, -1, keepdim=True)).to(x.dtype)
