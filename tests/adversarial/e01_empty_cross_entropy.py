"""Exploit 1 (uninitialised output), cross_entropy.

Cheat: returns an uninitialised 0-dim tensor of the logits' dtype; no kernel runs.
Should be caught by: uninitialised-output, else wrong-output.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.empty((), dtype=logits.dtype, device=logits.device)
