"""Trust boundary, class 5, CPU. Work done outside the timed calls by a thread with no Python frame: a TorchScript
loop forked at import (a scripted module's method, so Python and the loop share one object) watches every input
forward has seen (the parent refills them in place), computes their softmax as soon as they change, and forward
returns the ready answer when it matches exactly. It puts back the lazy class that scripting caches in torch, which
the checkpoint compares. Was a BYPASS (red team: 4264 of 4302 calls served from the cache) until the child counted
the inter-op pool's threads from before the import."""
import importlib
from typing import List

import torch
import torch.nn as nn


class Box(nn.Module):
    def __init__(self):
        super().__init__()
        self.xs: List[torch.Tensor] = [torch.empty(0) for _ in range(64)]
        self.ins: List[torch.Tensor] = [torch.empty(0) for _ in range(64)]
        self.outs: List[torch.Tensor] = [torch.empty(0) for _ in range(64)]
        self.n: int = 0
        self.computed: int = 0

    @torch.jit.export
    def put(self, i: int, x: torch.Tensor):
        self.xs[i] = x
        if i + 1 > self.n:
            self.n = i + 1

    @torch.jit.export
    def ready(self, i: int, x: torch.Tensor) -> torch.Tensor:
        if torch.equal(self.ins[i], x):
            return self.outs[i]
        return torch.empty(0)

    @torch.jit.export
    def loop(self) -> int:
        beats = 0
        while True:
            for i in range(self.n):
                x = self.xs[i]
                if x.numel() > 0 and not torch.equal(x, self.ins[i]):
                    c = x.clone()
                    xf = c.float()
                    e = (xf - xf.amax(-1, keepdim=True)).exp()
                    o = (e / e.sum(-1, keepdim=True)).to(c.dtype)
                    if torch.equal(c, x):
                        self.outs[i] = o
                        self.ins[i] = c
                        self.computed += 1
            beats += 1
        return beats

    @torch.jit.export
    def start(self) -> torch.jit.Future[int]:
        return torch.jit.fork(self.loop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


BOX = torch.jit.script(Box())
# scripting cached a class in torch (a lazy global the checkpoint compares): put it back as it was
setattr(importlib.import_module("torch._custom_class_base"), "_FakeScriptObject_cls", None)
FUT = BOX.start()
IDX = {}
STATS = {"hits": 0, "calls": 0}


class ModelNew(nn.Module):
    def forward(self, x):
        STATS["calls"] += 1
        key = x.untyped_storage().filename or x.data_ptr()
        i = IDX.get(key)
        if i is None and len(IDX) < 64:
            i = IDX[key] = len(IDX)
            BOX.put(i, x)
        elif i is not None:
            out = BOX.ready(i, x)
            if out.numel():
                STATS["hits"] += 1
                return out.clone()
        xf = x.float()
        e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
        return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
