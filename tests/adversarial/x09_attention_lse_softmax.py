"""Trust boundary, class 9 (the reference under another name), softmax (red team).

CPU flash attention with a query of ones, the row as keys (head dim 1) and scale 1 returns the row's
log-sum-exp beside its output; softmax is then exp(x - lse). None of the recorded ops was in softmax's list
of the reference's ops. Expected: not-custom-kernel (the attention ops are now on the list, as a pattern).
On a GPU the kernel profile sees a library's attention kernel.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, n = x.shape
        xf = x.float()
        query = torch.ones(rows, 1, 1, 1, dtype=xf.dtype)
        values = torch.zeros(rows, 1, n, 1, dtype=xf.dtype)
        _, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, xf.reshape(rows, 1, n, 1), values, scale=1.0)
        return (xf - lse.reshape(rows, 1)).exp().to(x.dtype)
