"""The timer's own logic, on the CPU: warm-up, the garbage collector, the device wait that starts each GPU
batch, what counts as host-bound, and the escape cross-check's retries."""
import gc
import time

import torch

from harness import timing

CPU = torch.device("cpu")


def test_time_calls_warms_up_pauses_the_collector_and_restores_it():
    seen = {"warm": 0, "gc_during": []}

    def fn(x):
        seen["gc_during"].append(gc.isenabled())
        return x + 1

    def draw(k):
        if k < 0:
            seen["warm"] += 1
        return [torch.ones(4)]

    assert gc.isenabled()
    stats = timing.time_calls(fn, draw, CPU, budget_s=0.05, min_reps=10, warmup_s=0.01)
    assert gc.isenabled()
    assert seen["warm"] == 1 and stats.reps >= 10 and stats.median_ms > 0
    timed = seen["gc_during"][-stats.reps:]
    assert not any(timed), "the collector ran during timed calls"


def _emulated_device(monkeypatch):
    """Device work emulated on the CPU: call_queuing(seconds_for_call) makes a call that queues that much work
    (seconds_for_call(n) for the n-th call), and the device-wide synchronise sleeps it off."""
    queued = {"s": 0.0, "calls": 0}

    def synchronise(device):
        time.sleep(queued["s"])
        queued["s"] = 0.0

    monkeypatch.setattr(timing, "_sync", synchronise)

    def call_queuing(seconds_for_call):
        def fn(x):
            queued["calls"] += 1
            queued["s"] += seconds_for_call(queued["calls"])
            return x
        return fn

    return call_queuing


def test_escape_check_retries_a_slow_moment_but_not_a_slow_solution(monkeypatch):
    call_queuing = _emulated_device(monkeypatch)
    slow_moment = call_queuing(lambda n: 0.005 if n <= 40 else 0.0002)  # the first two batches of 20 are slow
    batch = timing.host_batch_check(slow_moment, [[1]], CPU, expected_ms=0.5)
    assert batch["batches"] == 3 and batch["wall_ms_per_call"] <= timing.escape_bound(0.5, batch["launch_ms_per_call"])

    hidden_work = call_queuing(lambda n: 0.002)
    batch = timing.host_batch_check(hidden_work, [[1]], CPU, calls=5, expected_ms=0.1, max_batches=4)
    assert batch["batches"] == 4 and batch["wall_ms_per_call"] > timing.escape_bound(0.1, batch["launch_ms_per_call"])

    batch = timing.host_batch_check(call_queuing(lambda n: 0.0), [[1]], CPU, expected_ms=None)
    assert batch["batches"] == 2


def test_escape_check_re_times_under_lasting_contention_but_not_for_hidden_work(monkeypatch):
    """Contention that outlasts every batch slows the re-timed median as well, so the bound follows it;
    work hidden from the events stays hidden in the re-timing, so the bound does not move for it."""
    call_queuing = _emulated_device(monkeypatch)

    def queuing(ms_per_call):
        return call_queuing(lambda n: ms_per_call / 1e3)

    retimes = []

    def retime_at(ms):
        def retime():
            retimes.append(ms)
            return ms
        return retime

    # Every batch is slow (2 ms a call against a 0.5 ms median), and so are the calls when timed again.
    batch = timing.host_batch_check(queuing(2.0), [[1]], CPU, calls=5, expected_ms=0.5, retime=retime_at(2.0))
    assert retimes == [2.0] and batch["retimed_median_ms"] == 2.0 and batch["batches"] == 3
    assert batch["wall_ms_per_call"] <= timing.escape_bound(batch["retimed_median_ms"], batch["launch_ms_per_call"])

    # Hidden work: the events (and so the re-timing) still see 0.1 ms; every batch stays over the bound.
    retimes.clear()
    batch = timing.host_batch_check(queuing(2.0), [[1]], CPU, calls=5, expected_ms=0.1, max_batches=4,
                                    retime=retime_at(0.1))
    assert retimes == [0.1] and batch["batches"] == 4
    assert batch["wall_ms_per_call"] > timing.escape_bound(max(0.1, batch["retimed_median_ms"]), batch["launch_ms_per_call"])

    # A batch that passes at once never re-times.
    retimes.clear()
    batch = timing.host_batch_check(queuing(0.0), [[1]], CPU, expected_ms=0.5, retime=retime_at(9.0))
    assert retimes == [] and "retimed_median_ms" not in batch


