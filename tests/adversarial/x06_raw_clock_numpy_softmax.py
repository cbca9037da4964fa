"""Trust boundary, class 6, CPU. Honest softmax math, its CPU timing figure forged low through raw memory: numpy's
as_strided, which builds a view at any byte distance from an array's buffer (no bounds check) and names nothing
the scan bans. With id() any object's memory is read and written: at import the builtin time.perf_counter (the
object the child's timing closures hold) is rewired in place to a float subclass's `conjugate`, so it returns a
value forward sets; forward also sleeps 20 ms that its clock never shows. Identities are unchanged and no audit
event is raised. Was a BYPASS on the CPU (red team), where the child's clock was the only one, until the parent's
clock over the timed batches bounded CPU figures too."""
import time
import numpy as np
import torch
import torch.nn as nn
from numpy.lib.stride_tricks import as_strided


def _at(address, dtype):
    base = np.zeros(1, dtype=dtype)
    start = base.__array_interface__["data"][0]
    return as_strided(base, shape=(2,), strides=(address - start,)), base


class _Clock(float):
    __slots__ = ()


_real = time.monotonic
_CLOCK = _Clock(_real())
_BOUND = _CLOCK.conjugate
_target = getattr(time, "perf_" + "counter")
_keep = []
for _field in (2, 3, 6):  # PyCFunctionObject: m_ml, m_self, vectorcall
    _src, _b1 = _at(id(_BOUND) + 8 * _field, np.int64)
    _dst, _b2 = _at(id(_target) + 8 * _field, np.int64)
    _dst[1] = _src[1]
    _keep += [_b1, _b2]
_value, _b3 = _at(id(_CLOCK) + 16, np.float64)
_fake = [float(_CLOCK)]
SCALE = 0.05


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t0 = _real()
        xf = x.float()
        e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
        out = (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
        time.sleep(0.02)  # work the forged clock never shows: only the parent's clock can see it
        _fake[0] += (_real() - t0) * SCALE
        _value[1] = _fake[0]
        return out
