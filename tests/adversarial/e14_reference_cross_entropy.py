"""Exploit 14 (the reference op itself), cross_entropy: F.cross_entropy, no custom kernel.

Cheat: returns F.cross_entropy(logits, targets), the reference.
Should be caught by: not-custom-kernel (aten::_log_softmax / nll_loss recorded).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets)
