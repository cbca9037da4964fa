"""Timing: the loops the child runs under the parent's orders, and the figures the parent derives.

The parent decides everything about a timing: which input sets (drawn by it, fresh for every call),
how many batches, when to stop, which outputs it verifies. The child only runs one batch at a time:
flush the L2 (a buffer of at least twice its size is overwritten), record a begin event, call, record
an end event, copy the output into the parent's slot; then a synchronise and the event times go back.

`make_timer` builds those loops as closures over C-level callables taken before any solution code is
imported (the CUDA event type of torch._C, TensorBase.fill_/copy_, the builtin perf_counter). Nothing
they call at run time goes through a module's globals, so a solution that rewrites torch's or the
harness's module dicts (shadowing `super` in torch.cuda.streams, say) cannot change what they read.
Torch function and dispatch modes are refused after every call (a mode could intercept the copy), and
the copy runs with Python dispatch disabled.

Launch-bound calls (many small kernels) are timed as do_bench times them, launch gaps included: each
batch starts with a short device-side wait so the host queues its first calls while the device is
busy, and Python's garbage collector is paused while a batch runs (as `timeit` does).
"""
from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time

import torch

from .rules import Failure

# Cycles the device spins at the start of each timed batch (~0.1 ms at H200 clocks).
BATCH_START_WAIT_CYCLES = 200_000
# SM clock cycles per millisecond for the device-side wait (H200 boost ~1.98 GHz).
SLEEP_CYCLES_PER_MS = 2_000_000

# A timed batch holds about this many bytes of fresh inputs: at least 4 sets, at most 32. Short batches
# leave the host's issue path cold after every synchronise (docs/perf-notes.md).
BATCH_INPUT_BYTES = 2**30
MAX_SETS_PER_BATCH = 32


