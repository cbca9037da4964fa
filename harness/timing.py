"""Timing: the same code times solutions, the eager and compiled references, and other libraries.

On a GPU each call is bracketed by CUDA events recorded on the current stream, after an L2 flush
(writing a buffer of at least twice the L2). Calls run in batches over freshly drawn input sets, and
batches continue until the standard error of the mean is under 1% (at least `min_reps` calls) or the
time budget is spent. On the CPU a wall clock brackets each call instead.

Launch-bound calls (many small kernels) are timed as do_bench times them, host launch gaps included, so
their figure depends on the host: a timed warm-up of the same flush-and-call pattern comes first (the
CPU's clocks and caches settle), and Python's garbage collector is paused while the calls are timed
(as `timeit` does), so that a collection pass does not land in some runs' samples and not in others'.
Each batch on a GPU starts with a short device-side wait, so that the host queues the batch's first calls
while the device is still busy and a call the host issues faster than the device runs it is timed on the
device alone. A host-bound call also gets a device time: the same calls queued far ahead of the device
(device_time_per_call), the part of its figure that does not follow the host's speed.

The functions below are bound at import, before any solution code runs, and keep their own references
to the clock and event methods, so a solution that patches torch or time cannot change what they read.
"""
from __future__ import annotations

import dataclasses
import gc
import math
import os
import statistics
import time

import torch

_perf_counter = time.perf_counter
_Event = torch.cuda.Event
_elapsed_time = torch.cuda.Event.elapsed_time
_event_record = torch.cuda.Event.record
_event_synchronize = torch.cuda.Event.synchronize
_cuda_synchronize = torch.cuda.synchronize
_device_sleep = getattr(torch.cuda, "_sleep", None)

# Cycles the device spins at the start of each timed batch (~0.1 ms at H200 clocks): the device is idle
# after the batch's synchronise, so without this wait the first call of every batch would pay the host's
# launch latency whenever issuing it takes longer than the L2 flush before it takes on the device.
BATCH_START_WAIT_CYCLES = 200_000


# A timed batch holds about this many bytes of fresh inputs: at least 4 sets, at most 32. A batch of four
# calls that take 0.1 ms is too short for the host to issue launches as fast as it does in a long loop
# (do_bench, a training step): after each batch's synchronise the issue path is cold again. Measured on
# the H200 (benchmarks/timing_probe.py, eager InfoNCE at its seed shape, two passes in each of two
# processes): 4 sets per batch read 5-27% above do_bench, 32 sets between 11% below and 9% above it.
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
    def from_samples(cls, samples: list, timer: str, budget_hit: bool) -> "TimingStats":
        mean = statistics.fmean(samples)
        std = statistics.stdev(samples) if len(samples) > 1 else 0.0
        se_pct = 100.0 * std / math.sqrt(len(samples)) / mean if mean > 0 else 0.0
        return cls(statistics.median(samples), mean, std, min(samples), max(samples), len(samples), se_pct, timer, budget_hit)


class L2Flusher:
    """Writes a buffer of at least twice the L2 before each timed call so that no call finds its data cached."""

    def __init__(self, device):
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20)
        self.nbytes = max(2 * l2, 256 * 2**20)
        self.buffer = torch.empty(self.nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self):
        self.buffer.fill_(0x5A5A5A5A)


def _parse_cpu_list(text: str) -> set:
    cpus = set()
    for part in text.strip().split(","):
        if part:
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def pin_near_device(device) -> str:
    """Restrict this process to the CPUs on the GPU's own NUMA node, when the machine says which they
    are: a launch-bound call launched from the far socket is slower, and which socket a process lands
    on changes from run to run. Returns the CPU list in use ("" when left unchanged)."""
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


def _sync(device):
    if device.type == "cuda":
        _cuda_synchronize(device)


def warm_up(fn, inputs, device, flush, seconds: float, min_calls: int = 3):
    """Untimed calls in the timed pattern (flush, call) for at least `seconds` and `min_calls` calls."""
    start, calls = _perf_counter(), 0
    while calls < min_calls or _perf_counter() - start < seconds:
        if flush is not None:
            flush()
        fn(*inputs)
        calls += 1
        if calls % 8 == 0:
            _sync(device)
    _sync(device)


def time_calls(fn, draw_set, device, *, budget_s=2.0, min_reps=10, max_reps=2000, sets_per_batch=4,
               target_se_pct=1.0, on_output=None, warmup_s=0.1, pause_gc=True, warm_inputs=None):
    """Time fn(*inputs) over fresh input sets. draw_set(k) returns the k-th input set (a list); the
    warm-up uses `warm_inputs`, or set -1 when none are given. on_output(k, output, inputs) is called
    after each timed call (outside the timed region)."""
    is_cuda = device.type == "cuda"
    flush = L2Flusher(device) if is_cuda else None
    warm_up(fn, draw_set(-1) if warm_inputs is None else warm_inputs, device, flush, warmup_s)
    gc_was_enabled = gc.isenabled()
    if pause_gc:
        gc.collect()
        gc.disable()
    try:
        return _timed_batches(fn, draw_set, device, flush, budget_s, min_reps, max_reps, sets_per_batch,
                              target_se_pct, on_output)
    finally:
        if gc_was_enabled:
            gc.enable()


