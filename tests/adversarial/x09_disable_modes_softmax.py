"""Trust boundary, class 9 (the op recorder switched off), softmax. BYPASS CANDIDATE.

forward calls the reference's own op, torch.softmax, inside torch's helper that pops every active
dispatch mode for the duration of a block and pushes them back after it (torch.utils._python_dispatch.
_disable_current_modes; the names are spelt so that the static scan misses them). The harness's op
recorder is such a mode: it never sees aten::_softmax, and the mode stack is whole again when forward
returns, so "modes left active" finds nothing either. The harness also traces aten ops
with the profiler's C++ callbacks: forward switches the running profiler's CPU collection off around
the call (torch._C._autograd._toggle_collection_dynamic, Kineto's own toggle) and back on. On a GPU the
profiler rule would still want a kernel of the solution's own (see x09_disable_modes_cuda_softmax.py).
Expected: not-custom-kernel if the harness can tell; a candidate for ACCEPTED on the CPU.
"""
import importlib
import sys

import torch
import torch.nn as nn

_DISABLE = getattr(importlib.import_module("torch.utils." + "_python" + "_dispatch"), "_disable" + "_current_modes")


def _preimport(name):
    """Import a torch module the helper imports lazily. The child's PYTHONPYCACHEPREFIX sends .pyc reads
    to its scratch folder, which the guard reads as "loading bytecode": for the import, point the prefix
    back at the installed __pycache__ (trusted), then restore it before the harness's next check."""
    set_module_attr = type(sys).__setattr__
    prefix = getattr(sys, "pycache_prefix")
    set_module_attr(sys, "pycache_prefix", None)
    try:
        importlib.import_module(name)
    finally:
        set_module_attr(sys, "pycache_prefix", prefix)


_preimport("torch._subclasses.schema_check_mode")


def _profiler_collection(enabled: bool):
    """Switch the running profiler's CPU op collection (what the harness's second op record reads) on or off."""
    toggle = getattr(torch._C._autograd, "_toggle_collection" + "_dynamic", None)
    if toggle is None:
        return
    try:
        toggle(enabled, {torch.profiler.ProfilerActivity.CPU})
    except Exception:  # noqa: BLE001 - no profiler running: nothing to hide from
        pass


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _profiler_collection(False)
        try:
            with _DISABLE():
                return torch.softmax(x, dim=-1)
        finally:
            _profiler_collection(True)
