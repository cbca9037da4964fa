"""A host-bound entry is timed again in fresh worker processes and its figure is the median of their
medians; every process's figure is checked as the first one's is."""
import statistics
from pathlib import Path

import pytest
import torch

from conftest import evaluate, write_solution
from harness import runner
from harness.problem import find_problem
from harness.records import Record
from harness.runner import Config, Failure, Run, Target

CPU = torch.device("cpu")
HONEST = Path(__file__).parent / "adversarial" / "honest_softmax_torch.py"


class ScriptedWorker:
    """Stands in for a child: loading succeeds, nothing else is asked of it (timing is scripted)."""

    def __init__(self, spec: dict, config=None):
        self.spec = spec

    def request(self, msg, timeout, phase, reply_type=None):
        from harness import messages

        return messages.LoadReply(0.0, False, "scripted") if reply_type is messages.LoadReply else {"status": "ok"}

    def close(self):
        self.spec["closed"] += 1


def _reply(median_ms, launch_ms=None, wall_ms=None, device_ms=None, retimed_ms=None, parent_ms=None):
    """One process's timing as Run._time_in returns it; by default host-bound (launching took the whole
    median) and honest. wall_ms: the escape check's wall per call on the parent's clock; parent_ms: the
    parent's clock per timed call beyond a trivial call."""
    from harness.timing import TimingStats

    launch_ms = median_ms if launch_ms is None else launch_ms
    stats = TimingStats(median_ms, median_ms, 0.0, median_ms, median_ms, 10, 0.1, "cuda-events", False)
    wall = wall_ms or 1.05 * median_ms
    batch = {"calls": 20, "launch_ms_per_call": launch_ms, "wall_ms_per_call": wall, "parent_wall_ms": 20 * wall, "batches": 2}
    if retimed_ms is not None:
        batch.update(retimed_median_ms=retimed_ms, batches=6)
    parent = {"wall_ms_per_call": 0.07 + (median_ms if parent_ms is None else parent_ms), "null_ms_per_call": 0.07,
              "request_ms_per_call": 3.0, "null_request_ms_per_call": 2.9, "batches": 5, "calls": 4,
              "device_ms": device_ms, "host_probe_us": 3.0}
    return stats, batch, parent


def _time_scripted(tmp_path, monkeypatch, replies, kind="solution", baselines=None):
    """Run._time with scripted per-process timings, the CUDA checks on (nothing runs on a device): (record, spec)."""
    script = list(replies)

    def time_in(self, problem, worker, shape, target, process):
        reply = script.pop(0)
        if isinstance(reply, Failure):
            if target.kind == "solution":
                raise reply
            raise runner.ShapeFailure(reply.rule, reply.reason)
        return reply

    monkeypatch.setattr(runner, "spawn", ScriptedWorker)
    monkeypatch.setattr(runner.Run, "_time_in", time_in)
    run = Run(CPU, tmp_path / "runs.jsonl", Config(shapes=("one_row",), host_bound_processes=3, profile=False))
    run.device, run.copy_bw, run.read_bw, run.matmul_rate = torch.device("cuda"), 4e12, 4.3e12, 0.0
    spec, record = {"replies": script, "closed": 0}, Record(run_id="r", problem="softmax", kind=kind, name=kind, path=None, device=None, env={})
    run._time(find_problem("softmax"), ScriptedWorker(spec), record, Target(kind, kind), baselines or {})
    return record.to_json(), spec


def test_a_host_bound_entry_takes_the_median_of_the_process_medians(tmp_path, monkeypatch):
    record, spec = _time_scripted(tmp_path, monkeypatch, [_reply(0.20), _reply(0.26), _reply(0.22)],
                                  baselines={"one_row": {"eager": 0.44}})
    entry = record["timings"][0]
    assert entry["process_medians_ms"] == [0.20, 0.26, 0.22] and entry["processes"] == 3 and entry["median_of"] == "processes"
    assert entry["median_ms"] == 0.22 and entry["speedup_eager"] == pytest.approx(2.0)
    assert entry["GBps"] == pytest.approx(entry["bytes"] / 0.22e-3 / 1e9)
    assert entry["pct_copy_bw"] == pytest.approx(100 * entry["bytes"] / 0.22e-3 / 4e12)
    assert entry["mean_ms"] == 0.20 and entry["batch"]["launch_ms_per_call"] == 0.20  # the first process's
    assert spec["closed"] == 2  # both extra workers closed


