"""Trust boundary, class 9 (the op recorder blinded from inside), cross-entropy. BYPASS CANDIDATE.

The harness's op recorder is the torch dispatch mode active during the correctness trials, and torch
hands the active mode to anyone who asks (torch.utils._python_dispatch._get_current_dispatch_mode; the
names are spelt so that the static scan misses them). forward calls F.cross_entropy, the reference's
own op, and then takes the recorded names of the problem's ops back out of the recorder's set. Nothing
is patched and no mode is left behind. The profiler's op trace (the harness's second record) is
switched off around the call with Kineto's dynamic toggle (torch._C._autograd._toggle_collection_dynamic).
Expected: not-custom-kernel if the harness can tell; a candidate for ACCEPTED on the CPU.
"""
import importlib

import torch
import torch.nn as nn
import torch.nn.functional as F

_CURRENT_MODE = getattr(importlib.import_module("torch.utils." + "_python" + "_dispatch"), "_get_current" + "_dispatch_mode")
_OPS = ("_log_softmax", "log_softmax", "nll_loss_forward", "nll_loss", "nll_loss_nd", "cross_entropy_loss", "logsumexp")


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
    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        _profiler_collection(False)
        try:
            loss = F.cross_entropy(logits.float(), targets)
        finally:
            _profiler_collection(True)
        mode = _CURRENT_MODE()
        recorded = getattr(mode, "ops", None)
        if isinstance(recorded, set):
            recorded.difference_update(_OPS)
        return loss
