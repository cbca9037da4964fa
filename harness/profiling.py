"""Which kernels a call launched, and what share of GPU time the solution's own kernels took.

A kernel is the solution's own when its sources declare it (a `__global__` function, a `@triton.jit` one) and
its name is none of the library's (PyTorch, cuBLAS/cuDNN/CUTLASS, Triton's generated ones). Sources that declare
no kernel (macros, CUTLASS templates) fall back to the library's names alone, a deny-list: cub's, cuFFT's and
jiterator's kernels would then count as the solution's. No kernel of its own means no custom kernel.
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

# Words that stand between __global__ and a kernel's name and are followed by a parenthesis themselves.
_TRITON_DECORATOR = re.compile(r"@triton\.(?:jit|autotune)")
_DEF = re.compile(r"\s*def\s+(\w+)")
_QUALIFIERS = frozenset({"__launch_bounds__", "__cluster_dims__", "__maxnreg__", "alignas", "__attribute__"})


def declared_kernels(source: str) -> frozenset:
    """The names of the kernels a source declares: each `__global__` function's, and each Triton function's."""
    names = set()
    # Linear in the source (the parent reads it while another target runs): each declaration is read up to its
    # body, its `;`, the next `__global__` or 2,000 characters, whichever comes first.
    starts = [match.end() for match in re.finditer(r"\b__global__\b", source)]
    for start, following in zip(starts, starts[1:] + [len(source)]):
        declaration = re.split(r"[{;]", source[start:min(following, start + 2000)], maxsplit=1)[0]
        called = [word for word in re.findall(r"\b([A-Za-z_]\w*)\s*\(", declaration) if word not in _QUALIFIERS]
        names.update(called[:1])
    # A Triton function: a line with @triton.jit or @triton.autotune, more decorators or blank lines, then its def.
    lines = source.splitlines()
    index = 0
    while index < len(lines):
        if not _TRITON_DECORATOR.search(lines[index]):
            index += 1
            continue
        index += 1
        while index < len(lines) and (not lines[index].strip() or lines[index].lstrip().startswith("@")):
            index += 1
        found = _DEF.match(lines[index]) if index < len(lines) else None
        if found:
            names.add(found.group(1))
    return frozenset(names)


def _is_own(name: str, own_names) -> bool:
    if LIBRARY_KERNEL.search(name):
        return False
    return not own_names or any(re.search(rf"\b{re.escape(word)}\b", name) for word in own_names)


def _make_trace(cuda: bool):
    """A trace driven through torch's C++ profiler calls captured now, before the solution is imported, never
    through torch.profiler's Python (whose methods a solution can patch for one use, or shadow on the instance,
    after the checkpoint too). Returns (start, stop). start() begins a trace and marks it with a secret name;
    stop() marks it again, ends it and returns its events as (name, on_gpu, nanoseconds) rows, or None when
    either mark is missing (forward stopped the trace, began its own, or left it deaf). `cuda` adds the GPU's
    activity: kernels, copies and fills, each with its time on the device."""
    import os

    autograd = torch._C._autograd
    every_thread = None
    if not cuda:  # the kernel trace sees every thread's kernels anyway (CUPTI is process-wide)
        try:  # every thread's ops: a thread forward starts and joins would otherwise go unrecorded
            every_thread = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        except TypeError:  # a torch without the option: Python 3.12 audits thread starts (the guard refuses them)
            pass
    # never entered: its settings alone (CPU ops, and the GPU's activity with `cuda`)
    template = torch.autograd.profiler.profile(use_kineto=True, use_device="cuda" if cuda else None,
                                               experimental_config=every_thread)
    config, activities = template.config(), template.kineto_activities
    prepare, enable, disable = autograd._prepare_profiler, autograd._enable_profiler, autograd._disable_profiler
    event = autograd._KinetoEvent
    events_of, name_of, device_of, duration_of = (autograd._ProfilerResult.events, event.name, event.device_type,
                                                  event.duration_ns)
    gpu = autograd.DeviceType.CUDA
    mark_enter = torch.ops.profiler._record_function_enter_new.default._op  # the C++ ops, not their Python wrappers
    mark_exit = torch.ops.profiler._record_function_exit._RecordFunction._op
    urandom, result_type, type_, error = os.urandom, autograd._ProfilerResult, type, Exception
    secrets = ["", ""]

    def start():
        secrets[:] = ["harness-trace-" + urandom(12).hex(), "harness-trace-" + urandom(12).hex()]
        prepare(config, activities)
        enable(config, activities)
        mark_exit(mark_enter(secrets[0], None))

    def stop():
        """The events, or None unless both marks are in: the first (the trace is start()'s) and a second made
        now (it still records: a solution that dropped its callbacks left it deaf since)."""
        mark_exit(mark_enter(secrets[1], None))
        try:
            result = disable()  # (a trace of every thread reads as off in torch's per-thread check: no such check)
        except error:  # no trace is running: forward ended it
            return None
        if type_(result) is not result_type:
            return None
        rows = [(name_of(e), device_of(e) == gpu, duration_of(e)) for e in events_of(result)]
        names = {row[0] for row in rows}
        if secrets[0] not in names or secrets[1] not in names:
            return None
        return rows

    return start, stop


def traced_ops(rows, type_=type, str_=str) -> set:
    """The op names in a trace's rows (CPU events named namespace::op): aten's bare, every other namespace's
    qualified (mkldnn::_linear_pointwise), so that the problem can tell torch's ops from a solution's own. It
    looks nothing up as it runs (its builtins are bound as defaults): the op trace calls it before the checkpoint."""
    return {name[6:] if name.startswith("aten::") else name
            for name, on_gpu, _ in rows if not on_gpu and type_(name) is str_ and "::" in name}


def make_op_trace():
    """The correctness trials' op trace (see _make_trace): stop() returns the aten op names seen, or None.
    Its stop runs before the checkpoint, so it looks nothing up at run time (a module's or builtins' name
    patched for one use would be whole again there): what it calls is bound now."""
    start, stop_rows = _make_trace(cuda=False)
    names_in = traced_ops

    def stop():
        rows = stop_rows()
        return None if rows is None else names_in(rows)

    return start, stop


def make_kernel_trace():
    """The kernel profile's trace, CPU ops and GPU activity alike (see _make_trace): stop() returns its rows,
    for traced_ops and kernel_summary, or None."""
    return _make_trace(cuda=True)


def kernel_summary(rows, calls: int = 2, own_names=frozenset()) -> dict:
    """The GPU activity of a kernel trace: each kernel's time per call, whose it is (`own_names`: the kernels
    the solution declares, declared_kernels; empty: any not the library's), the solution's share."""
    per_name = {}
    for name, on_gpu, duration_ns in rows:
        if on_gpu and duration_ns > 0:
            count, total = per_name.get(name, (0, 0))
            per_name[name] = (count + 1, total + duration_ns)
    kernels = [{"name": str(name)[:160], "calls": count, "us": total / 1e3 / calls, "own": _is_own(name, own_names)}
               for name, (count, total) in per_name.items()]
    kernels.sort(key=lambda k: -k["us"])
    total = sum(k["us"] for k in kernels)
    own = sum(k["us"] for k in kernels if k["own"])
    return {"kernels": kernels[:12], "kernel_count": len(kernels), "own_share": own / total if total else 0.0,
            "own_kernels": sum(1 for k in kernels if k["own"])}


def profile_kernels(fn, inputs, calls: int = 2) -> dict:
    """kernel_summary of `calls` calls (for the lab, which has no checkpoint to keep)."""
    start, stop = make_kernel_trace()
    torch.cuda.synchronize()
    start()
    try:
        for _ in range(calls):
            fn(*inputs)
        torch.cuda.synchronize()
    finally:
        rows = stop()
    if rows is None:
        raise RuntimeError("the kernel trace was stopped or replaced during the calls")
    return kernel_summary(rows, calls)
