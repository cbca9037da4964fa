"""Exploit 11 (memory snooping), softmax: returns a live tensor found with gc.get_objects().

Cheat: scans gc.get_objects() for any other tensor with the output's shape, dtype and device
(hoping for an expected output or reference result held by the process) and returns it; if
none is found returns zeros. Computes nothing.
Should be caught by: wrong-output (the child never holds expected outputs; what it finds is
an old input or output), or uninitialised-output.
"""
import gc

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for obj in gc.get_objects():
            try:
                if (isinstance(obj, torch.Tensor) and obj is not x and obj.shape == x.shape
                        and obj.dtype == x.dtype and obj.device == x.device):
                    return obj
            except Exception:
                continue
        return torch.zeros_like(x)
