"""Exploit 6 (background thread), softmax, GPU variant. GPU only.

Cheat: forward returns torch.empty_like(x) at once; a threading.Thread enqueues the (honest,
plain torch) softmax on the GPU shortly after forward returned, from its own thread (whose
current stream is the default stream, and outside any dispatch mode of the calling thread).
The timed region sees an empty forward; the kernels run later.
Should be caught by: background-thread; else escaped-timing / impossible-time, or
uninitialised-output / wrong-output / timed-output-wrong if read too early. On the GPU
not-custom-kernel is also an acceptable catch (no custom kernel).
"""
import threading
import time

import torch
import torch.nn as nn


def _fill(x, out):
    time.sleep(0.005)
    with torch.cuda.device(x.device):
        xf = x.float()
        e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
        out.copy_(e / e.sum(dim=-1, keepdim=True))


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        threading.Thread(target=_fill, args=(x, out), daemon=True).start()
        return out
