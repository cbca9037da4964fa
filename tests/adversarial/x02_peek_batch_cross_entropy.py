"""Trust boundary, class 2 (inputs known before their call), cross-entropy. CPU.

On the CPU the parent shares every input set of a timed batch as files in one shared-memory folder, all
written before the batch's request. The folder is made unlistable (mode 0300) and the files have random
names, but the child runs as the folder's owner, and an owner may chmod its own folder (os.chmod under
/dev/shm is a write the guard allows; Landlock does not cover metadata). The first timed call of a batch
finds its own input's file (x.untyped_storage().filename), makes the folder listable for a moment, sorts
the files by inode number (tmpfs hands them out in creation order: logits and targets of set 0, of set 1,
..., then the output slots), reads every set of the batch, computes every loss at once and keeps them; the
batch's other calls return the kept loss in microseconds. Every output is correct, the one slow call is
one of up to 32 and the median ignores it. Correctness trials (a dispatch mode is active) are honest.
When it cannot read the batch it returns the loss of the first row only (cheap, and wrong).
Expected: timed-output-wrong or sandbox-violation if the harness can tell; on the CPU there is no
parent-clock check and no physics floor, so this is a candidate for ACCEPTED with a fake median.
"""
import os
import stat

import torch
import torch.nn as nn

# torch.from_file and the dispatch-stack depth, spelt so that the static scan does not see them.
_FROM_FILE = getattr(torch, "from" + "_file")
_DISPATCH_DEPTH = getattr(torch._C, "_len_torch_" + "dispatch_stack")


def _loss(logits, targets):
    x = logits.float()
    m = x.amax(dim=1, keepdim=True)
    lse = m.squeeze(1) + (x - m).exp().sum(dim=1).log()
    picked = x.gather(1, targets.view(-1, 1)).squeeze(1)
    return (lse - picked).mean()


def _fingerprint(logits, targets):
    flat = logits.reshape(-1)
    return (tuple(flat[:3].tolist()), tuple(flat[-3:].tolist()), tuple(targets[:3].tolist()))


def _listing(folder):
    """The folder's files in creation order (inode numbers), made listable for the moment it takes."""
    mode = stat.S_IMODE(os.stat(folder).st_mode)
    os.chmod(folder, 0o700)
    try:
        names = os.listdir(folder)
    finally:
        os.chmod(folder, mode)
    entries = []
    for name in names:
        path = os.path.join(folder, name)
        info = os.stat(path)
        entries.append((info.st_ino, path, info.st_size))
    return [(path, size) for _, path, size in sorted(entries)]


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.kept = {}

    def _batch(self, logits, targets):
        """{file of the logits: (fingerprint, loss)} for every set of the batch in this folder."""
        name = logits.untyped_storage().filename
        if not name:
            return None
        lsize, tsize = logits.numel() * logits.element_size(), targets.numel() * targets.element_size()
        files = _listing(os.path.dirname(name))
        kept, i = {}, 0
        while i + 1 < len(files):
            (lpath, lbytes), (tpath, tbytes) = files[i], files[i + 1]
            if lbytes != lsize or tbytes != tsize:
                break
            other_logits = _FROM_FILE(lpath, shared=True, size=logits.numel(), dtype=logits.dtype).view(logits.shape)
            other_targets = _FROM_FILE(tpath, shared=True, size=targets.numel(), dtype=targets.dtype).view(targets.shape)
            kept[lpath] = (_fingerprint(other_logits, other_targets), _loss(other_logits, other_targets))
            i += 2
        return kept if len(kept) > 1 else None

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if _DISPATCH_DEPTH() > 0 or logits.device.type != "cpu":
            return _loss(logits, targets)  # a correctness trial: honest
        name = logits.untyped_storage().filename
        entry = self.kept.get(name)
        if entry is not None and entry[0] == _fingerprint(logits, targets):
            return entry[1].clone()
        try:
            batch = self._batch(logits, targets)
        except Exception:  # noqa: BLE001
            batch = None
        if batch and name in batch:
            self.kept = batch
            return batch[name][1].clone()
        return _loss(logits[:1], targets[:1])
