"""Why does the harness time a launch-bound call differently from triton.testing.do_bench? (GPU, ~30 s)

One process, the eager InfoNCE reference at its seed shape (about ten small kernels), timed several ways:
the harness as shipped, the harness with one knob changed at a time, do_bench, and a do_bench-style loop
(flush, event, call, event; no synchronisation between calls). Also prints the host's issue time per call
and the call's device time when the host is far ahead. Usage: python3 benchmarks/timing_probe.py [problem shape]
"""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import timing  # noqa: E402
from harness.problem import find_problem  # noqa: E402


def loop_like_do_bench(fn, sets, flush, calls=400):
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    torch.cuda.synchronize()
    for i, (begin, end) in enumerate(events):
        flush()
        begin.record()
        fn(*sets[i % len(sets)])
        end.record()
    torch.cuda.synchronize()
    return statistics.median(b.elapsed_time(e) for b, e in events)


def device_time(fn, inputs, calls=50):
    """Per-call events with the host far ahead: a long device-side wait first, then the calls back to back."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # ~25 ms
    for begin, end in events:
        begin.record()
        fn(*inputs)
        end.record()
    torch.cuda.synchronize()
    return statistics.median(b.elapsed_time(e) for b, e in events)


def host_issue(fn, inputs, calls=100):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*inputs)
    issued = (time.perf_counter() - t0) / calls * 1e3
    torch.cuda.synchronize()
    return issued


def main():
    import triton.testing

    name, shape_name = (sys.argv[1:3] if len(sys.argv) > 2 else ("infonce", "256x512_n2560"))
    device = torch.device("cuda")
    problem = find_problem(name)
    shape = problem.shape(shape_name)
    model = problem.make_reference(shape, device)
    draw = lambda k: problem.make_inputs(shape, 100 + k, device)  # noqa: E731
    sets = [draw(k) for k in range(4)]
    flusher = timing.L2Flusher(device)
    rows = []
    with torch.no_grad():
        for _ in range(20):
            model(*sets[0])
        for repeat in range(2):
            rows.append(("harness time_calls (as shipped)", timing.time_calls(model, draw, device).median_ms))
            wait = timing.BATCH_START_WAIT_CYCLES
            timing.BATCH_START_WAIT_CYCLES = 0
            rows.append(("  no batch-start wait", timing.time_calls(model, draw, device).median_ms))
            timing.BATCH_START_WAIT_CYCLES = wait
            rows.append(("  32 sets per batch", timing.time_calls(model, draw, device, sets_per_batch=32).median_ms))
            rows.append(("  garbage collector on", timing.time_calls(model, draw, device, pause_gc=False).median_ms))
            rows.append(("do_bench (same inputs)", triton.testing.do_bench(lambda: model(*sets[0]), warmup=50, rep=300,
                                                                           return_mode="median")))
            rows.append(("do_bench-style loop, harness flush, 4 sets", loop_like_do_bench(model, sets, flusher)))
            rows.append(("do_bench-style loop, harness flush, 1 set", loop_like_do_bench(model, sets[:1], flusher)))
            zero = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device=device)
            rows.append(("do_bench-style loop, zero_ flush, 1 set", loop_like_do_bench(model, sets[:1], zero.zero_)))
            rows.append(("host issue time per call (no flush)", host_issue(model, sets[0])))
            rows.append(("host issue time of the flush", host_issue(flusher, [])))
            rows.append(("device time per call (host far ahead)", device_time(model, sets[0])))
            rows.append(("device time of the flush (host far ahead)", device_time(flusher, [])))
    for label, ms in rows:
        print(f"{label:45s} {ms:8.4f} ms", flush=True)


if __name__ == "__main__":
    main()
