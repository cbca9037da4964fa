"""Recorders that run inside the solution's process (the guard against tampering is harness/guard.py).

- AtenOpRecorder: the aten ops a forward call dispatched; the problem's own op means no custom kernel.
- poison_freed: fill freed CUDA blocks with 0xFF bytes (NaN in every float format), so that an output
  that is never written cannot pass off leftover memory as a result.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

class AtenOpRecorder(TorchDispatchMode):
    """Records the op names a forward call dispatches (custom extension calls do not dispatch): aten's bare,
    every other namespace's qualified, as the op trace names them (profiling.traced_ops)."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func._overloadpacket
        name = getattr(packet, "_qualified_op_name", None) or f"aten::{packet.__name__}"
        self.ops.add(name[6:] if name.startswith("aten::") else name)
        return func(*args, **(kwargs or {}))


def poison_freed(nbytes_list) -> None:
    """Claim cached CUDA blocks of these sizes, fill them with 0xFF, and free them again."""
    if not torch.cuda.is_available():
        return
    for nbytes in nbytes_list:
        if nbytes > 0:
            block = torch.empty(int(nbytes), dtype=torch.uint8, device="cuda")
            block.fill_(0xFF)
            del block
