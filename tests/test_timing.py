"""The timer's own logic, on the CPU: warm-up, the garbage collector, and the escape cross-check's retries."""
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


def test_escape_check_retries_a_slow_moment_but_not_a_slow_solution(monkeypatch):
    """Device work is emulated: a call queues work, and the device-wide synchronise waits for it."""
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

    slow_moment = call_queuing(lambda n: 0.005 if n <= 40 else 0.0002)  # the first two batches of 20 are slow
    batch = timing.host_batch_check(slow_moment, [[1]], CPU, expected_ms=0.5)
    assert batch["batches"] == 3 and batch["wall_ms_per_call"] <= timing.escape_bound(0.5, batch["launch_ms_per_call"])

    hidden_work = call_queuing(lambda n: 0.002)
    batch = timing.host_batch_check(hidden_work, [[1]], CPU, calls=5, expected_ms=0.1, max_batches=4)
    assert batch["batches"] == 4 and batch["wall_ms_per_call"] > timing.escape_bound(0.1, batch["launch_ms_per_call"])

    batch = timing.host_batch_check(call_queuing(lambda n: 0.0), [[1]], CPU, expected_ms=None)
    assert batch["batches"] == 2