def sets_per_batch(nbytes: float, memory_budget: float) -> int:
    """How many fresh input sets one timed batch rotates through, for inputs of `nbytes` each."""
    nbytes = max(nbytes, 1)
    preferred = max(4, min(MAX_SETS_PER_BATCH, int(BATCH_INPUT_BYTES // nbytes)))
    return max(1, min(preferred, int(memory_budget // nbytes)))


@dataclasses.dataclass
class TimingStats:
    median_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    reps: int
    se_pct: float
    timer: str
    budget_hit: bool = False

    @classmethod
    def from_samples(cls, samples: list, timer: str, budget_hit: bool = False) -> "TimingStats":
        mean = statistics.fmean(samples)
        std = statistics.stdev(samples) if len(samples) > 1 else 0.0
        se_pct = 100.0 * std / math.sqrt(len(samples)) / mean if mean > 0 else 0.0
        return cls(statistics.median(samples), mean, std, min(samples), max(samples), len(samples), se_pct, timer, budget_hit)


def make_timer(device: torch.device, mark, keys_changed=lambda expected=None: []) -> tuple:
    """The child's loops, as closures over primitives captured now (before the solution is imported):
    (warm_up, timed_batch, burst, queued, issue_probe, after_call, seal, sync, guarded). `mark` tells the
    parent, on its own clock, that a timed batch's calls begin or that the device is done with them.
    `keys_changed(expected)` names dispatch keys forward left switched on or off (guard.ThreadDispatchKeys.changes):
    checked after every call, before the harness's own copy dispatches."""
    is_cuda = device.type == "cuda"
    perf = time.perf_counter
    gc_module = __import__("gc")
    gc_disable, gc_enable, gc_isenabled = gc_module.disable, gc_module.enable, gc_module.isenabled
    fill, copy, empty = torch._C.TensorBase.fill_, torch._C.TensorBase.copy_, torch.empty
    tensor_type, tf_depth, td_depth = torch.Tensor, torch._C._len_torch_function_stack, torch._C._len_torch_dispatch_stack
    # A tensor's shape, dtype, device, strides and size read through torch._C.TensorBase (an immutable type), never
    # through torch.Tensor's dict: a property the solution put there for one read would run inside the harness.
    base = torch._C.TensorBase.__dict__
    shape_of, dtype_of, device_of = base["shape"].__get__, base["dtype"].__get__, base["device"].__get__
    stride_of, numel_of = base["stride"], base["numel"]
    no_tf, no_td = torch._C.DisableTorchFunction, torch._C._DisableTorchDispatch
    median, fmean = statistics.median, statistics.fmean
    # torch's frame-evaluation hooks (PEP 523, for torch.compile): a hook that forward leaves installed
    # would be handed every frame this thread runs next, the harness's included.
    frames = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    frame_hooks = [(getattr(frames, get, None), getattr(frames, put, None)) for get, put in
                   (("get_eval_frame_callback", "set_eval_frame"), ("get_bytecode_debugger_callback", "set_bytecode_debugger_callback"))]
    frame_hooks = [(get, put) for get, put in frame_hooks if get is not None and put is not None]
    range_, len_, zip_, min_, max_, type_, str_ = range, len, zip, min, max, type, str
    if is_cuda:
        index = device.index if device.index is not None else torch.cuda.current_device()
        Event = torch._C._CudaEventBase
        record, elapsed, ev_sync = Event.record, Event.elapsed_time, Event.synchronize
        current_stream = torch._C._cuda_getCurrentStream
        stream = torch.cuda.current_stream(index)
        stream_id = current_stream(index)[0]
        device_sync, device_sleep = torch._C._cuda_synchronize, getattr(torch._C, "_cuda_sleep", None)
        props = torch.cuda.get_device_properties(index)
        flush_bytes = max(2 * getattr(props, "L2_cache_size", 50 * 2**20), 256 * 2**20)
        flush_buffer = empty(flush_bytes // 4, dtype=torch.int32, device=device)

    def guarded(fn):
        """fn, checked as it returns (normally or not), in its own frame and before any other frame of the
        harness runs: a frame-evaluation hook left installed is removed and is a verdict."""
        def call(*args):
            try:
                return fn(*args)
            finally:
                if any(get() is not None for get, _ in frame_hooks):
                    for _, put in frame_hooks:
                        put(None)
                    raise Failure("introspection", "a frame-evaluation hook (PEP 523) was left installed")
        return call

    def flush():
        with no_tf(), no_td():
            fill(flush_buffer, 0x5A5A5A5A)

    def sync():
        if is_cuda:
            device_sync()

    def after_call(out, slot, modes=0, keys=None):
        """The rules the loop checks itself, then the copy of the output into the parent's slot. A caller that has
        dispatch modes of its own on (a trial's op recorder: `modes`, and the dispatch `keys` it saw before the
        call) copies inside them, before they are switched off: torch's Python code that switches them off is
        looked up as it runs, and a patch there that undoes itself would run after the recorders, unseen."""
        if tf_depth() or td_depth() != modes:
            raise Failure("tampering", "a torch function or dispatch mode was left active by forward")
        if keys_changed(keys):  # the copy below would reach a kernel of the solution's (a backend fallback, the Python dispatcher)
            raise Failure("tampering", "forward left dispatch keys switched on or off: " + keys_changed(keys)[0])
        if is_cuda and current_stream(index)[0] != stream_id:
            raise Failure("escaped-timing", "forward left another CUDA stream current")
        if slot is None:
            return
        if type_(out) is not tensor_type:
            raise Failure("bad-output", f"returned {type_(out).__module__}.{type_(out).__qualname__}, not a plain torch.Tensor")
        if shape_of(out) != shape_of(slot) or dtype_of(out) is not dtype_of(slot) or device_of(out).type != device_of(slot).type:
            raise Failure("bad-output", f"returned shape {tuple(shape_of(out))} {str_(dtype_of(out)).removeprefix('torch.')} on "
                                              f"{device_of(out).type}, expected {tuple(shape_of(slot))} "
                                              f"{str_(dtype_of(slot)).removeprefix('torch.')} on {device_of(slot).type}")
        if numel_of(out) and 0 in stride_of(out):
            raise Failure("bad-output", "output is a broadcast view (a stride is 0), not a materialised result")
        with no_tf(), no_td():
            if is_cuda:  # in stream order, right after the call: work that ends later is not in the slot
                copy(slot, out)
            else:  # a private copy now; the shared file (which native code could find) is written by seal()
                private = empty(shape_of(slot), dtype=dtype_of(slot))
                copy(private, out)
                pending.append((slot, private))

    pending = []

    def seal() -> list:
        """Write the private copies into the parent's slots, after the last solution code of the request
        ran (finalizers included) and before the reply: nothing of the solution runs between the two. Returns
        the (slot, copy) pairs, for the caller to hold until solution code may run again: dropping the last
        reference to a slot would run a weakref callback the solution hung on it."""
        with no_tf(), no_td():
            for slot, private in pending:
                copy(slot, private)
        sealed = pending[:]
        pending.clear()
        return sealed

    def warm_up(fn, inputs, seconds: float, min_calls: int = 3):
        """Untimed calls in the timed pattern (flush, call) for at least `seconds` and `min_calls` calls."""
        start, calls = perf(), 0
        while calls < min_calls or perf() - start < seconds:
            if is_cuda:
                flush()
            out = fn(*inputs)
            after_call(out, None)
            del out
            calls += 1
            if calls % 8 == 0:
                sync()
        sync()

    def issue(fn, sets: list, slots: list) -> list:
        """Queue one timed call per set: flush, begin event, call, end event, copy into its slot."""
        events = [(Event(enable_timing=True), Event(enable_timing=True)) for _ in range_(len_(sets))]
        for inputs, slot, (begin, end) in zip_(sets, slots, events):
            flush()
            record(begin, stream)
            out = fn(*inputs)
            record(end, stream)
            after_call(out, slot)
            del out
        return events

    def timed_batch(fn, sets: list, slots: list) -> list:
        """One batch: per set, flush, begin, call, end, copy into its slot. Returns ms per call."""
        was_enabled = gc_isenabled()
        # No collection here: it would run the solution's finalizers before the first mark (the child collects
        # as each request ends, before its checkpoint, and keeps the collector off in between).
        gc_disable()
        try:
            sync()
            mark()
            if not is_cuda:
                # The CPU has no events, so no per-call figure it cannot steer: every call counts as the batch's
                # mean, the output's copy and whatever the solution runs between its calls (a weakref callback at
                # `del out`, work front-loaded into the first call) included.
                t0 = perf()
                for inputs, slot in zip_(sets, slots):
                    out = fn(*inputs)
                    after_call(out, slot)
                    del out
                per_call = (perf() - t0) * 1e3 / max_(len_(sets), 1)
                mark()
                return [per_call] * len_(sets)
            if device_sleep is not None:
                device_sleep(BATCH_START_WAIT_CYCLES)
            events = issue(fn, sets, slots)
            ev_sync(events[-1][1])
            sync()
            mark()
            return [elapsed(begin, end) for begin, end in events]
        finally:
            if was_enabled:
                gc_enable()

    def burst(fn, sets: list, calls: int) -> dict:
        """`calls` back-to-back calls over `sets` in turn, no flush, ending in a device-wide synchronise:
        host time to issue them, host time until the device is done, and the current stream's events
        over the batch. Work that escaped the events (another stream, a thread) shows as wall time."""
        sync()
        mark()
        if is_cuda:
            begin, end = Event(enable_timing=True), Event(enable_timing=True)
            record(begin, stream)
        t0 = perf()
        for i in range_(calls):
            out = fn(*sets[i % len_(sets)])
            after_call(out, None)
            del out
        launched = perf()
        if is_cuda:
            record(end, stream)
        sync()
        done = perf()
        mark()
        result = {"calls": calls, "launch_ms_per_call": (launched - t0) * 1e3 / calls, "wall_ms_per_call": (done - t0) * 1e3 / calls}
        if is_cuda:
            ev_sync(end)
            result["events_ms_per_call"] = elapsed(begin, end) / calls
        return result

    def queued(fn, sets: list, slots: list, host_ms_per_call: float, tries: int = 3):
        """Median ms per call with the host far ahead: the device waits until the host has queued every
        call of the batch, so each call's events see the device's work alone. None when the host never
        got ahead (a synchronisation inside the call), or without a GPU."""
        if not is_cuda or device_sleep is None or not sets:
            return None
        wait_ms = 3.0 * len_(sets) * (host_ms_per_call + 0.02) + 1.0
        for _ in range_(tries):
            sync()
            slept = (Event(enable_timing=True), Event(enable_timing=True))
            record(slept[0], stream)
            device_sleep(int(wait_ms * SLEEP_CYCLES_PER_MS))
            record(slept[1], stream)
            t0 = perf()
            events = issue(fn, sets, slots)
            issued_ms = (perf() - t0) * 1e3
            sync()
            if issued_ms < elapsed(*slept):
                return median(elapsed(begin, end) for begin, end in events)
            wait_ms = max_(2.0 * wait_ms, 2.0 * issued_ms)
        return None

    def issue_probe(calls: int = 200, repeats: int = 5) -> float:
        """Microseconds the host takes right now to issue one tiny operation: the host's speed for
        launch-bound work, recorded beside each timing."""
        x = torch.zeros(1, device=device)
        per_call = []
        for _ in range_(repeats):
            sync()
            t0 = perf()
            for _ in range_(calls):
                x.add_(1.0)
            per_call.append((perf() - t0) / calls * 1e6)
        sync()
        return median(per_call)

    # A plain tuple of closures, unpacked by the caller into its own locals: a class (even a named tuple's)
    # is listed by object.__subclasses__() and its attribute lookup can be spied on to reach the closures.
    return warm_up, timed_batch, burst, queued, issue_probe, after_call, seal, sync, guarded


# ---- figures the parent derives ----------------------------------------------------------------
ESCAPE_FACTOR = 1.5     # a device-synchronised batch may take this much longer per call than the events saw
ESCAPE_SLACK_MS = 0.3   # plus this much per batch (not per call): a synchronise, a reply, the host's jitter
# The parent's clock over each timed batch, less the same batch with a trivial call in place of the
# solution, divided by the calls, may exceed the claimed median by this factor plus this slack per call.
# A host-bound call is issued more slowly than the device runs it: there the clock sees the host's time to
# issue forward, which may exceed the parent's own figure for it (the escape check's batch, back to back)
# by the host factor. Measured on the H200: up to 1.43x, at 3.9 to 15 us medians issued in 16 to 33 us.
PARENT_CLOCK_FACTOR = 1.25
PARENT_CLOCK_HOST_FACTOR = 1.6
PARENT_CLOCK_SLACK_MS = 0.003        # per call
PARENT_CLOCK_BATCH_SLACK_MS = 0.05   # per batch: the two marks' trips through the pipe, the host's jitter


def escape_bound(events_ms: float, launch_ms: float, calls: int = 1) -> float:
    """The most a device-synchronised call may take, per call, when all of its work was inside the events."""
    return ESCAPE_FACTOR * max(events_ms, launch_ms) + ESCAPE_SLACK_MS / max(1, calls)


def burst_calls(median_ms: float, target_ms: float = 5.0, least: int = 20, most: int = 2000) -> int:
    """Calls in an escape-check batch: long enough (about `target_ms`) that its slack per call is small."""
    return int(min(most, max(least, math.ceil(target_ms / max(median_ms, 1e-4)))))


def parent_clock_bound(median_ms: float, calls: int = 1, host_ms: float = 0.0) -> float:
    """The most the parent's clock may see per call beyond a trivial call, in batches of `calls` calls.
    `host_ms`: the parent's own time per call over a back-to-back batch (the escape check's), the host's
    cost of issuing one; a call that takes longer to issue than to run is bounded by that instead."""
    return (max(PARENT_CLOCK_FACTOR * median_ms, PARENT_CLOCK_HOST_FACTOR * host_ms) + PARENT_CLOCK_SLACK_MS
            + PARENT_CLOCK_BATCH_SLACK_MS / max(1, calls))


HOST_BOUND = 0.8  # host time to issue a call / its median, at or above which the figure is the host's


def is_host_bound(median_ms: float | None, batch: dict | None) -> bool:
    """Issuing the call (launches, or a synchronisation inside it) took most of its measured time: the
    figure then measures the host CPU as much as the GPU, and moves between processes and machines."""
    launch = (batch or {}).get("launch_ms_per_call")
    return bool(launch and median_ms and launch >= HOST_BOUND * median_ms)


def entry_is_host_bound(entry: dict) -> bool:
    """is_host_bound for a recorded timing entry (its batch check ran in the first process)."""
    first = (entry.get("process_medians_ms") or [entry.get("median_ms")])[0]
    return is_host_bound(first, entry.get("batch"))


def _parse_cpu_list(text: str) -> set:
    cpus = set()
    for part in text.strip().split(","):
        if part:
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def pin_near_device(device) -> str:
    """Restrict this process to the CPUs on the GPU's own NUMA node, when the machine says which they
    are: a launch-bound call launched from the far socket is slower. Returns the CPU list ("" if unchanged)."""
    if device.type != "cuda" or not hasattr(os, "sched_setaffinity"):
        return ""
    try:
        props = torch.cuda.get_device_properties(device)
        address = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        with open(f"/sys/bus/pci/devices/{address}/local_cpulist") as f:
            local = _parse_cpu_list(f.read())
        allowed = os.sched_getaffinity(0)
        chosen = local & allowed
        if not chosen or chosen == allowed:
            return ""
        os.sched_setaffinity(0, chosen)
        return ",".join(str(c) for c in sorted(chosen))
    except (AttributeError, OSError, ValueError):
        return ""


def _event_times(device, work, reps: int) -> list:
    times = []
    for _ in range(reps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        work()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    return times


def copy_bandwidth(device, nbytes: int = 2 * 2**30, reps: int = 10) -> float:
    """The device's copy ceiling in bytes/s: a large device-to-device copy, bytes read plus bytes written."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds = statistics.median(_event_times(device, lambda: dst.copy_(src), reps))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / seconds


def read_bandwidth(device, nbytes: int = 2 * 2**30, reps: int = 10) -> float:
    """The device's read ceiling in bytes/s: the fastest of a few read-only passes over a large tensor (a
    sum, a max, a matrix-vector product; a read-mostly kernel such as a loss beats the copy figure)."""
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    v = torch.ones(4096, dtype=torch.float32, device=device)
    best = math.inf
    for reduce in (lambda: x.sum(), lambda: x.amax(), lambda: torch.mv(x.view(-1, 4096), v)):
        reduce()
        best = min(best, statistics.median(_event_times(device, reduce, reps)))
    del x, v
    torch.cuda.empty_cache()
    return nbytes / best


def matmul_rate(device, n: int = 8192, reps: int = 5) -> float:
    """Dense bf16 matrix-product rate in flop/s on random data: the arithmetic ceiling."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    a @ b
    seconds = statistics.median(_event_times(device, lambda: a @ b, reps))
    del a, b
    torch.cuda.empty_cache()
    return 2 * n**3 / seconds
