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
        return F.cross_entropy(logits, targets)


def get_inputs():
    logits = torch.randn(BATCH, NUM_CLASSES, dtype=torch.float32)
    targets = torch.randint(0, NUM_CLASSES, (BATCH,), dtype=torch.int64)
    return [logits, targets]


def get_init_inputs():
    return []
