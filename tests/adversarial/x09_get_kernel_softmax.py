"""Trust boundary, class 9 (below both op records), softmax: the reference's CPU kernel through public API.

torch.library.get_kernel("aten::_softmax", "CPU") hands back the kernel itself; its call_boxed runs it with no
dispatch at all, so neither the Python key (the op recorder) nor RecordFunction (the op trace) sees the op. The
names of the method and of the key set are built at run time, so the scan (which names both) matches nothing.
On a GPU the kernel profile sees ATen's kernel. Expected: introspection (the lookup is sealed for torch's ops)
or not-custom-kernel.
"""
import torch
import torch.nn as nn

_kernel = torch.library.get_kernel("aten::_softmax", "CPU")
_keys = getattr(torch._C, "DispatchKey" + "Set")(torch._C.DispatchKey.CPU)
_run = getattr(_kernel, "call" + "_boxed")


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _run(_keys, x.contiguous(), -1, False)