def test_a_host_bound_entry_records_each_process_device_time_and_their_median(tmp_path, monkeypatch):
    record, _ = _time_scripted(tmp_path, monkeypatch, [_reply(0.20, device_ms=0.081), _reply(0.26, device_ms=None),
                                                       _reply(0.22, device_ms=0.079)])
    entry = record["timings"][0]
    assert entry["process_device_ms"] == [0.081, None, 0.079]  # process 2 never got ahead of its device
    assert entry["device_ms"] == pytest.approx(0.080) and entry["median_ms"] == 0.22  # ranking still uses the median


def test_an_entry_that_is_not_host_bound_is_timed_once(tmp_path, monkeypatch):
    record, spec = _time_scripted(tmp_path, monkeypatch, [_reply(0.20, launch_ms=0.05), _reply(0.26)])
    entry = record["timings"][0]
    assert entry["median_ms"] == 0.20 and "processes" not in entry and "median_of" not in entry and "device_ms" not in entry
    assert len(spec["replies"]) == 1 and spec["closed"] == 0


@pytest.mark.parametrize("extra, rule, words", [
    (_reply(0.20, wall_ms=1.0), "escaped-timing", "one_row in process 2 of 3: 20 device-synchronised calls took 1000.0 us each"),
    (_reply(0.20, parent_ms=0.4), "escaped-timing", "one_row in process 2 of 3: the parent's clock saw 400.0 us per call"),
    (_reply(1e-6), "impossible-time", "one_row in process 2 of 3: median 0.00 us is below the physical floor"),
])
def test_every_process_figure_is_checked_as_the_first_is(tmp_path, monkeypatch, extra, rule, words):
    with pytest.raises(Failure) as caught:
        _time_scripted(tmp_path, monkeypatch, [_reply(0.20), extra, _reply(0.22)])
    assert caught.value.rule == rule and words in caught.value.reason


def test_the_escape_bound_follows_a_median_re_timed_under_contention(tmp_path, monkeypatch):
    """The worker re-timed the calls because every batch was slow: a re-timed median as slow as the batch
    clears it (the figure stays the first median); one that is still fast does not."""
    record, _ = _time_scripted(tmp_path, monkeypatch, [_reply(0.20, launch_ms=0.05, wall_ms=1.0, retimed_ms=0.9)])
    entry = record["timings"][0]
    assert entry["median_ms"] == 0.20 and entry["batch"]["retimed_median_ms"] == 0.9
    with pytest.raises(Failure) as caught:
        _time_scripted(tmp_path, monkeypatch, [_reply(0.20, launch_ms=0.05, wall_ms=1.0, retimed_ms=0.21)])
    assert caught.value.rule == "escaped-timing" and "(210.0 us re-timed)" in caught.value.reason


def test_a_failed_extra_process_fails_a_solution_but_only_the_shape_of_a_baseline(tmp_path, monkeypatch):
    crash = Failure("crash", "worker died (SIGSEGV) while timing one_row in process 3 of 3")
    with pytest.raises(Failure) as caught:
        _time_scripted(tmp_path, monkeypatch, [_reply(0.20), _reply(0.21), crash])
    assert caught.value.rule == "crash"
    record, spec = _time_scripted(tmp_path, monkeypatch, [_reply(0.20), _reply(0.21), crash], kind="eager")
    assert record["timings"] == [{"shape": "one_row", "dtype": "float32", "rule": "crash", "error": crash.reason}]
    assert spec["closed"] == 2


