"""Trust boundary, class 6 (timer forgery touching nothing watched), softmax. (A bypass, now closed.)

torch ships a frame-evaluation hook (PEP 523) for torch.compile: torch._C._dynamo.eval_frame.set_eval_frame
installs a callback that the interpreter calls, in the current thread, with every Python frame it is
about to run, as an object exposing the frame's code, locals and closure cells. No audit event is raised
for installing it or for reading what it hands over, nothing the module snapshot watches changes, and the
names are spelt with getattr so the static scan does not see them. The first forward call, which runs in
the serving thread, installs such a callback; the frames the child runs next (its checkpoint, the next
request's handler) hand over the cells of the child's serve(): the timer, the "is this a solution" flag
the checkpoint reads, the op recorder class and the profiler the correctness trials use. The solution then
  - sets the checkpoint's `is_solution` cell to False (no snapshot, mode, signal or thread check runs);
  - replaces the timer's timed_batch / burst / queued with wrappers that report a fraction of each
    measured time (on the GPU: 8% above what the bandwidth it measured allows), slow down the parent's
    "null" yardstick batches by what the real calls took, and report burst launch times that cover the
    batch's wall time;
  - puts a recorder that records nothing, and a profiler trace with no events, in place of the op
    recorders, and a kernel profile that calls every kernel its own;
and from then on forward is torch.softmax in float64 (the reference's own op; correct; slow).
This was accepted by the harness of 2026-12-04 20:11. Expected now: introspection (the child replaces every
module's reference to torch's hook setters with a refusal before the solution loads).
"""
import importlib
import time

import torch
import torch.nn as nn

_EVAL_FRAME = importlib.import_module("torch._C._dyn" + "amo.eval_frame")
_SET_CALLBACK = getattr(_EVAL_FRAME, "set_eval" + "_frame")
_WANTED = ("timer", "is_solution", "AtenOpRecorder", "op_trace", "profiling")
_CELLS = {}
_STATE = {"installed": False, "done": False, "bytes": 0.0, "per_call_ms": 0.0, "bandwidth": 0.0}


def _attr(obj, *parts):
    return getattr(obj, "".join(parts))


def _continue():
    try:
        return importlib.import_module("torch._dyn" + "amo.types").ConvertFrameReturn()
    except Exception:  # noqa: BLE001
        return None


def _callback(frame, *rest):
    try:
        cells = _attr(frame, "clo", "sure") or ()
        names = _attr(frame, "f_", "code").co_freevars
        for name, cell in zip(names, cells):
            if name in _WANTED and name not in _CELLS:
                _CELLS[name] = cell
                _apply(name, cell)
    except Exception:  # noqa: BLE001
        pass
    return _continue()


class _NoRecorder:
    def __init__(self, *args, **kwargs):
        self.ops = set()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def events(self):
        return []


class _OwnKernels:
    @staticmethod
    def profile_kernels(model, inputs, calls=2):
        for _ in range(calls):
            model(*inputs)
        torch.cuda.synchronize()
        kernel = {"name": "x06_fused_softmax_kernel", "calls": calls, "us": 1.0, "own": True}
        return {"kernels": [kernel], "kernel_count": 1, "own_share": 1.0, "own_kernels": 1}


def _claim(true_ms):
    if _STATE["bandwidth"] <= 0:
        return true_ms * 0.01
    return min(true_ms, 1.08 * _STATE["bytes"] / _STATE["bandwidth"] * 1e3)


def _forge_timer(timer):
    real_batch, real_burst, real_queued = timer.timed_batch, timer.burst, timer.queued

    def timed_batch(fn, sets, slots):
        times = real_batch(fn, sets, slots)
        if not isinstance(fn, nn.Module):  # the parent's "null" yardstick: make it as slow as the real calls
            time.sleep(_STATE["per_call_ms"] * len(times) / 1e3)
            return times
        _STATE["per_call_ms"] = sum(times) / max(1, len(times))
        return [_claim(t) for t in times]

    def burst(fn, sets, calls):
        result = dict(real_burst(fn, sets, calls))
        result["launch_ms_per_call"] = 1.2 * max(result["launch_ms_per_call"], result["wall_ms_per_call"])
        if "events_ms_per_call" in result:
            result["events_ms_per_call"] = result["wall_ms_per_call"]
        return result

    def queued(fn, sets, slots, host_ms_per_call, *args):
        device_ms = real_queued(fn, sets, slots, host_ms_per_call, *args)
        return None if device_ms is None else _claim(device_ms)

    timer.timed_batch, timer.burst, timer.queued = timed_batch, burst, queued


def _apply(name, cell):
    contents = _attr(cell, "cell_", "contents")
    if name == "is_solution":
        setattr(cell, "cell_" + "contents", False)
    elif name == "timer":
        _forge_timer(contents)
    elif name == "AtenOpRecorder" or name == "op_trace":
        setattr(cell, "cell_" + "contents", _NoRecorder)
    elif name == "profiling":
        setattr(cell, "cell_" + "contents", _OwnKernels)


def _bandwidth(device):
    src = torch.empty(2**28, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best


def _softmax(x):
    xf = x.float()
    e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _STATE["installed"]:
            _STATE["installed"] = True
            if x.is_cuda:
                _STATE["bandwidth"] = _bandwidth(x.device)
            _SET_CALLBACK(_callback)  # this thread's frames from now on
            return _softmax(x)  # this call is recorded: stay honest
        _STATE["bytes"] = 2.0 * x.numel() * x.element_size()
        if not _STATE["done"] and all(name in _CELLS for name in _WANTED[:4]):
            _STATE["done"] = True
        return torch.softmax(x.double(), dim=-1).to(x.dtype)
