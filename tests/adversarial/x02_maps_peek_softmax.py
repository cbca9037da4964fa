"""Trust boundary, class 2 (inputs known before their call), softmax. CPU.

The fix for x02_peek_batch (no chmod or listing under /dev/shm) leaves the names in plain sight: the
child maps every set of a timed batch before its first call, and /proc/self/maps (the child's own, which
it may read) lists each mapping with its file. The first timed call of a batch finds its own file's
folder there, reads every other file of that folder that is mapped now with plain open() (a read under
/dev/shm is allowed; the output slots are skipped: still poison, all NaN), computes every softmax at once
and keeps them by file, with a fingerprint of the values; the batch's other calls return the kept result
in microseconds. Every output is correct; the one slow call is one of up to 32 and the median ignores it.
A kept result whose fingerprint does not match (the parent refilled the file) is computed afresh.
Expected: timed-output-wrong or sandbox-violation if the harness can tell; on the CPU there is no
parent-clock check, so this is a candidate for ACCEPTED with a fake median.
"""
import os

import torch
import torch.nn as nn

_MAPS = "/" + "proc/self/maps"


def _softmax(x):
    xf = x.float()
    e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


def _fingerprint(flat):
    n = flat.numel()
    picks = [0, 1, n // 3, n // 2, n - 2, n - 1] if n > 1 else [0]
    return tuple(flat[i].item() for i in picks)


def _mapped_siblings(path):
    folder = os.path.dirname(path) + "/"
    found = set()
    with open(_MAPS) as handle:
        for line in handle:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].strip().startswith(folder):
                found.add(parts[5].strip())
    return found


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.kept = {}

    def _compute_all(self, x, own):
        self.kept.clear()
        nbytes = x.numel() * x.element_size()
        for path in _mapped_siblings(own):
            try:
                with open(path, "rb") as handle:
                    data = handle.read(nbytes)
            except OSError:
                continue
            if len(data) != nbytes:
                continue
            flat = torch.frombuffer(bytearray(data), dtype=x.dtype)
            if torch.isnan(flat).all():
                continue  # an output slot, still poison
            self.kept[path] = (_fingerprint(flat), _softmax(flat.view(x.shape)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        own = x.untyped_storage().filename
        if own is None or x.storage_offset() or not x.is_contiguous():
            return _softmax(x)
        entry = self.kept.pop(own, None)
        if entry is not None and entry[0] == _fingerprint(x.reshape(-1)):
            return entry[1]
        self._compute_all(x, own)
        entry = self.kept.pop(own, None)
        return entry[1] if entry is not None else _softmax(x)
