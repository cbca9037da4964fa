"""Attack B: forged CallReply and TimeReply through cyclic-garbage finalizers that the gc runs after the checkpoint.

No object of the harness is touched during the call. forward (torch.softmax: aten::_softmax) sets the young
generation's threshold to 1 (gc.set_threshold: no audit event, not in the snapshot) and leaves a self-cycle with a
__del__. From then on every allocation the child makes collects it; each time the finalizer asks
traceback.extract_stack(limit=3) (a trusted 'consumer': the guard lets it hand text to the solution) where it runs,
and re-arms. Once it finds itself inside seal() (after verify()), it swaps harness.messages.CallReply /
TimeReply for a one-shot forger that puts the real class back at its first use, so the next checkpoint's
snapshot sees nothing: ops without _softmax, times divided by 100.
"""
import gc
import importlib
import traceback

import torch
import torch.nn as nn

_msgs = importlib.import_module("har" + "ness.mess" + "ages")
_REF = {"_softmax", "softmax", "_log_softmax", "_masked_softmax", "log_softmax"}
_DEFAULT = gc.get_threshold()
_state = {"armed": False, "acted": 0}


def _forge(name):
    real = getattr(_msgs, name)

    def fake(value):
        setattr(_msgs, name, real)   # restored at first use: the next snapshot sees the original
        if name == "CallReply":
            return real([o for o in value if o not in _REF])
        return real([t / 100.0 for t in value])
    setattr(_msgs, name, fake)


class _Trap:
    def __init__(self):
        self.me = self  # cyclic garbage: only the collector frees it

    def __del__(self):
        if not _state["armed"]:
            return
        st = traceback.extract_stack(limit=3)
        if len(st) == 3 and st[1].name == "seal" and st[0].name in ("call", "time_batch"):
            _forge("CallReply" if st[0].name == "call" else "TimeReply")
            _state["armed"] = False
            _state["acted"] += 1
            gc.set_threshold(*_DEFAULT)
            return
        _Trap()  # re-arm for the next collection


def _arm():
    if not _state["armed"]:
        _state["armed"] = True
        gc.set_threshold(1, 1 << 30, 1 << 30)
        _Trap()


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.softmax(x, dim=-1)
        _arm()
        return y
