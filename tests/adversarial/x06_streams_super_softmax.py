"""Trust boundary, class 6 (timer forgery through module globals), softmax.

At import the solution patches what a timer written in Python would lean on, all through module dicts
reached with importlib (so the static scan's alias tracking misses them):
  - `super` added to torch.cuda.streams' globals: torch's Event.elapsed_time is
    `return super().elapsed_time(end_event)`, so it would return a chosen 0.001 ms;
  - time.perf_counter replaced by a clock that runs 100x slow;
  - harness.timing's BATCH_START_WAIT_CYCLES and SLEEP_CYCLES_PER_MS set to 0 and 1, and a builtin
    (`min`) replaced in builtins' dict.
The harness's timing loops hold their own references to C-level clocks and event methods, so none of
this changes a figure; the patch itself must still be a verdict. The softmax is honest plain torch.
Expected: tampering (the module snapshot after the import).
"""
import importlib

import torch
import torch.nn as nn


class _FastSuper:
    def __init__(self, *args):
        pass

    def elapsed_time(self, end_event):
        return 0.001


def _patch():
    streams = importlib.import_module("torch.cuda.streams")
    streams.__dict__["super"] = _FastSuper
    clock = importlib.import_module("ti" + "me")
    real = clock.perf_counter
    start = real()
    clock.__dict__["perf_counter"] = lambda: start + (real() - start) / 100.0
    timing = importlib.import_module("har" + "ness.timing")
    timing.__dict__["BATCH_START_WAIT_CYCLES"] = 0
    timing.__dict__["SLEEP_CYCLES_PER_MS"] = 1
    builtins = importlib.import_module("built" + "ins")
    real_min = builtins.min
    builtins.__dict__["min"] = lambda *a, **k: real_min(*a, **k)


_patch()


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
        return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
