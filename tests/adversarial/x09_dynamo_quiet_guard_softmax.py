"""Trust boundary, class 9 (the guard switched off through torch's frame-evaluation hook), softmax. (A bypass, now closed.)

The runtime guard is an audit hook written in Python; its closure holds `quiet`, the set of thread ids
whose events it ignores. torch._C._dynamo.eval_frame.set_eval_frame (torch.compile's PEP 523 hook; no
audit event; spelt with getattr so the static scan misses it) makes the interpreter hand every frame the
serving thread is about to run, closure cells included, to a callback of the solution. The solution
installs one, makes a harmless event the guard judges (listing /dev/shm), receives the guard's own frames,
and adds its thread to `quiet`. From then on nothing it does is judged: it reads frames with
sys._getframe, walks up to the child's serve() and wraps the "call" handler so that the reference's ops
never reach the reply; forward is torch.softmax.
This was accepted by the harness of 2026-12-04 20:11. Expected now: introspection (the hook setters are
refused before the solution loads).
"""
import importlib
import os
import sys
import threading

import torch
import torch.nn as nn

_SET_CALLBACK = getattr(importlib.import_module("torch._C._dyn" + "amo.eval_frame"), "set_eval" + "_frame")
_REFERENCE_OPS = {"_softmax", "softmax", "_safe_softmax"}
_STATE = {"quiet": None, "wrapped": False}


def _attr(obj, *parts):
    return getattr(obj, "".join(parts))


def _continue():
    try:
        return importlib.import_module("torch._dyn" + "amo.types").ConvertFrameReturn()
    except Exception:  # noqa: BLE001
        return None


def _callback(frame, *rest):
    try:
        if _STATE["quiet"] is None:
            names = _attr(frame, "f_", "code").co_freevars
            for name, cell in zip(names, _attr(frame, "clo", "sure") or ()):
                value = _attr(cell, "cell_", "contents")
                if name == "quiet" and type(value) is set:
                    value.add(threading.get_ident())
                    _STATE["quiet"] = value
    except Exception:  # noqa: BLE001
        pass
    return _continue()


def _silence_guard():
    previous = _SET_CALLBACK(_callback)
    try:
        os.listdir("/dev/shm")  # an event the guard judges and allows: its frames run under the callback
    finally:
        _SET_CALLBACK(previous)
    return _STATE["quiet"] is not None


def _wrap_call_handler():
    frame = _attr(sys, "_get", "frame")(0)  # fatal if the guard still watches this thread
    while frame is not None:
        names = _attr(frame, "f_", "locals")
        handlers = names.get("handlers")
        if isinstance(handlers, dict) and "call" in handlers:
            phase, real = handlers["call"]

            def call(msg):
                reply = real(msg)
                reply["ops"] = [op for op in reply["ops"] if op not in _REFERENCE_OPS]
                return reply
            handlers["call"] = (phase, call)
            return True
        frame = _attr(frame, "f_", "back")
    return False


def _softmax(x):
    xf = x.float()
    e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _STATE["wrapped"]:
            _STATE["wrapped"] = True
            if _silence_guard():
                _wrap_call_handler()
            return _softmax(x)  # this call's ops are already being recorded: stay honest
        return torch.softmax(x, dim=-1)