def _issue_timed(fn, batch: list, flush) -> tuple:
    """Queue one timed call per input set: flush, begin event, call, end event. Returns (outputs, events)."""
    events = [(_Event(enable_timing=True), _Event(enable_timing=True)) for _ in batch]
    outputs = []
    for inputs, (begin, end) in zip(batch, events):
        flush()
        _event_record(begin)
        outputs.append(fn(*inputs))
        _event_record(end)
    return outputs, events


def _timed_batches(fn, draw_set, device, flush, budget_s, min_reps, max_reps, sets_per_batch, target_se_pct,
                   on_output):
    is_cuda = flush is not None
    samples, k, start = [], 0, _perf_counter()
    budget_hit = False
    while True:
        batch = [draw_set(k + i) for i in range(sets_per_batch)]
        _sync(device)
        if is_cuda:
            if _device_sleep is not None:
                _device_sleep(BATCH_START_WAIT_CYCLES)
            outputs, events = _issue_timed(fn, batch, flush)
            _event_synchronize(events[-1][1])
            _sync(device)
            samples.extend(_elapsed_time(begin, end) for begin, end in events)
        else:
            outputs = []
            for inputs in batch:
                t0 = _perf_counter()
                outputs.append(fn(*inputs))
                samples.append((_perf_counter() - t0) * 1e3)
        if on_output is not None:
            for i, (inputs, output) in enumerate(zip(batch, outputs)):
                on_output(k + i, output, inputs)
        del outputs, batch
        k += sets_per_batch
        stats = TimingStats.from_samples(samples, "cuda-events" if is_cuda else "wall-clock", False)
        if len(samples) >= min_reps and stats.se_pct < target_se_pct:
            break
        if len(samples) >= max_reps:
            break
        if _perf_counter() - start > budget_s and len(samples) >= min_reps:
            budget_hit = True
            break
    stats.budget_hit = budget_hit
    return stats


ESCAPE_FACTOR = 1.5     # a device-synchronised batch may take this much longer per call than the events saw
# Plus this host-side slack (ms): per-call launch jitter on a small shape reached ~30 us on a shared GPU
# (an honest kernel measured 41 us against 9 us of events under four parallel test runs).
ESCAPE_SLACK_MS = 0.1


def escape_bound(events_ms: float, launch_ms: float) -> float:
    """The most a device-synchronised call may take when all of its work was inside the events."""
    return ESCAPE_FACTOR * max(events_ms, launch_ms) + ESCAPE_SLACK_MS


HOST_BOUND = 0.8  # host time to issue a call / its median, at or above which the figure is the host's


def is_host_bound(median_ms: float | None, batch: dict | None) -> bool:
    """The host batch check says issuing the call (launches, or a synchronisation inside it) took most
    of its measured time: the figure then measures the host CPU as much as the GPU, and moves between
    processes and machines."""
    launch = (batch or {}).get("launch_ms_per_call")
    return bool(launch and median_ms and launch >= HOST_BOUND * median_ms)


def entry_is_host_bound(entry: dict) -> bool:
    """is_host_bound for a recorded timing entry. Its batch check ran in the first process, so it is
    compared with that process's median, not with the median over processes."""
    first = (entry.get("process_medians_ms") or [entry.get("median_ms")])[0]
    return is_host_bound(first, entry.get("batch"))


def host_issue_probe(device, calls: int = 200, repeats: int = 5) -> float:
    """Microseconds the host takes right now to issue one tiny operation (a kernel launch on a GPU):
    the host's speed for launch-bound work. Recorded beside each timing, so that a host-bound figure that
    moved between runs can be told apart from a host that got faster or slower."""
    x = torch.zeros(1, device=device)
    per_call = []
    for _ in range(repeats):
        _sync(device)
        t0 = _perf_counter()
        for _ in range(calls):
            x.add_(1.0)
        per_call.append((_perf_counter() - t0) / calls * 1e6)
    _sync(device)
    return statistics.median(per_call)


# SM clock cycles per millisecond for the device-side wait (H200 boost ~1.98 GHz): at a lower clock the
# wait only lasts longer, which is safe.
SLEEP_CYCLES_PER_MS = 2_000_000


