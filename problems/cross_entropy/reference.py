"""Mean cross-entropy loss of logits against integer class targets (KernelBench level-1 style)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8192
NUM_CLASSES = 32000


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # bf16 logits: the loss is accumulated and returned in float32 (a bf16 scalar keeps 8 bits, which
        # hides a mean taken over a subsample of the rows); float32 and float64 logits are used as they are.
        return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets)


def get_inputs():
    logits = torch.randn(BATCH, NUM_CLASSES, dtype=torch.float32)
    targets = torch.randint(0, NUM_CLASSES, (BATCH,), dtype=torch.int64)
    return [logits, targets]


def get_init_inputs():
    return []
