"""Exploit 14 (the reference under another name), softmax: torch.sparse.softmax on a sparse copy of the dense
input. aten::_sparse_softmax was not among softmax's core ops (red team). Expected: not-custom-kernel."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sparse.softmax(x.float().to_sparse(), -1).to_dense().to(x.dtype)
