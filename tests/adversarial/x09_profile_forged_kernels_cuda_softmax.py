"""Trust boundary, class 9 (the kernel profile forged), softmax. GPU only. Was a BYPASS (read from the code).

forward tells the harness's phases apart by the names on its stack (traceback.extract_stack, which the guard
allows): in a correctness trial (the child's `call`) it computes softmax from other torch ops (max, exp, sum,
divide), none of them the reference's own; everywhere else it calls torch.softmax. It has no kernel of its
own. When the kernel profile ran through torch.profiler's Python, forward, seeing `profile` on its stack,
patched `torch.profiler.profile.stop` for one use: the patch restores the class, stops the trace, and shadows
`key_averages` on the instance with a list that shows one kernel of its own. The class is whole again at the
checkpoint, and the list is read after it: ranked as a custom kernel at torch's own speed.
Expected: not-custom-kernel (the profile's C++ trace sees softmax and library kernels only), or tampering
(the patch, never called, is still in place at the checkpoint).
"""
import traceback

import torch
import torch.nn as nn


class _ForgedEvent:
    key = "x09_own_softmax_kernel"
    count = 2
    device_type = "DeviceType.CUDA"
    device_time_total = 200.0


_PATCHED = []


def _shadow_once():
    if _PATCHED:  # the profile makes two calls: one patch
        return
    _PATCHED.append(True)
    profile = torch.profiler.profile
    original = profile.stop

    def stop(self):
        profile.stop = original  # the class is whole again before anything looks
        original(self)
        self.key_averages = lambda *args, **kwargs: [_ForgedEvent()]

    profile.stop = stop


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        names = {frame.name for frame in traceback.extract_stack()}
        if "call" in names:  # a correctness trial: no op of the reference's
            shifted = (x - x.amax(dim=-1, keepdim=True)).exp()
            return shifted / shifted.sum(dim=-1, keepdim=True)
        if "profile" in names:
            _shadow_once()
        return torch.softmax(x, dim=-1)
