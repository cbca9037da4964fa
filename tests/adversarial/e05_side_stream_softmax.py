"""Exploit 5 (side stream, Python), softmax. GPU only.

Cheat: runs the (honest, plain torch) softmax on a private torch.cuda.Stream and returns without
making the current stream wait. Timing events recorded on the current stream see almost nothing;
the work finishes later, so a checker that synchronizes the device still sees right values.
Should be caught by: escaped-timing (host-clock batch), impossible-time (physics floor), or
timed-output-wrong / wrong-output if read before the side stream finished. On the GPU it also has
no custom kernel, so not-custom-kernel is an acceptable catch too.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.side is None:
            self.side = torch.cuda.Stream(device=x.device)
        with torch.cuda.stream(self.side):  # no wait_stream either way
            xf = x.float()
            e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
            y = (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
        return y
