"""Trust boundary, class 11 (the parent runs what the child sends), softmax.

At import the solution finds the pipes it holds (os.fstat over fds 3..64: FIFOs opened for writing; the
reply pipe is also named on its command line) and writes forged frames into each: a frame whose payload
is a pickle that would create /dev/shm/x11-unpickled when unpickled (os.system via __reduce__), and a
JSON reply that claims the load went well, with a made-up authentication tag. A parent that unpickled,
eval'ed or trusted untagged replies would run the command or accept the forgery.
Expected: bad-reply (the frame fails authentication; nothing is unpickled), and no marker file.
"""
import fcntl
import json
import os
import pickle
import stat
import struct

import torch
import torch.nn as nn

MARKER = "/dev/shm/x11-unpickled"


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


def _frames():
    pickled = pickle.dumps(_Payload())
    forged = json.dumps({"status": "ok", "load_s": 0.0, "rebuilt": False, "sandbox": "none", "cpus": ""}).encode()
    return [struct.pack(">I", len(body)) + os.urandom(32) + body for body in (pickled, forged)]


def _write_pipes():
    written = []
    for fd in range(3, 65):
        try:
            info = os.fstat(fd)
            if not stat.S_ISFIFO(info.st_mode):
                continue
            if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
                continue
            for frame in _frames():
                os.write(fd, frame)
            written.append(fd)
        except OSError:
            continue
    return written


_WRITTEN = _write_pipes()


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        e = (xf - xf.amax(dim=-1, keepdim=True)).exp()
        return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
