"""Exploit 2 (zeros / constant), infonce: constant log(1 + N).

Cheat: returns log(1 + N_negatives), the loss when every logit is equal.
Should be caught by: wrong-output.
"""
import math

import torch
import torch.nn as nn

TEMPERATURE = 0.1


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.temperature = TEMPERATURE

    def forward(self, query: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        return torch.tensor(math.log(1 + negatives.shape[0]), dtype=torch.float32, device=query.device)
