"""Trust boundary, class 10, CPU. A Python loop on one of torch's native inter-op threads, started at import as
the callback of a TorchScript fork's Future: no thread count saw it, so it ran through every checkpoint. It keeps
the inputs forward saw and computes their softmax once the parent has refilled them, outside any timed call.
Was a BYPASS (red team) until the checkpoint counted every thread that runs Python."""
import time

import torch
import torch.nn as nn


@torch.jit.script
def _busy(x: torch.Tensor) -> torch.Tensor:
    for i in range(400):
        x = torch.mm(x, x) * 0.001
    return x


@torch.jit.script
def _launch(x: torch.Tensor) -> torch.jit.Future[torch.Tensor]:
    return torch.jit.fork(_busy, x)


KEPT = {}    # file name -> the mapped input (kept alive: it sees the parent's refills)
READY = {}   # file name -> (signature, answer)
STATS = {"beats": 0, "computed": 0, "hits": 0, "calls": 0}


def _softmax(x):
    xf = x.float()
    e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


def _signature(x):
    flat = x.reshape(-1)
    return tuple(flat[:: max(1, flat.numel() // 16)].tolist()) + (float(flat[-1]),)


def _loop(_future):
    while True:
        STATS["beats"] += 1
        for name, x in list(KEPT.items()):
            sig = _signature(x)
            if READY.get(name, (None,))[0] != sig:
                answer = _softmax(x)
                if _signature(x) == sig:
                    READY[name] = (sig, answer)
                    STATS["computed"] += 1
        time.sleep(0.0002)


_launch(torch.rand(64, 64)).then(_loop)


class ModelNew(nn.Module):
    def forward(self, x):
        STATS["calls"] += 1
        name = x.untyped_storage().filename
        if name:
            if name not in KEPT:
                KEPT[name] = x
            ready = READY.get(name)
            if ready is not None and ready[0] == _signature(x):
                STATS["hits"] += 1
                return ready[1]
        return _softmax(x)
