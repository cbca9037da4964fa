"""Exploit 7 (lazy result), softmax: a torch.Tensor subclass filled on first touch.

Cheat: forward allocates an uninitialised buffer, wraps it in a Tensor subclass and returns it
without computing anything. The subclass's __torch_function__ runs the (honest, plain torch)
softmax into its own storage the first time any torch function touches it (comparison, .cpu(),
indexing, allclose...), i.e. after forward returned and outside the timed region and any
dispatch mode active during forward.
Should be caught by: bad-output (result is not a plain torch.Tensor); else escaped-timing /
uninitialised-output if the raw storage is read.
"""
import torch
import torch.nn as nn
from torch._C import DisableTorchFunctionSubclass


class LazySoftmax(torch.Tensor):
    @staticmethod
    def create(x):
        t = torch.Tensor._make_subclass(LazySoftmax, torch.empty_like(x))
        t._src, t._done = x, False
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        for a in list(args) + list((kwargs or {}).values()):
            if isinstance(a, LazySoftmax) and not getattr(a, "_done", True):
                a._done = True
                with DisableTorchFunctionSubclass():
                    xf = a._src.float()
                    e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
                    a.copy_(e / e.sum(dim=-1, keepdim=True))
        return super().__torch_function__(func, types, args, kwargs)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return LazySoftmax.create(x)