def device_time_per_call(fn, draw_set, device, *, first_k: int, calls: int, host_ms_per_call: float,
                         on_output=None, tries: int = 3) -> float | None:
    """Median time per call with the host far ahead: the device waits (`torch.cuda._sleep`) until the
    host has queued every call of the batch (flush, events, call), so each call's events see only the
    device's work, launch gaps between queued kernels included. For a host-bound call this is the part
    that does not move with the host's speed: what a CUDA graph or a host that runs ahead would get.
    The host's issue time is checked against the wait, which doubles on a miss; None when the host never
    got ahead (a synchronisation inside the call holds it back) or without a GPU. Draws fresh sets from
    first_k onwards; on_output(k, output, inputs) sees each call's output, as in time_calls."""
    if device.type != "cuda" or _device_sleep is None or calls < 1:
        return None
    flush = L2Flusher(device)
    wait_ms = 3.0 * calls * (host_ms_per_call + 0.02) + 1.0
    for attempt in range(tries):
        first = first_k + attempt * calls  # fresh input sets for every attempt
        batch = [draw_set(first + i) for i in range(calls)]
        _sync(device)
        slept = (_Event(enable_timing=True), _Event(enable_timing=True))
        _event_record(slept[0])
        _device_sleep(int(wait_ms * SLEEP_CYCLES_PER_MS))
        _event_record(slept[1])
        t0 = _perf_counter()
        outputs, events = _issue_timed(fn, batch, flush)
        issued_ms = (_perf_counter() - t0) * 1e3
        _sync(device)
        if issued_ms < _elapsed_time(*slept):
            if on_output is not None:
                for i, (inputs, output) in enumerate(zip(batch, outputs)):
                    on_output(first + i, output, inputs)
            return statistics.median(_elapsed_time(begin, end) for begin, end in events)
        del outputs, batch
        wait_ms = max(2.0 * wait_ms, 2.0 * issued_ms)
    return None


def host_batch_check(fn, input_sets: list, device, calls: int = 20, batches: int = 2, expected_ms: float | None = None,
                     max_batches: int = 6, retime=None) -> dict:
    """A device-wide cross-check of the events: the host clock over a batch of calls that ends in a
    device-wide synchronize catches work that escaped the timing events (another stream, a thread).
    Events on the current stream bracket the same batch, so work on another stream shows as wall time
    the batch's own events did not see, whatever else the GPU was doing meanwhile.

    The fastest batch is kept. When it is still slower than `expected_ms` (the timed median) allows,
    more batches run, up to `max_batches`: a moment of contention passes, while hidden work, or a
    solution that only works honestly outside the timed loop, stays slow in every batch.

    Contention that outlasts the batches (another process keeping the GPU busy) slows the timed calls
    too. So once the first `batches` have failed, `retime()` (the same event timing as the timed median,
    run now) gives a fresh median; if it is higher, the bound follows it and the batch records it as
    `retimed_median_ms`. Work that escapes the events escapes them in the re-timing as well, so the
    bound does not move for it."""
    best, done_batches, retimed = None, 0, None
    is_cuda = device.type == "cuda"
    while done_batches < max_batches:
        _sync(device)
        if is_cuda:
            begin, end = _Event(enable_timing=True), _Event(enable_timing=True)
            _event_record(begin)
        t0 = _perf_counter()
        for i in range(calls):
            fn(*input_sets[i % len(input_sets)])
        launched = _perf_counter()
        if is_cuda:
            _event_record(end)
        _sync(device)
        done = _perf_counter()
        done_batches += 1
        batch = {"calls": calls, "wall_ms_per_call": (done - t0) * 1e3 / calls, "launch_ms_per_call": (launched - t0) * 1e3 / calls}
        if is_cuda:
            _event_synchronize(end)
            batch["events_ms_per_call"] = _elapsed_time(begin, end) / calls
        if best is None or batch["wall_ms_per_call"] < best["wall_ms_per_call"]:
            best = batch
        if done_batches < batches:
            continue
        if expected_ms is None or best["wall_ms_per_call"] <= escape_bound(max(expected_ms, retimed or 0.0),
                                                                             best["launch_ms_per_call"]):
            break
        if retime is not None and retimed is None:
            retimed = retime()
    best["batches"] = done_batches
    if retimed is not None:
        best["retimed_median_ms"] = retimed
    return best


def copy_bandwidth(device, nbytes: int = 2 * 2**30, reps: int = 10) -> float:
    """The device's ceiling in bytes/s: a large device-to-device copy, bytes read plus bytes written."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(reps):
        begin, end = _Event(enable_timing=True), _Event(enable_timing=True)
        _event_record(begin)
        dst.copy_(src)
        _event_record(end)
        _event_synchronize(end)
        times.append(_elapsed_time(begin, end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times)


def matmul_rate(device, n: int = 8192, reps: int = 5) -> float:
    """Dense bf16 matrix-product rate in flop/s on random data: the arithmetic ceiling."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    a @ b
    times = []
    for _ in range(reps):
        begin, end = _Event(enable_timing=True), _Event(enable_timing=True)
        _event_record(begin)
        a @ b
        _event_record(end)
        _event_synchronize(end)
        times.append(_elapsed_time(begin, end) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n**3 / statistics.median(times)
