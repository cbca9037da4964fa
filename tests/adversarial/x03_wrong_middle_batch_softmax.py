"""Wrong outputs (zeros) for every call of the second timed batch, right ones everywhere else, times kept noisy
so that timing goes on past it. The last batch is verified whole whichever it is; before, the only other check
was a sample of 2 calls out of all the timed ones, which missed the 32 wrong calls about two times in three.
Now each call of every batch is verified with a secret 1-in-4 chance: 32 wrong calls pass with odds 1e-4."""
import time
import traceback

import torch
import torch.nn as nn

_n = {"timed": 0}
PER_BATCH = 32  # the sets of a timed batch at the small shapes


def _softmax(x):
    xf = x.float()
    e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


class ModelNew(nn.Module):
    def forward(self, x):
        if not any(f.name == "timed_batch" for f in traceback.extract_stack(limit=5)):
            return _softmax(x)
        i = _n["timed"]
        _n["timed"] += 1
        if i % 2:
            time.sleep(0.0003)  # noisy times: the standard error stays over 1%, so timing goes on
        if PER_BATCH <= i < 2 * PER_BATCH:
            return torch.zeros_like(x)
        return _softmax(x)
