"""Trust boundary, class 6 (timer forgery touching nothing watched), softmax. (A bypass, now closed.)

A signal handler receives the frame that was running when the signal arrived, and no audit event is
raised for that, nor for reading frame.f_back / frame.f_locals (the names are spelt with getattr so the
static scan does not see them). At import the solution raises a signal at itself, walks from the frame
it is handed up to the child's serve() frame and takes its locals: the `handlers` dict that the request
loop looks each command up in, afresh for every request. It wraps the handlers (a dict in a frame: no
module, no class, nothing the snapshot watches):
  - "time": every timed call is reported at a fraction of its measured time; the "null" yardstick
    batches (the parent's clock check) are slowed down by as much as the real calls took, so the
    parent's clock sees no difference between the calls and nothing;
  - "burst"/"queued": the launch time reported is the batch's wall time (the escape bound follows it),
    the device time is the claimed median;
  - "call": the reference's aten ops are removed from the reply's op list;
  - "profile": every kernel is reported as the solution's own.
forward is torch.softmax in float64 (correct, and slow on purpose). On the GPU the claimed median is
8% above what the copy bandwidth allows (measured here), so the physics floor holds too.
This was accepted by the harness of 2026-12-04 19:50 (the child then served requests in its main thread).
Expected now: import-error (the child serves from a second thread and Python lets only the main thread
install signal handlers), or tampering (a handler left installed) where it gets that far.
"""
import signal
import time

import torch
import torch.nn as nn

_REFERENCE_OPS = {"_softmax", "softmax", "_safe_softmax"}


def _attr(obj, *parts):
    return getattr(obj, "".join(parts))


def _serve_locals():
    """The locals of harness/child.py's serve(), reached from a signal handler's frame."""
    box = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: box.append(frame))
    try:
        signal.raise_signal(signal.SIGUSR2)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    frame = box[0] if box else None
    while frame is not None:
        names = _attr(frame, "f_", "locals")
        if isinstance(names.get("handlers"), dict) and "timer" in names:
            return names
        frame = _attr(frame, "f_", "back")
    return None


def _copy_bandwidth(device) -> float:
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


def _install():
    env = _serve_locals()
    if env is None:
        return False
    handlers, device = env["handlers"], env["device"]
    cuda = device.type == "cuda"
    bandwidth = _copy_bandwidth(device) if cuda else 0.0
    seen = {"per_call_ms": 0.0}

    def claim(true_ms, nbytes):
        if not cuda:
            return true_ms * 0.01
        return min(true_ms, 1.08 * nbytes / bandwidth * 1e3)

    def wrap(command, make):
        phase, real = handlers[command]
        handlers[command] = (phase, make(real))

    def timed(real):
        def handler(msg):
            if msg.get("null"):
                reply = real(msg)
                time.sleep(seen["per_call_ms"] * len(reply["times_ms"]) / 1e3)
                return reply
            reply = real(msg)
            times = reply["times_ms"]
            seen["per_call_ms"] = sum(times) / max(1, len(times))
            nbytes = seen.get("bytes", 0.0)
            reply["times_ms"] = [claim(t, nbytes) for t in times]
            return reply
        return handler

    def burst(real):
        def handler(msg):
            reply = real(msg)
            reply["launch_ms_per_call"] = max(reply["launch_ms_per_call"], reply["wall_ms_per_call"]) * 1.2
            if "events_ms_per_call" in reply:
                reply["events_ms_per_call"] = reply["wall_ms_per_call"]
            return reply
        return handler

    def queued(real):
        def handler(msg):
            reply = real(msg)
            if reply.get("device_ms") is not None:
                reply["device_ms"] = claim(reply["device_ms"], seen.get("bytes", 0.0))
            return reply
        return handler

    def checked(real):
        def handler(msg):
            reply = real(msg)
            reply["ops"] = [op for op in reply["ops"] if op not in _REFERENCE_OPS]
            return reply
        return handler

    def profiled(real):
        def handler(msg):
            reply = real(msg)
            for kernel in reply.get("kernels", []):
                kernel["own"] = True
                kernel["name"] = "x06_fused_softmax_kernel"
            reply["own_kernels"] = max(1, reply["kernel_count"])
            reply["own_share"] = 1.0
            return reply
        return handler

    wrap("time", timed)
    wrap("burst", burst)
    wrap("queued", queued)
    wrap("call", checked)
    wrap("profile", profiled)
    _STATE["seen"] = seen
    return True


_STATE = {}
_STATE["installed"] = _install()


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if "seen" in _STATE:
            _STATE["seen"]["bytes"] = 2.0 * x.numel() * x.element_size()
        return torch.softmax(x.double(), dim=-1).to(x.dtype)
