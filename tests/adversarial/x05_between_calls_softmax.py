"""Trust boundary, class 5 (work moved between the timed calls), softmax, CPU runs.

Honest torch math, run where the per-call timer did not look. The parent's files are refilled in place for
every batch, so forward keeps each mapped input by its file name and learns which set follows which. A weakref
callback on the returned tensor fires when the timing loop drops it (`del out`, once the call's clock stopped)
and computes the next set's answer, whose data is already in place; the next call returns it at once. A __del__
on a cycle, run as the request ends, forgets the answers. Was a BYPASS on the CPU (median 0.21 ms against 31 ms
honest) until a CPU call's time became its batch's mean, everything between the calls included.
Expected: accepted, at an honest time (tests/test_trust_boundary.py compares it with honest_softmax_torch.py).
"""
import weakref

import torch
import torch.nn as nn

_kept, _succ, _answers, _refs = {}, {}, {}, []
_st = {"prev": None, "sweeper": None}


def _honest(x):
    xf = x.float()
    e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


class _Sweeper:
    def __del__(self):
        _answers.clear()
        _st["prev"] = None
        _st["sweeper"] = None


def _later(name):
    def run(_ref):
        _refs.clear()
        nxt = _succ.get(name)
        if nxt is not None and nxt in _kept and nxt not in _answers:
            _answers[nxt] = _honest(_kept[nxt])
    return run


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _st["sweeper"] is None:
            s = _Sweeper()
            s.me = s
            _st["sweeper"] = weakref.ref(s)
        name = x.untyped_storage().filename
        if name is None:
            return _honest(x)
        _kept[name] = x
        if _st["prev"] is not None:
            _succ[_st["prev"]] = name
        _st["prev"] = name
        out = _answers.pop(name, None)
        if out is None:
            out = _honest(x)
        _refs.append(weakref.ref(out, _later(name)))
        return out
