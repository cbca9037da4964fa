"""Trust boundary, class 3 (check bookkeeping: write into the output after the call), cross-entropy.

forward returns a cheap wrong loss (zero) at once and keeps the returned tensor and a weakref to it;
the real loss is computed at the start of the next call (or when the tensor is about to die, from a
weakref.finalize callback) and written into the tensor it returned earlier. A checker that compares the
returned tensor later, or that keeps a reference to it, would see the right value. Here the child copies
each output into the parent's slot right after the call, so the late write changes nothing the parent
reads.
Expected: wrong-output (or timed-output-wrong, uninitialised-output).
"""
import weakref

import torch
import torch.nn as nn


def _loss(logits, targets):
    x = logits.float()
    m = x.amax(dim=1, keepdim=True)
    lse = m.squeeze(1) + (x - m).exp().sum(dim=1).log()
    picked = x.gather(1, targets.view(-1, 1)).squeeze(1)
    return (lse - picked).mean()


def _write_late(out, logits, targets):
    try:
        out.copy_(_loss(logits, targets))
    except Exception:  # noqa: BLE001
        pass


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.pending = None
        self.refs = []

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:  # fix the previous call's output now
            _write_late(*self.pending)
            self.pending = None
        out = torch.zeros((), dtype=torch.float32, device=logits.device)
        self.pending = (out, logits, targets)
        self.refs.append(weakref.ref(out))
        self.refs = self.refs[-64:]
        return out