@pytest.mark.slow
def test_real_extra_processes_on_the_cpu(tmp_path, monkeypatch):
    """End to end: real workers; host-bound forced (the CPU worker has no batch check)."""
    monkeypatch.setattr(runner, "is_host_bound", lambda median_ms, batch: True)
    lines = []
    record = evaluate("softmax", HONEST, tmp_path, shapes=("one_row",), budget=0.05, host_bound_processes=3,
                      reporter=lambda message="", record=None: lines.append(message))
    assert record["status"] == "ok", record["reason"]
    entry = record["timings"][0]
    assert entry["processes"] == 3 and len(entry["process_medians_ms"]) == 3
    assert entry["median_ms"] == statistics.median(entry["process_medians_ms"]) > 0
    assert len(entry["process_host_probe_us"]) == 3 and entry["host_probe_us"] == entry["process_host_probe_us"][0] > 0
    assert any(line.endswith("honest_softmax_torch.py: timing one_row again in 2 more processes (host-bound)") for line in lines)


@pytest.mark.slow
def test_a_wrong_output_in_a_real_extra_process_is_caught(tmp_path, monkeypatch):
    """The solution computes honestly in the first process only (a marker file tells it it ran before)."""
    monkeypatch.setattr(runner, "is_host_bound", lambda median_ms, batch: True)
    # its extension folder: the one place every worker of the target may write (a CPU worker cannot write /dev/shm)
    source = """
import os, pathlib
import torch
_MARK = pathlib.Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "ran"
_AGAIN = _MARK.exists()
_MARK.touch()
class ModelNew(torch.nn.Module):
    def forward(self, x):
        if _AGAIN:
            return torch.zeros_like(x)
        e = (x.float() - x.float().amax(-1, keepdim=True)).exp()
        return (e / e.sum(-1, keepdim=True)).to(x.dtype)
"""
    record = evaluate("softmax", write_solution(tmp_path, source), tmp_path, shapes=("one_row",), budget=0.05, host_bound_processes=3)
    assert record["status"] == "failed" and record["rule"] == "timed-output-wrong"
    assert record["reason"].startswith("one_row in process 2 of 3: the output of a timed call is wrong")


def test_an_external_record_names_the_installed_release_of_what_it_requires(tmp_path):
    """A library beside ours in the table: its record says which release ran (here PyYAML, standing in for quack)."""
    import shutil

    import yaml

    from harness.problem import load_problem
    from harness.report import verdict_text

    directory = tmp_path / "softmax"
    shutil.copytree(find_problem("softmax").directory, directory)
    (directory / "externals.py").write_text("import torch\n\ndef yaml_softmax(x):\n    import yaml  # noqa: F401\n"
                                            "    return torch.softmax(x, -1)\n")
    config = Config(trials=1, budget_s=0.05, min_reps=3, call_timeout_s=60, build_timeout_s=60, shapes=("one_row",))
    run = Run(torch.device("cpu"), tmp_path / "runs.jsonl", config, seed=3)
    target = Target("external", "via_yaml", requires=("yaml",), function="yaml_softmax")
    record = run.evaluate_target(load_problem(directory), target, baselines={})
    assert record["status"] == "ok", record["reason"]
    assert record["versions"] == {"PyYAML": yaml.__version__}
    assert record["requirement_versions"] == {}  # PyYAML requires nothing
    assert f"reference PyYAML {yaml.__version__}" in verdict_text(record, short=True)  # the eval table says it too
    assert record["timings"][0]["median_ms"] > 0


def test_what_a_library_requires_is_recorded_with_its_installed_release():
    """rich (a dependency of the harness) requires markdown-it-py and pygments; their releases are recorded."""
    from importlib import metadata

    from harness.child import installed_versions, requirement_versions

    found = requirement_versions(installed_versions("rich"))
    assert found["pygments"] == metadata.version("pygments") and found["markdown-it-py"] == metadata.version("markdown-it-py")


