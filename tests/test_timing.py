"""The child's timing loops and the parent's bounds, on the CPU: the loops see what forward leaves
behind, time each call, fill the parent's slots, and the bounds say what honest figures look like."""
import gc

import pytest
import torch

from harness import timing

CPU = torch.device("cpu")


def _timer():
    names = "warm_up timed_batch burst queued issue_probe after_call seal sync guarded".split()
    return __import__("types").SimpleNamespace(**dict(zip(names, timing.make_timer(CPU, lambda: None))))


def _softmax(x):
    return torch.softmax(x, -1)


def test_a_timed_batch_times_each_call_fills_its_slot_and_pauses_the_collector():
    timer = _timer()
    seen = []

    def fn(x):
        seen.append(gc.isenabled())
        return _softmax(x)

    sets = [[torch.randn(3, 5)] for _ in range(4)]
    slots = [torch.full((3, 5), float("nan")) for _ in range(4)]
    assert gc.isenabled()
    times = timer.timed_batch(fn, sets, slots)
    assert all(slot.isnan().all() for slot in slots)  # on the CPU the shared slots are written only by seal()
    timer.seal()
    assert gc.isenabled() and not any(seen)
    assert len(times) == 4 and all(t > 0 for t in times)
    for (x,), slot in zip(sets, slots):
        assert torch.equal(slot, _softmax(x))


@pytest.mark.parametrize("output, words", [
    (lambda x: [x], "not a plain torch.Tensor"),
    (lambda x: x[:, :2].contiguous(), "expected (3, 5)"),
    (lambda x: x.double(), "float64"),
    (lambda x: torch.zeros(()).expand(3, 5), "broadcast view"),
])
def test_the_loop_refuses_an_output_that_does_not_fit_its_slot(output, words):
    timer = _timer()
    with pytest.raises(timing.Failure) as caught:
        timer.timed_batch(output, [[torch.randn(3, 5)]], [torch.empty(3, 5)])
    assert caught.value.rule == "bad-output" and words in caught.value.reason


def test_a_mode_left_active_by_forward_is_tampering():
    from torch.overrides import TorchFunctionMode

    class PassThrough(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    timer = _timer()
    mode = PassThrough()

    def leaves_a_mode(x):
        mode.__enter__()
        return _softmax(x)

    try:
        with pytest.raises(timing.Failure) as caught:
            timer.timed_batch(leaves_a_mode, [[torch.randn(3, 5)]], [torch.empty(3, 5)])
    finally:
        mode.__exit__(None, None, None)
    assert caught.value.rule == "tampering"


def test_the_loops_do_not_read_patched_module_globals(monkeypatch):
    """The loops hold C-level callables taken when they were built: patching torch or time later changes nothing."""
    import time

    timer = _timer()
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, other: self)
    slot = torch.empty(3, 5)
    x = torch.randn(3, 5)
    times = timer.timed_batch(_softmax, [[x]], [slot])
    timer.seal()
    assert times[0] > 0 and torch.equal(slot, _softmax(x))


def test_burst_and_queued_on_the_cpu():
    timer = _timer()
    result = timer.burst(_softmax, [[torch.randn(3, 5)]], 5)
    assert result["calls"] == 5 and result["wall_ms_per_call"] >= result["launch_ms_per_call"] > 0
    assert "events_ms_per_call" not in result
    assert timer.queued(_softmax, [[torch.randn(3, 5)]], [torch.empty(3, 5)], 0.1) is None  # needs a GPU
    assert 0 < timer.issue_probe(calls=20, repeats=3) < 10_000


def test_the_escape_slack_is_per_batch_so_long_batches_see_small_hidden_work():
    assert timing.escape_bound(0.015, 0.005, calls=1) == pytest.approx(1.5 * 0.015 + timing.ESCAPE_SLACK_MS)
    # 15 us calls whose events saw 5 us: hidden in a 20-call batch, caught in one of burst_calls(0.005)
    calls = timing.burst_calls(0.005)
    assert calls >= 1000 and 0.015 > timing.escape_bound(0.005, 0.005, calls)
    assert timing.burst_calls(5.0) == 20


