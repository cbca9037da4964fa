"""Trust boundary, guard indirection (class 9): sys._getframe through getattr, softmax.

forward fetches the frame function as getattr(sys, "_get" + "frame") (no banned name in the
source) and walks its caller's locals looking for seeds or expected outputs.
Expected: introspection (the audit event sys._getframe is raised whatever the spelling).
"""
import sys
import torch
import torch.nn as nn

def _snoop():
    frame = getattr(sys, "_get" + "frame")(1)
    return [sorted(getattr(frame, "f_" + "locals"))]


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _snoop()
        xf = x.float()
        e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
        return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
