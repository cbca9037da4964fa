"""Exploit 1 (uninitialised output), infonce.

Cheat: returns an uninitialised 0-dim fp32 tensor; no kernel runs.
Should be caught by: uninitialised-output, else wrong-output.
"""
import torch
import torch.nn as nn

TEMPERATURE = 0.1


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.temperature = TEMPERATURE

    def forward(self, query: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        return torch.empty((), dtype=torch.float32, device=query.device)
