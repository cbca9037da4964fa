"""Which kernels a call launched, and what share of GPU time the solution's own kernels took.

Kernels from PyTorch, cuBLAS/cuDNN/CUTLASS and Triton are the library's; anything else was built by
the solution. No kernel of its own means the solution is not a custom kernel.
"""
from __future__ import annotations

import re

import torch

LIBRARY_KERNEL = re.compile(
    r"(at::|c10::|\bnative::|cutlass|cublas|cudnn|xmma|nvjet|ampere_|sm\d+_|gemm|gemv|splitKreduce|"
    r"^triton_|elementwise_kernel|reduce_kernel|softmax_warp|cunn_|Memset|Memcpy|memcpy|memset|"
    r"distribution_|philox|fill_kernel|CatArrayBatched|indexSelect|scatter_gather)",
    re.IGNORECASE,
)


def _device_time_us(event) -> float:
    for attr in ("device_time_total", "cuda_time_total", "self_device_time_total"):
        value = getattr(event, attr, None)
        if value:
            return float(value)
    return 0.0


def trace_kernels(fn, inputs, calls: int = 2):
    """Run `calls` calls under the CUDA profiler and return the profile, unparsed: the child parses it after
    its checkpoint (kernel_summary), where a patch that would forge the parse for one use is still in place."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*inputs)
        torch.cuda.synchronize()
    return prof


def kernel_summary(prof, calls: int = 2) -> dict:
    """The kernels of a trace_kernels profile: time per call each, whose they are, the solution's share."""
    kernels = []
    for event in prof.key_averages():
        device_type = str(getattr(event, "device_type", ""))
        if "CUDA" not in device_type:
            continue
        time_us = _device_time_us(event)
        if time_us <= 0:
            continue
        kernels.append({"name": event.key[:160], "calls": int(event.count), "us": time_us / calls,
                        "own": not LIBRARY_KERNEL.search(event.key)})
    kernels.sort(key=lambda k: -k["us"])
    total = sum(k["us"] for k in kernels)
    own = sum(k["us"] for k in kernels if k["own"])
    return {"kernels": kernels[:12], "kernel_count": len(kernels), "own_share": own / total if total else 0.0,
            "own_kernels": sum(1 for k in kernels if k["own"])}


def profile_kernels(fn, inputs, calls: int = 2) -> dict:
    """trace_kernels and kernel_summary in one (for callers with no checkpoint between)."""
    return kernel_summary(trace_kernels(fn, inputs, calls), calls)