def test_host_bound_means_issuing_the_call_took_most_of_its_median():
    assert timing.is_host_bound(1.0, {"launch_ms_per_call": 0.8})
    assert not timing.is_host_bound(1.0, {"launch_ms_per_call": 0.79})
    assert not timing.is_host_bound(1.0, None)  # the CPU has no batch check
    assert not timing.is_host_bound(None, {"launch_ms_per_call": 0.8})


def test_sets_per_batch_grows_for_small_inputs_and_respects_memory():
    from harness.timing import MAX_SETS_PER_BATCH, sets_per_batch

    assert sets_per_batch(6.3e6, 24e9) == MAX_SETS_PER_BATCH  # InfoNCE seed: short, launch-bound calls
    assert sets_per_batch(302e6, 24e9) == 4  # large inputs keep four sets
    assert sets_per_batch(12.9e9, 24e9) == 1  # one set is all that fits
    assert sets_per_batch(6.3e6, 50e6) == 7  # the memory budget caps it
    assert sets_per_batch(0, 24e9) == MAX_SETS_PER_BATCH


def test_the_parent_clock_bound_is_tight():
    """A figure forged to half of what the parent's clock saw is outside the bound; an honest one is inside
    (a 15 us kernel's shape is small: its batches hold the most sets)."""
    calls = timing.MAX_SETS_PER_BATCH
    assert 0.0152 < timing.parent_clock_bound(0.0152, calls)
    assert 0.0152 > timing.parent_clock_bound(0.0152 / 2, calls)


def test_the_parent_clock_bound_allows_a_host_bound_call_its_issue_time():
    """Figures from the H200 (softmax simple.py, 'tiny'): a 3.9 us kernel whose forward takes 25 us to issue
    back to back, and the parent's clock saw 35.4 us per call beyond a trivial one over the timed batches. The
    events' median alone would call that an escape; the issue time explains it. A call issued as fast as it
    runs gets no such allowance."""
    calls = timing.MAX_SETS_PER_BATCH
    assert 0.0354 > timing.parent_clock_bound(0.0039, calls)
    assert 0.0354 < timing.parent_clock_bound(0.0039, calls, host_ms=0.0250)
    assert timing.parent_clock_bound(0.0152, calls, host_ms=0.0100) == timing.parent_clock_bound(0.0152, calls)


def _worker_replying(*replies):
    """A Worker whose child answers with `replies`, in order (nothing runs)."""
    import types

    from harness.runner import Worker

    worker = object.__new__(Worker)
    queue = list(replies)
    worker.send, worker.recv = (lambda message: None), (lambda timeout=None: queue.pop(0))
    worker.process, worker.spec, worker.strays = types.SimpleNamespace(poll=lambda: None), {"kind": "solution"}, list
    worker._guard_report = lambda: ""
    return worker


def test_a_guard_report_while_the_child_lives_rejects_the_request():
    """A copy of the child (a raw fork, unseen) that trips the guard writes its report on the guard's pipe and
    dies; the child itself answers. The report still decides: the solution started that copy."""
    from harness.runner import Failure

    worker = _worker_replying({"status": "ok"})
    worker._guard_report = lambda: "sandbox-violation\topens /dev/shm/x for writing (the parent's shared memory)"
    with pytest.raises(Failure) as caught:
        worker.request({"cmd": "call"}, 5, "running a trial")
    assert caught.value.rule == "sandbox-violation" and "a process the solution started" in caught.value.reason


def test_the_parent_reads_its_clock_at_each_mark_of_a_timed_request_only():
    from harness.runner import Failure, marked_wall

    marks = []
    reply = _worker_replying({"status": "mark"}, {"status": "mark"}, {"status": "ok"}).request({"cmd": "time"}, 5, "timing", None, marks)
    assert reply["status"] == "ok" and len(marks) == 2 and marked_wall(marks, "timing") >= 0
    for replies, marks in (([{"status": "mark"}, {"status": "ok"}], None),  # a request that asked for none
                           ([{"status": "mark"}] * 3 + [{"status": "ok"}], [])):  # more than a batch has
        with pytest.raises(Failure) as caught:
            _worker_replying(*replies).request({"cmd": "time"}, 5, "timing", None, marks)
        assert caught.value.rule == "bad-reply"
    with pytest.raises(Failure) as caught:
        marked_wall([1.0], "timing")  # a reply that came with one mark
    assert caught.value.rule == "bad-reply"
