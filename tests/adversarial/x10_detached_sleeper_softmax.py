"""Trust boundary, class 10 (side effects that outlive a call), softmax.

At import (the build phase, where subprocesses are allowed for compilers) the solution starts a
detached process the way daemons do: a shell that starts `setsid sleep` in the background and exits,
so the sleeper is orphaned into a session of its own (a double fork), outside the worker's process group.
In a real attack the sleeper would wake during the timing of other solutions and load the GPU. It also
writes its pid to /dev/shm/x10-sleeper.pid so that the test can check it is gone afterwards.
Then the solution is an honest pure-torch softmax.
Expected: background-process (the parent, a subreaper, finds the orphan after the import), and no
process with the marker's pid alive after the evaluation.
"""
import subprocess

import torch
import torch.nn as nn

MARKER = "/dev/shm/x10-sleeper.pid"
_COMMAND = f"(setsid sh -c 'echo $$ > {MARKER}; exec sleep 613.1031' </dev/null >/dev/null 2>&1 &) ; exit 0"

try:
    subprocess.Popen(["/bin/sh", "-c", _COMMAND], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).wait(10)
except Exception:  # noqa: BLE001
    pass


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
        return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
