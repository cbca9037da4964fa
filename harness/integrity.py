"""Detectors that run inside the solution's process, with evidence for a rejection.

- TamperGuard: a snapshot, taken before the solution is imported, of the torch, time and harness
  attributes the harness relies on; any later difference is tampering.
- ThreadWatch: Python threads the solution left running (work deferred to a background thread).
- AtenOpRecorder: the aten ops a forward call dispatched; the problem's own op means no custom kernel.
- poison_freed: fill freed CUDA blocks with 0xFF bytes (NaN in every float format), so that an output
  that is never written cannot pass off leftover memory as a result.
"""
from __future__ import annotations

import sys
import threading
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_WATCHED = [
    (torch.cuda.Event, ("elapsed_time", "record", "synchronize", "query", "__init__")),
    (torch.cuda, ("synchronize", "current_stream", "Event")),
    (torch, ("allclose", "equal", "isclose", "manual_seed", "randn", "randint", "rand", "empty", "zeros")),
    (torch.testing, ("assert_close",)),
    (torch.Tensor, ("copy_", "clone", "to", "float", "contiguous", "zero_", "fill_", "__eq__", "abs", "max", "sum", "view", "equal")),
    (torch.nn.functional, ("normalize", "cross_entropy", "softmax", "cosine_similarity")),
    (time, ("perf_counter", "perf_counter_ns", "time", "monotonic")),
]


def _describe(owner) -> str:
    return getattr(owner, "__qualname__", None) or getattr(owner, "__name__", repr(owner))


class TamperGuard:
    def __init__(self, harness_modules=()):
        self._entries = []
        for owner, names in _WATCHED:
            for name in names:
                self._watch(owner, name, f"{_describe(owner)}.{name}")
        for module in harness_modules:
            for name, value in list(vars(module).items()):
                if callable(value) and not name.startswith("__"):
                    self._watch(module, name, f"{module.__name__}.{name}")
                    if isinstance(value, type) and value.__module__ == module.__name__:
                        for method, function in list(vars(value).items()):
                            if callable(function):
                                self._watch(value, method, f"{module.__name__}.{name}.{method}")
        self._modules = {m.__name__: m for m in harness_modules}

    def _watch(self, owner, name, label):
        value = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        code = getattr(value, "__code__", None)
        self._entries.append((owner, name, label, value, code))

    def violations(self) -> list:
        found = []
        for owner, name, label, value, code in self._entries:
            now = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
            if now is not value:
                found.append(f"{label} was replaced")
            elif code is not None and getattr(now, "__code__", None) is not code:
                found.append(f"{label}.__code__ was replaced")
        for name, module in self._modules.items():
            if sys.modules.get(name) is not module:
                found.append(f"module {name} was replaced in sys.modules")
        return found


class ThreadWatch:
    def __init__(self):
        self._before = {t.ident for t in threading.enumerate()}

    def new_threads(self) -> list:
        return [t.name for t in threading.enumerate()
                if t.ident not in self._before and t.is_alive() and not _infrastructure(t)]


def _infrastructure(thread) -> bool:
    """Threads the harness's own plumbing starts (the pipe's file-descriptor sharer, torch internals)."""
    target = getattr(thread, "_target", None)
    module = getattr(target, "__module__", "") or ""
    owner = getattr(getattr(target, "__self__", None), "__class__", type(None)).__module__
    return any(m.startswith(("multiprocessing.", "torch.")) for m in (module, owner))


class AtenOpRecorder(TorchDispatchMode):
    """Records the aten op names a forward call dispatches (custom extension calls do not dispatch)."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func._overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def poison_freed(nbytes_list) -> None:
    """Claim cached CUDA blocks of these sizes, fill them with 0xFF, and free them again."""
    if not torch.cuda.is_available():
        return
    for nbytes in nbytes_list:
        if nbytes > 0:
            block = torch.empty(int(nbytes), dtype=torch.uint8, device="cuda")
            block.fill_(0xFF)
            del block