def test_the_physics_floor_reads_at_the_read_ceiling_and_writes_at_what_a_copy_costs(tmp_path):
    """A copy-like kernel (softmax) is bounded by the copy figure, a read-only one (a loss) by the read
    figure; a figure 5% past its ceiling is impossible (the issue's fake softmax read 115% of copy)."""
    run = Run(CPU, tmp_path / "runs.jsonl", Config())
    run.device, run.copy_bw, run.read_bw, run.matmul_rate = torch.device("cuda"), 4.0e12, 4.3e12, 0.0
    softmax = find_problem("softmax")
    shape = softmax.shape("8192x16384_fp32")
    floor, which = run.floor_seconds(softmax, shape)
    assert floor == pytest.approx(softmax.bytes_moved(shape) / 4.0e12) and "bytes" in which
    entropy = find_problem("cross_entropy")
    ce_shape = entropy.shape("8192x32000_fp32")
    assert run.floor_seconds(entropy, ce_shape)[0] == pytest.approx(entropy.bytes_moved(ce_shape) / 4.3e12, rel=1e-6)

    def judge(problem, shape, pct_of_copy):
        median_ms = problem.bytes_moved(shape) / (pct_of_copy / 100 * 4.0e12) * 1e3
        run._physics(problem, shape, shape.name, {}, median_ms, None, {})

    judge(softmax, shape, 100.0)  # honest kernels reach 95-99% of copy
    judge(entropy, ce_shape, 108.0)  # a read-mostly kernel beats the copy figure by reading alone
    for problem, which, pct in ((softmax, shape, 106.0), (softmax, shape, 115.0), (entropy, ce_shape, 113.0)):
        with pytest.raises(Failure) as caught:
            judge(problem, which, pct)
        assert caught.value.rule == "impossible-time"


