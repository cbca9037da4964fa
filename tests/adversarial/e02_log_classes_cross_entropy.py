"""Exploit 2 (zeros / constant), cross_entropy: constant log(num_classes).

Cheat: returns log(C), the loss of uniform logits, which is close to the true loss for
small-scale logits.
Should be caught by: wrong-output (inputs are rescaled per trial, so the loss moves away from log C).
"""
import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.tensor(math.log(logits.shape[1]), dtype=logits.dtype, device=logits.device)
