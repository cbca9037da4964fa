"""Trust boundary, class 9 (the op records are per thread), softmax. Was a BYPASS on Python 3.11 (red team).

forward runs torch.softmax, the reference's own op, in a thread it starts and joins: the op recorder (a
dispatch mode) and the profiler's callbacks both belonged to the serving thread, so neither saw the op; on
3.11 starting a thread raises no audit event, and the thread is gone before the checkpoint counts threads.
Expected: not-custom-kernel (the trials' trace records every thread's ops), or background-thread (3.12 audits
the thread's start and the guard refuses it).
"""
import threading

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        box = []
        worker = threading.Thread(target=lambda: box.append(torch.softmax(x, dim=-1)))
        worker.start()
        worker.join()
        return box[0]
