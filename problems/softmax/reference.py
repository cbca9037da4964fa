"""Row-wise softmax over the last dimension of a 2-D tensor (KernelBench level-1 style)."""
import torch
import torch.nn as nn

BATCH = 8192
DIM = 16384


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(BATCH, DIM, dtype=torch.float32)]


def get_init_inputs():
    return []