def test_host_bound_means_issuing_the_call_took_most_of_its_median():
    assert timing.is_host_bound(1.0, {"launch_ms_per_call": 0.8})
    assert not timing.is_host_bound(1.0, {"launch_ms_per_call": 0.79})
    assert not timing.is_host_bound(1.0, None)  # the CPU has no batch check
    assert not timing.is_host_bound(None, {"launch_ms_per_call": 0.8})


def _gpu_batches_log(monkeypatch, with_sleep: bool) -> list:
    """What the CUDA path of _timed_batches enqueues, in order, over two batches of four calls (events emulated)."""
    log = []
    monkeypatch.setattr(timing, "_Event", lambda enable_timing: object())
    monkeypatch.setattr(timing, "_event_record", lambda event: None)
    monkeypatch.setattr(timing, "_event_synchronize", lambda event: None)
    monkeypatch.setattr(timing, "_elapsed_time", lambda begin, end: 1.0)
    monkeypatch.setattr(timing, "_device_sleep", (lambda cycles: log.append(f"wait {cycles}")) if with_sleep else None)
    stats = timing._timed_batches(lambda x: log.append("call") or x, lambda k: [k], CPU, lambda: log.append("flush"),
                                  budget_s=1.0, min_reps=8, max_reps=100, sets_per_batch=4, target_se_pct=1.0, on_output=None)
    assert stats.reps == 8 and stats.timer == "cuda-events" and stats.median_ms == 1.0
    return log


def test_each_gpu_batch_starts_with_a_device_wait_before_its_first_flush(monkeypatch):
    wait = f"wait {timing.BATCH_START_WAIT_CYCLES}"
    assert _gpu_batches_log(monkeypatch, with_sleep=True) == 2 * ([wait] + 4 * ["flush", "call"])
    # A torch without torch.cuda._sleep: no wait, and the timing still works.
    assert _gpu_batches_log(monkeypatch, with_sleep=False) == 2 * (4 * ["flush", "call"])


def test_no_device_wait_on_the_cpu(monkeypatch):
    waits = []
    monkeypatch.setattr(timing, "_device_sleep", waits.append)
    stats = timing.time_calls(lambda x: x + 1, lambda k: [torch.ones(4)], CPU, budget_s=0.05, min_reps=10, warmup_s=0.01)
    assert not waits and stats.reps >= 10 and stats.timer == "wall-clock"


def test_the_host_issue_probe_times_one_tiny_operation():
    assert 0 < timing.host_issue_probe(CPU, calls=20, repeats=3) < 10_000  # microseconds per add_


def test_sets_per_batch_grows_for_small_inputs_and_respects_memory():
    from harness.timing import MAX_SETS_PER_BATCH, sets_per_batch

    assert sets_per_batch(6.3e6, 24e9) == MAX_SETS_PER_BATCH  # InfoNCE seed: short, launch-bound calls
    assert sets_per_batch(302e6, 24e9) == 4  # large inputs keep four sets
    assert sets_per_batch(12.9e9, 24e9) == 1  # one set is all that fits
    assert sets_per_batch(6.3e6, 50e6) == 7  # the memory budget caps it
    assert sets_per_batch(0, 24e9) == MAX_SETS_PER_BATCH


def test_device_time_needs_a_gpu():
    from harness.timing import device_time_per_call

    calls = []
    result = device_time_per_call(lambda x: x + 1, lambda k: [torch.ones(3)], torch.device("cpu"), first_k=0, calls=4,
                                  host_ms_per_call=0.1, on_output=lambda *a: calls.append(a))
    assert result is None and calls == []  # nothing timed, nothing claimed to be checked