HONEST_MODEL = HONEST.read_text()


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
def test_bytecode_shipped_beside_a_solution_never_runs(tmp_path, sandboxed):
    """The scan reads the source; Python would run a cached .pyc beside it instead, and an unchecked-hash .pyc
    is never compared with its source. The child imports the solution with its bytecode cache in its own
    scratch folder, so what ran is what was read."""
    import importlib.util
    import py_compile

    folder = tmp_path / "candidates"
    folder.mkdir()
    honest = Path(__file__).parent / "adversarial" / "honest_softmax_torch.py"
    solution = folder / "candidate.py"
    solution.write_text(honest.read_text())
    forged = tmp_path / "forged.py"
    forged.write_text("raise RuntimeError('the shipped bytecode ran')\n")
    py_compile.compile(str(forged), cfile=importlib.util.cache_from_source(str(solution)), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    record = evaluate("softmax", solution, tmp_path, shapes=("tiny",), device="cpu", sandbox=sandboxed)
    assert record["status"] == "ok", (record["rule"], record["reason"])


# importlib caches a decoy of its own in scratch, then its .pyc writer, reached through two tree_maps, writes that
# bytecode as an unchecked-hash cache over VICTIM
_PYC_WRITER = """
    import functools
    import importlib
    import importlib.util
    import os

    import torch
    import torch.nn as nn
    from torch.utils._pytree import tree_map

    VICTIM = "@VICTIM@"


    def _plant():
        s = importlib.import_module("sy" + "s")
        src = os.path.join(os.getcwd(), "decoyvictim.py")
        with open(src, "w") as fh:
            fh.write("X = 'poisoned'\\n")
        was = s.dont_write_bytecode
        s.dont_write_bytecode = False
        try:
            importlib._bootstrap._load(importlib.util.spec_from_file_location("decoyvictim", src))
        finally:
            s.dont_write_bytecode = was
        with open(importlib.util.cache_from_source(src), "rb") as fh:
            data = fh.read()
        forged = importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little") + bytes(8) + data[16:]
        inner = functools.partial(tree_map, importlib._bootstrap_external._write_atomic)
        tree_map(inner, ([VICTIM],), ([forged],), is_leaf=lambda n: type(n) is list)


    _plant()


    class ModelNew(nn.Module):
        def forward(self, x):
            return torch.softmax(x.float(), -1).to(x.dtype)
"""


def test_an_unsandboxed_child_writes_no_bytecode_into_a_pycache_of_others(tmp_path):
    """Without Landlock the guard alone keeps the child's writes in its folders. importlib's own .pyc writer,
    reached through five frames of torch's tree_map (no solution frame near the write), passed for importlib
    caching a module, and wrote bytecode into another folder's __pycache__: a later process importing that
    module ran it (a red-team find). The child writes no bytecode at all now."""
    import importlib.util
    import py_compile

    victim = tmp_path / "victim" / "victimmod.py"
    victim.parent.mkdir()
    victim.write_text("X = 'honest'\n")
    cache = Path(importlib.util.cache_from_source(str(victim)))
    py_compile.compile(str(victim), cfile=str(cache), doraise=True)
    before = cache.read_bytes()
    solution = write_solution(tmp_path, _PYC_WRITER.replace("@VICTIM@", str(cache)))
    record = evaluate("softmax", solution, tmp_path, shapes=("tiny",), device="cpu", sandbox=False)
    assert cache.read_bytes() == before
    assert record["status"] == "failed" and record["rule"] in ("introspection", "sandbox-violation"), (record["rule"], record["reason"])


def test_a_childs_output_reaches_the_parent_as_its_tail_and_its_files_are_capped(tmp_path, capfd):
    """A candidate that printed without end filled eval-batch's worker log (67 MB from one file): the child writes
    to a file of the parent's, capped, and the parent passes on only its last lines, control bytes removed. What a
    child leaves in its build folder outlives it (the cache): no file of its may grow past CHILD_FILE_LIMIT."""
    source = ("import os, sys\nsys.stdout.write(('\\x1b[2J' + 'x' * 99 + '\\n') * 20000)\n"
              "print('--- end of the output of candidate.py ---')\nprint('  other.py: correct')\n"
              "try:\n    with open(os.path.join(os.environ['TMPDIR'], 'blob'), 'wb') as f:\n"
              f"        f.truncate({runner.CHILD_FILE_LIMIT} + (1 << 30))\n"
              "except OSError as error:\n    print('refused:', error.strerror)\n")
    path = write_solution(tmp_path, source + HONEST_MODEL)
    record = evaluate("softmax", path, tmp_path, shapes=("one_row",), device="cpu", host_bound_processes=1)
    assert record["status"] == "ok", record
    err = capfd.readouterr().err
    assert "x" * 99 in err and len(err) < 200_000 and "\x1b" not in err
    assert "refused: File too large" in err
    # what the child prints is never taken for the harness's own lines (a forged verdict or closing line)
    assert "\n| --- end of the output of candidate.py ---\n|   other.py: correct\n" in err


@pytest.mark.skipif(runner.sandbox.landlock_abi() < 6, reason="a child is started ahead only where Landlock scopes signals")
def test_the_next_targets_child_starts_early_and_imports_its_solution_on_its_turn(tmp_path, monkeypatch):
    """evaluate_problem starts the second target's child as the first one's starts (its start-up overlaps the first
    target's checks); the second solution is imported (Load) only once the first target is done, and both pass."""
    from harness import messages

    events = []
    real_spawn, real_request = runner.spawn, runner.Worker.request

    def spawn(spec, config, *args, **kwargs):
        events.append(("spawn", Path(spec["path"]).name))
        return real_spawn(spec, config, *args, **kwargs)

    def request(self, msg, *args, **kwargs):
        if isinstance(msg, messages.Load):
            events.append(("load", Path(self.spec["path"]).name))
        return real_request(self, msg, *args, **kwargs)

    monkeypatch.setattr(runner, "spawn", spawn)
    monkeypatch.setattr(runner.Worker, "request", request)
    first, second = (write_solution(tmp_path, HONEST.read_text(), name) for name in ("first.py", "second.py"))
    config = Config(trials=1, budget_s=0.05, min_reps=3, call_timeout_s=60, shapes=("one_row",))
    run = Run(CPU, tmp_path / "runs.jsonl", config, seed=5,
              reporter=lambda message="", record=None: events.append(("record", record["name"])) if record else None)
    records = run.evaluate_problem(find_problem("softmax"), [Target("solution", p.stem, path=p) for p in (first, second)])
    assert [r["status"] for r in records] == ["ok", "ok"], [r["reason"] for r in records]
    assert events == [("spawn", "first.py"), ("spawn", "second.py"), ("load", "first.py"), ("record", "first"),
                      ("load", "second.py"), ("record", "second")]
    assert run.ahead is None


@pytest.mark.skipif(runner.sandbox.landlock_abi() < 6, reason="a child is started ahead only where Landlock scopes signals")
def test_a_child_started_ahead_that_died_is_replaced_not_blamed(tmp_path, monkeypatch):
    """The next target's child starts while another solution runs, and that solution may starve it (all of the GPU's
    memory taken as its CUDA context is made): a child started ahead that did not come up is replaced by a fresh one
    on its target's turn, never counted against that target. Here the first solution is wrong (so no timing phase
    waits for the child) and the child started ahead is killed."""
    import signal

    real_start = Run.start_ahead

    def start_and_kill(self, problem, target):
        real_start(self, problem, target)
        if self.ahead is not None:
            self.ahead[1].process.send_signal(signal.SIGKILL)

    monkeypatch.setattr(Run, "start_ahead", start_and_kill)
    wrong = write_solution(tmp_path, HONEST.read_text().replace("e / e.sum", "e / 2 / e.sum"), "wrong.py")
    honest = write_solution(tmp_path, HONEST.read_text(), "honest.py")
    config = Config(trials=1, budget_s=0.05, min_reps=3, call_timeout_s=60, shapes=("one_row",))
    run = Run(CPU, tmp_path / "runs.jsonl", config, seed=6)
    records = run.evaluate_problem(find_problem("softmax"), [Target("solution", p.stem, path=p) for p in (wrong, honest)])
    assert [(r["status"], r["rule"]) for r in records] == [("failed", "wrong-output"), ("ok", "")], [r["reason"] for r in records]


def test_a_next_target_that_cannot_start_leaves_nothing_behind(tmp_path):
    """A file name so long that its extension folder cannot be made (a red-team find): the child was started before the
    folder, then left waiting, and as a stray of the target before it (whose child was running) got that honest
    target rejected. Nothing is started before the paths exist; the long name is its own target's failure."""
    honest = write_solution(tmp_path, HONEST.read_text(), "honest.py")
    long_name = write_solution(tmp_path, HONEST.read_text(), "x" * 240 + ".py")
    config = Config(trials=1, budget_s=0.05, min_reps=3, call_timeout_s=60, shapes=("one_row",))
    run = Run(CPU, tmp_path / "runs.jsonl", config, seed=7)
    before = set(runner.sandbox.children())
    records = run.evaluate_problem(find_problem("softmax"), [Target("solution", p.stem, path=p) for p in (honest, long_name)])
    assert records[0]["status"] == "ok", records[0]["reason"]
    assert records[1]["status"] == "failed"
    assert set(runner.sandbox.children()) <= before


def test_a_child_started_while_another_lives_does_not_excuse_its_pid(tmp_path):
    """A pid in a worker's `children_before` is excused from its stray count for good. The child started ahead is
    spawned while the running target's child lives: had it excused that pid, an orphan of its own solution that took
    the pid once the other child had exited (pid reuse, a red-team find) ran unseen through its checks and timing."""
    honest = write_solution(tmp_path, HONEST.read_text(), "honest.py")
    run = Run(CPU, tmp_path / "runs.jsonl", Config(shapes=("one_row",)), seed=8)
    spec = run._spec(find_problem("softmax"), Target("solution", "honest", path=honest))
    running = runner.spawn(spec, run.config)
    try:
        ahead = runner.spawn(spec, run.config)
        try:
            assert running.process.pid not in ahead.children_before
        finally:
            ahead.close()
    finally:
        running.close()


def test_a_target_whose_file_cannot_be_read_is_its_own_failure(tmp_path):
    """The record's hashes read the file before anything else: an error there ended the whole eval (red team), and
    the targets after it had no record. It is that target's harness-error now; the next one is evaluated."""
    unreadable = tmp_path / "folder.py"
    unreadable.mkdir()
    honest = write_solution(tmp_path, HONEST.read_text(), "honest.py")
    config = Config(trials=1, budget_s=0.05, min_reps=3, call_timeout_s=60, shapes=("one_row",))
    run = Run(CPU, tmp_path / "runs.jsonl", config, seed=9)
    records = run.evaluate_problem(find_problem("softmax"), [Target("solution", p.stem, path=p) for p in (unreadable, honest)])
    assert [(r["status"], r["rule"]) for r in records] == [("failed", "harness-error"), ("ok", "")], [r["reason"] for r in records]
