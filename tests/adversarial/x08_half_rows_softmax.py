"""Trust boundary, class 8 (a figure the work cannot give: half the output), softmax.

The correctness trials run under the harness's op recorder, a torch dispatch mode, which forward can
see (the depth of the dispatch-mode stack; the name is spelt so that the static scan misses it): there
it is honest. Everywhere else (warm-up, timed batches, the escape check) it computes only the first
half of the rows and leaves the rest uninitialised: half the bytes, so on a GPU a median that implies
more than the copy bandwidth.
Expected: timed-output-wrong (the timed calls' outputs are checked), or impossible-time.
"""
import torch
import torch.nn as nn

_DISPATCH_DEPTH = getattr(torch._C, "_len_torch_" + "dispatch_stack")


def _softmax(x):
    xf = x.float()
    e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _DISPATCH_DEPTH() > 0 or x.shape[0] < 2:
            return _softmax(x)
        out = torch.empty_like(x)
        half = x.shape[0] // 2
        out[:half] = _softmax(x[:half])
        return out
