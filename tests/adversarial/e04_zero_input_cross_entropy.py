"""Exploit 4 (mutating inputs), cross_entropy: zeroes the logits in place, returns log(C).

Cheat: logits.zero_() then the honest loss of the zero logits (= log C). A reference run
afterwards on the same tensors would agree.
Should be caught by: input-mutated, else wrong-output.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits.zero_()
        x = logits.float()
        m = x.amax(dim=1, keepdim=True)
        lse = m.squeeze(1) + (x - m).exp().sum(dim=1).log()
        return (lse - x.gather(1, targets.view(-1, 1)).squeeze(1)).mean().to(logits.dtype)
