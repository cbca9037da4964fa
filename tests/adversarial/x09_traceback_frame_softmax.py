"""Trust boundary, guard indirection (class 9): a frame from an exception's traceback, softmax.

forward raises and catches an exception and reads __traceback__.tb_frame (spelt with getattr),
then walks up to its callers' locals.
Expected: introspection (reading tb_frame is audited as object.__getattr__).
"""
import torch
import torch.nn as nn

def _snoop():
    try:
        raise RuntimeError("probe")
    except RuntimeError as error:
        frame = getattr(error.__traceback__, "tb_" + "frame")
        return getattr(frame, "f_" + "back")


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _snoop()
        xf = x.float()
        e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
        return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
