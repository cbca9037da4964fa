"""Batch evaluation (issue 34): candidates in a folder, one record each, resume, workers replaced, the summary.

The quick tests run the summary math on synthetic records, the worker pool with a fake worker (a few lines of
Python that speak the protocol and die when told), resume against a results file written by hand, and the
build cache. The end-to-end runs (real workers, real candidates, on the CPU) carry `slow`.
"""
import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from harness import batch, build, cli
from harness.records import append_record, read_records

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "batch"
KERNELBENCH = REPO / "tests" / "fixtures" / "kernelbench"
FAST = ["--shape", "one_row", "--trials", "2", "--budget", "0.05", "--host-bound-processes", "1", "--timeout", "5"]


@pytest.fixture(autouse=True)
def _build_key_restored(monkeypatch):
    """The batch sets HARNESS_BUILD_KEY in os.environ (for its workers); no other test may see it afterwards."""
    monkeypatch.setenv(build.KEY_VARIABLE, "")
    monkeypatch.delenv(build.KEY_VARIABLE)


def record(status="ok", rule="", eager=None, compile=None, path="c.py", sha="0", problem="softmax", **extra):
    """A synthetic candidate record: `eager`/`compile` are per-shape speedups."""
    shapes = max(len(eager or []), len(compile or []))
    timings = []
    for i in range(shapes):
        entry = {"shape": f"s{i}", "median_ms": 1.0}
        if eager:
            entry["speedup_eager"] = eager[i]
        if compile:
            entry["speedup_compile"] = compile[i]
        timings.append(entry)
    return {"run_id": "r", "problem": problem, "kind": "solution", "name": Path(path).stem, "path": path, "sha256": sha,
            "status": status, "rule": rule, "reason": "", "timings": timings, "checks": [], "env": {"date": "d"}, **extra}


# ---- the summary ------------------------------------------------------------------------------------------
def test_fast_p_is_the_share_of_all_candidates_correct_and_faster():
    records = [record(eager=[2.0, 8.0]),  # geomean 4
               record(eager=[1.2]), record(eager=[0.9]), record(eager=[0.5]),  # 0.5 is not > 0.5
               record("failed", "wrong-output"), record("failed", "compile-error"), record("failed", "crash"),
               record("failed", "timeout"), record("skipped"), record("failed", "compile-error")]
    s = batch.summarize(records, {"eager": True, "compile": False})
    assert s["candidates"] == 10 and s["correct"] == 4 and s["correct_rate"] == 0.4
    assert s["compiled"] == 7 and s["compile_rate"] == 0.7  # two compile errors and the skipped one
    assert s["fast_p"]["eager"] == {"0": 0.4, "0.5": 0.3, "0.8": 0.3, "1": 0.2, "1.5": 0.1, "2": 0.1}
    assert s["fast_p"]["compile"] is None and s["geomean_speedup"]["compile"] is None
    assert s["geomean_speedup"]["eager"] == pytest.approx((4.0 * 1.2 * 0.9 * 0.5) ** 0.25)
    assert s["failures"] == {"compile-error": 2, "wrong-output": 1, "crash": 1, "timeout": 1}
    assert list(s["failures"])[0] == "compile-error"  # most frequent first
    assert s["skipped"] == 1


def test_a_candidate_speedup_is_the_geomean_over_its_shapes_and_failed_shapes_are_left_out():
    r = record(eager=[2.0, 0.5, 3.0])
    r["timings"][2] = {"shape": "s2", "error": "x", "rule": "exception", "speedup_eager": 100.0}
    assert batch.speedup(r, "eager") == pytest.approx(1.0)
    assert batch.speedup(record(), "eager") is None


def test_an_untimed_baseline_has_no_fast_p_and_a_timed_one_counts_wrong_candidates_as_slow():
    wrong = [record("failed", "wrong-output"), record("failed", "exception")]
    assert batch.summarize(wrong)["fast_p"] == {"eager": None, "compile": None}  # inferred: nothing was timed
    s = batch.summarize(wrong, {"eager": True, "compile": True})
    assert s["fast_p"]["eager"]["0"] == 0.0 and s["geomean_speedup"]["eager"] is None
    assert batch.summarize([], {"eager": True})["fast_p"]["eager"]["1"] == 0.0


def test_the_suite_fast_p_pools_every_candidate_of_every_problem():
    by_problem = {"a": [record(eager=[2.0], problem="a"), record("failed", "wrong-output", problem="a")],
                  "b": [record(eager=[0.5], problem="b"), record(eager=[3.0], problem="b"), record(eager=[1.1], problem="b"),
                        record("failed", "crash", problem="b")]}
    s = batch.suite_summary(by_problem, {"a": {"eager": True}, "b": {"eager": True}})
    assert s["problems"]["a"]["fast_p"]["eager"]["1"] == 0.5
    assert s["problems"]["b"]["fast_p"]["eager"]["1"] == 0.5
    assert s["suite"]["candidates"] == 6 and s["suite"]["fast_p"]["eager"]["1"] == pytest.approx(3 / 6)
    assert s["suite"]["failures"] == {"wrong-output": 1, "crash": 1}
    text = batch.render_markdown({**s, "problem_errors": {}}, "suite")
    assert "| a | 2 |" in text and "| b | 4 |" in text and "`crash`" in text


# ---- candidates, keys, resume -------------------------------------------------------------------------------
def test_candidates_are_keyed_by_path_and_content(tmp_path):
    for name in ("correct.py", "wrong.py"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    (tmp_path / "_helper.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("not a candidate\n")
    ref = batch.problem_ref("softmax")
    found = batch.candidates_for(ref, tmp_path)
    assert [c.path.name for c in found] == ["correct.py", "wrong.py"] and {c.problem for c in found} == {"softmax"}
    r = record(path=found[0].record_path, sha=found[0].sha256)
    assert batch.record_key(r) == found[0].key
    assert batch.record_key({**r, "sha256": "other"}) != found[0].key  # an edited file is a new candidate
    assert batch.record_key({**r, "kind": "eager"}) is None


def test_a_file_linked_twice_is_one_candidate(tmp_path):
    """Symlinks to one file would count it once per link, and raise the batch's correct rate and fast_p."""
    shutil.copy(FIXTURES / "correct.py", tmp_path / "a.py")
    for name in ("b.py", "c.py"):
        (tmp_path / name).symlink_to(tmp_path / "a.py")
    assert [c.path.name for c in batch.candidates_for(batch.problem_ref("softmax"), tmp_path)] == ["a.py"]


def test_a_record_counts_only_for_the_problem_it_was_made_for(tmp_path, monkeypatch):
    """One file offered to two problems (a suite's sample linked from another problem's folder, or --resume into
    a results folder of another problem): the softmax record must neither stand for its cross_entropy verdict
    nor let --resume skip it."""
    shutil.copy(FIXTURES / "correct.py", tmp_path / "c.py")
    softmax, other = batch.problem_ref("softmax"), batch.problem_ref("cross_entropy")
    mine, theirs = batch.candidates_for(softmax, tmp_path)[0], batch.candidates_for(other, tmp_path)[0]
    assert mine.key != theirs.key
    results = tmp_path / "results"
    append_record(record(eager=[2.0], path=mine.record_path, sha=mine.sha256), results / "runs.jsonl")
    assert batch.record_key(read_records(results / "runs.jsonl")[0][0]) == mine.key
    seen = {}

    def fake_pool(tasks, *args, **kwargs):
        seen["tasks"] = [(t.op, t.candidate and t.candidate.problem) for t in tasks]
        return {}, {}, 0

    monkeypatch.setattr(batch, "run_pool", fake_pool)
    monkeypatch.setattr(batch, "build_candidates", lambda *a, **k: {})
    summary = batch.run_batch([other], [theirs], results, batch.Options(device="cpu", resume=True), "cross_entropy")
    assert ("eval", "cross_entropy") in seen["tasks"]
    assert summary["suite"]["correct"] == 0 and summary["unrecorded"] == 1


def test_a_source_too_deep_to_scan_fails_alone(tmp_path):
    """An expression of 600 terms overflowed the scan's recursion in the batch's parent: the whole batch was lost."""
    from harness.scan import scan_violations
    from harness.records import code_hash

    deep = tmp_path / "deep.py"
    deep.write_text("# cuda_sources\nimport torch\n_k = " + " + ".join(["1"] * 600) + "\n" + (FIXTURES / "correct.py").read_text())
    assert scan_violations(deep) == []  # honest, only long
    code_hash(deep)
    deeper = tmp_path / "deeper.py"
    deeper.write_text("_k = " + "(" * 5000 + "1" + ")" * 5000 + "\n")
    assert scan_violations(deeper) == [] and code_hash(deeper)  # beyond the parser (a SyntaxError): the import reports it
    deepest = tmp_path / "deepest.py"
    deepest.write_text("_k = " + " + ".join(["1"] * 10000) + "\n")
    assert [rule for rule, _ in scan_violations(deepest)] == ["introspection"]  # the scan cannot read it: fail closed
    batch.builds_code(batch.candidates_for(batch.problem_ref("softmax"), tmp_path)[0])


def test_a_file_name_that_is_not_utf8_gets_its_seeds():
    from harness.seeds import derive_seed

    name = "/tmp/b_bad\udcffname.py"  # how Python hands back the bytes b"\xff" of a file name
    assert derive_seed(7, name, "one_row") != derive_seed(7, "/tmp/b_badname.py", "one_row")


def test_resume_skips_recorded_candidates_and_reuses_recorded_baselines(tmp_path, monkeypatch):
    """Everything recorded already: --resume starts no worker and builds nothing, and the summary reads the file."""
    folder = tmp_path / "cands"
    folder.mkdir()
    for name in ("correct.py", "wrong.py"):
        shutil.copy(FIXTURES / name, folder / name)
    ref = batch.problem_ref("softmax")
    found = batch.candidates_for(ref, folder)
    results = tmp_path / "results"
    append_record({**record(eager=[2.0], path=found[0].record_path, sha=found[0].sha256)}, results / "runs.jsonl")
    append_record({**record("failed", "wrong-output", path=found[1].record_path, sha=found[1].sha256)}, results / "runs.jsonl")
    append_record({**record(eager=[1.0]), "kind": "eager", "name": "eager", "path": None}, results / "runs.jsonl")
    monkeypatch.setattr(batch, "run_pool", lambda *a, **k: pytest.fail("no worker should start"))
    monkeypatch.setattr(batch, "build_candidates", lambda *a, **k: pytest.fail("nothing should be built"))
    summary = batch.run_batch([ref], found, results, batch.Options(device="cpu", resume=True), "softmax")
    suite = summary["suite"]
    assert suite["candidates"] == 2 and suite["correct"] == 1 and suite["fast_p"]["eager"]["1.5"] == 0.5
    assert json.loads((results / "summary.json").read_text())["suite"]["failures"] == {"wrong-output": 1}
    assert "fast_1.5" in (results / "summary.md").read_text()


def test_resume_hands_recorded_baselines_to_the_rest(tmp_path, monkeypatch):
    folder = tmp_path / "cands"
    folder.mkdir()
    for name in ("correct.py", "wrong.py"):
        shutil.copy(FIXTURES / name, folder / name)
    ref = batch.problem_ref("softmax")
    found = batch.candidates_for(ref, folder)
    results = tmp_path / "results"
    append_record(record(eager=[2.0], path=found[0].record_path, sha=found[0].sha256), results / "runs.jsonl")
    eager = {**record(), "kind": "eager", "name": "eager", "path": None,
             "timings": [{"shape": "one_row", "median_ms": 0.25}]}
    append_record(eager, results / "runs.jsonl")
    seen = {}

    def fake_pool(tasks, slots, results_dir, progress, device, built, preset=None, **_):
        seen["tasks"], seen["preset"] = [(t.op, t.candidate and t.candidate.path.name) for t in tasks], preset
        return preset, {}, 0

    monkeypatch.setattr(batch, "run_pool", fake_pool)
    batch.run_batch([ref], found, results, batch.Options(device="cpu", resume=True), "softmax")
    assert seen["tasks"] == [("eval", "wrong.py")]  # no baselines task: they were recorded
    assert seen["preset"] == {ref: {"one_row": {"eager": 0.25}}}
    seen.clear()
    batch.run_batch([ref], found, results, batch.Options(device="cpu"), "softmax")  # without --resume: everything again
    assert seen["tasks"][0] == ("baselines", None) and len(seen["tasks"]) == 3


# ---- builds ---------------------------------------------------------------------------------------------
def test_content_keys_follow_the_bytes_not_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv(build.KEY_VARIABLE, "content")
    a, b = tmp_path / "a.py", tmp_path / "moved" / "b.py"
    b.parent.mkdir()
    a.write_text("x = 1\n")
    b.write_text("x = 1\n")
    assert build.extension_dir(a, "softmax") == build.extension_dir(b, "cross_entropy")
    b.write_text("x = 2\n")
    assert build.extension_dir(a, "softmax") != build.extension_dir(b, "softmax")
    monkeypatch.delenv(build.KEY_VARIABLE)
    a.write_text("x = 1\n")
    assert build.extension_dir(a, "softmax") != build.extension_dir(b, "softmax")  # eval's own key: the path


def test_a_built_candidate_is_never_built_again_and_twins_build_once(tmp_path, monkeypatch):
    monkeypatch.setenv(build.KEY_VARIABLE, "content")
    monkeypatch.setattr(build, "BUILD_ROOT", tmp_path / "build")
    source = "from torch.utils.cpp_extension import load_inline\n# cuda_sources=...\nclass ModelNew: pass\n"
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "a.py").write_text(source)
    (folder / "twin.py").write_text(source)
    (folder / "other.py").write_text(source + "# other\n")
    (folder / "plain.py").write_text("class ModelNew: pass\n")
    ref = batch.problem_ref("softmax")
    found = batch.candidates_for(ref, folder)
    cached = build.extension_dir(folder / "other.py", "softmax") / "ext"
    cached.mkdir(parents=True)
    (cached / "ext.so").write_bytes(b"")
    calls = []

    def fake_prebuild(items, device, jobs=4, timeout=0, **_):
        calls.append(sorted(p.name for _, p in items))
        return {str(p): (True, 12.0) for _, p in items}

    monkeypatch.setattr("harness.runner.prebuild", fake_prebuild)
    outcomes = batch.build_candidates(found, 3, "cpu")
    assert calls == [["a.py"]]  # the twin shares a.py's build; other.py is cached; plain.py builds no CUDA
    assert outcomes[str(folder / "other.py")] == (True, 0.0)
    assert outcomes[str(folder / "twin.py")] == outcomes[str(folder / "a.py")] == (True, 12.0)
    assert str(folder / "plain.py") not in outcomes


@pytest.mark.parametrize("build_first", [False, pytest.param(True, marks=pytest.mark.slow)])  # one in `make test`
def test_candidates_are_evaluated_as_their_builds_end(tmp_path, monkeypatch, build_first):
    """Builds overlap with the evaluation: a plain candidate is evaluated while another is still building, and
    the built one only once its build has ended; the builds see no GPU and run at a low priority. With
    --build-first, nothing is evaluated before every build has ended."""
    monkeypatch.setattr(build, "BUILD_ROOT", tmp_path / "build")
    folder = tmp_path / "cands"
    folder.mkdir()
    shutil.copy(FIXTURES / "correct.py", folder / "correct.py")
    (folder / "cuda.py").write_text((FIXTURES / "correct.py").read_text() + "# cuda_sources=... (as a CUDA candidate)\n")
    results = tmp_path / "results"
    events = []

    def solution_records() -> list:
        return [Path(r["path"]).name for r in read_records(results / "runs.jsonl")[0] if r["kind"] == "solution"]

    def fake_prebuild(items, device, jobs=4, timeout=0, on_done=None, env=None, nice=0, **_):
        events.append(("build starts", solution_records(), env, nice, str(device)))
        deadline = time.monotonic() + 120
        while not build_first and "correct.py" not in solution_records() and time.monotonic() < deadline:
            time.sleep(0.2)
        events.append(("build ends", solution_records()))
        outcomes = {str(p): (True, 1.0) for _, p in items}
        for path, outcome in outcomes.items():
            on_done(path, outcome)
        return outcomes

    monkeypatch.setattr("harness.runner.prebuild", fake_prebuild)
    found = batch.candidates_for(batch.problem_ref("softmax"), folder)
    options = batch.Options(device="cpu", trials=2, budget=0.05, shapes=("one_row",), host_bound_processes=1, timeout=5,
                            build_first=build_first)
    summary = batch.run_batch([batch.problem_ref("softmax")], found, results, options, "softmax")
    (_, before, env, nice, device), (_, at_end) = events
    assert before == [] and env == ({} if build_first else {"CUDA_VISIBLE_DEVICES": "", "TORCH_CUDA_ARCH_LIST": build.arch_list()})
    assert (nice, device) == ((0, "cpu") if build_first else (10, "cpu"))
    assert at_end == ([] if build_first else ["correct.py"])  # the plain one was evaluated during the build
    assert solution_records() == ["correct.py", "cuda.py"]  # the built one after its build
    assert summary["meta"]["overlap"] is not build_first and summary["meta"]["builds"] == 1


def test_a_build_spares_the_batch_workers_and_clears_a_stale_lock(tmp_path, monkeypatch):
    """A build ending reaps what its import started, but not the batch's GPU workers (Worker.owned); a `lock`
    left by a killed build (torch's loader would wait on it forever) is removed before the next one starts."""
    from harness import runner
    from harness.problem import find_problem

    monkeypatch.setattr(build, "BUILD_ROOT", tmp_path / "build")
    monkeypatch.setenv(build.KEY_VARIABLE, "content")
    path = tmp_path / "cand.py"
    path.write_text((FIXTURES / "correct.py").read_text() + "# cuda_sources=... (as a CUDA candidate)\n")
    lock = build.extension_dir(path, "softmax") / "cand_ext" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    gpu_worker = subprocess.Popen(["sleep", "60"])
    runner.Worker.owned.add(gpu_worker.pid)
    try:
        ended = []
        outcomes = runner.prebuild([(find_problem("softmax"), path)], "cpu", on_done=lambda p, o: ended.append((p, o)))
        assert gpu_worker.poll() is None  # alive
        assert outcomes[str(path)][0] and ended == [(str(path), outcomes[str(path)])]
        assert not lock.exists()
    finally:
        runner.Worker.owned.discard(gpu_worker.pid)
        gpu_worker.kill()
        gpu_worker.wait()


def test_a_build_whose_reply_cannot_be_read_fails_alone(tmp_path, monkeypatch):
    """Whatever a build worker's reply raises in the parent (a forged frame too deep to parse raised
    RecursionError), that build fails with a reason and the others go on."""
    from harness import runner
    from harness.problem import find_problem

    class Unreadable:
        process = types.SimpleNamespace(poll=lambda: None)

        def send(self, message):
            pass

        def recv(self, timeout):
            raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")

        def close(self):
            pass

    monkeypatch.setattr(runner, "spawn", lambda spec, config, env=None, nice=0: Unreadable())
    paths = []
    for name in ("a.py", "b.py"):
        paths.append(tmp_path / name)
        paths[-1].write_text("# cuda_sources=...\nclass ModelNew: pass\n")
    outcomes = runner.prebuild([(find_problem("softmax"), p) for p in paths], "cpu")
    assert {k: v[0] for k, v in outcomes.items()} == {str(p): False for p in paths}
    assert all("RecursionError" in reason for _, reason in outcomes.values())


# ---- the worker pool: replacement and re-queueing (a fake worker) ------------------------------------------
FAKE_WORKER = textwrap.dedent('''
    import json, os, sys
    fd = int(sys.argv[sys.argv.index("--reply-fd") + 1])
    out = os.fdopen(fd, "w", buffering=1)
    for line in sys.stdin:
        task = json.loads(line)
        if task["op"] == "baselines":
            out.write(json.dumps({"task": task["task"], "event": "done", "baselines": {"s": {"eager": 1.0}}}) + "\\n")
            continue
        path = task["path"]
        if "dies_always" in path:
            os._exit(3)
        if "dies_once" in path:
            marker = path + ".died"
            if not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), 9)
        assert task["baselines"] == {"s": {"eager": 1.0}}, task
        out.write(json.dumps({"task": task["task"], "event": "phase", "phase": "checking"}) + "\\n")
        out.write(json.dumps({"task": task["task"], "event": "done", "status": "ok", "checked": True}) + "\\n")
''')


def test_a_dead_worker_is_replaced_and_its_candidate_queued_again(tmp_path):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    names = ["a.py", "dies_once.py", "b.py", "dies_always.py", "c.py", "d.py"]
    for name in names:
        (tmp_path / name).write_text(f"# {name}\n")
    ref = batch.problem_ref("softmax")
    candidates = batch.candidates_for(ref, tmp_path, "softmax")
    candidates = [c for c in candidates if c.path.name in names]
    tasks = [batch.Task(0, "baselines", ref)] + [batch.Task(i + 1, "eval", ref, c) for i, c in enumerate(candidates)]
    results = tmp_path / "results"
    slots = [batch.Slot(i, [sys.executable, str(script)], None, results / f"worker-{i}.log") for i in range(2)]
    progress = batch.Progress(len(candidates), len(candidates), None, 2)
    baselines, errors, deaths = batch.run_pool(tasks, slots, results, progress, "cpu", {})
    assert baselines == {ref: {"s": {"eager": 1.0}}} and errors == {}
    assert deaths == 3  # dies_once once, dies_always twice
    assert progress.done == len(names) and progress.timed == len(names) - 1 and progress.checked == len(names) - 1
    records, _ = read_records(results / "runs.jsonl")
    assert [(Path(r["path"]).name, r["rule"]) for r in records] == [("dies_always.py", "crash")]
    assert "died 2 times" in records[0]["reason"]
    events, _ = read_records(results / "workers.jsonl")
    assert len(events) == 3 and sorted(Path(e["task"]).name for e in events) == ["dies_always.py", "dies_always.py", "dies_once.py"]
    assert all(s.process.poll() is not None for s in slots)  # every worker ended with the batch
    assert progress.phase_summary()["check"]["candidates"] == len(names) - 1


# ---- the command line -----------------------------------------------------------------------------------
def test_usage_errors(tmp_path, capsys):
    assert cli.main(["eval-batch", "--dir", str(tmp_path)]) == 2
    assert cli.main(["eval-batch", "softmax", "--dir", str(tmp_path / "missing")]) == 2
    assert cli.main(["eval-batch", "softmax", "--dir", str(tmp_path)]) == 2  # no candidates
    assert cli.main(["eval-batch", "softmax", "--suite", str(tmp_path), "--dir", str(tmp_path)]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_the_ray_backend_without_ray_is_a_one_line_usage_error(tmp_path, capsys):
    if importlib.util.find_spec("ray") is not None:
        pytest.skip("ray is installed")
    shutil.copy(FIXTURES / "correct.py", tmp_path / "correct.py")
    assert cli.main(["eval-batch", "softmax", "--dir", str(tmp_path), "--backend", "ray", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install '.[ray]'" in err[0]


def _harness(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


# ---- end to end, on the CPU --------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_mixed_batch_on_two_workers(tmp_path):
    """Every fixture (correct, wrong, crashing, non-compiling, hanging, slow) through two CPU workers: one record
    each, the baselines timed once, then --resume finds nothing left to do."""
    folder = tmp_path / "cands"
    shutil.copytree(FIXTURES, folder)
    results = tmp_path / "results"
    out = _harness("eval-batch", "softmax", "--dir", str(folder), "--results", str(results), "--gpus", "2", "--device", "cpu", *FAST)
    assert out.returncode == 0, out.stderr[-3000:]
    records, _ = read_records(results / "runs.jsonl")
    verdicts = {Path(r["path"]).stem: (r["status"], r["rule"]) for r in records if r["kind"] == "solution"}
    assert verdicts == {"correct": ("ok", ""), "slow": ("ok", ""), "wrong": ("failed", "wrong-output"),
                        "crashing": ("failed", "crash"), "non_compiling": ("failed", "compile-error"),
                        "hanging": ("failed", "timeout")}
    assert [r["kind"] for r in records if r["kind"] != "solution"] == ["eager", "compile"]  # once, before the candidates
    assert all("speedup_eager" in t for r in records if r["status"] == "ok" and r["kind"] == "solution" for t in r["timings"])
    summary = json.loads((results / "summary.json").read_text())["suite"]
    assert summary["candidates"] == 6 and summary["correct"] == 2 and summary["compiled"] == 5
    assert summary["failures"] == {"wrong-output": 1, "crash": 1, "compile-error": 1, "timeout": 1}
    assert summary["fast_p"]["compile"] is None and summary["fast_p"]["eager"]["0"] == pytest.approx(2 / 6)
    assert "fast_p" in out.stdout and "built" in out.stderr and "ETA" in out.stderr
    phases = json.loads((results / "summary.json").read_text())["meta"]["phase_s"]
    assert phases["load"]["candidates"] == 6 and phases["time"]["candidates"] == 2
    seeds, _ = read_records(results / "seeds.jsonl")
    assert len(seeds) == 2  # one Run per worker
    again = _harness("eval-batch", "softmax", "--dir", str(folder), "--results", str(results), "--resume", "--device", "cpu", *FAST)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(read_records(results / "runs.jsonl")[0]) == len(records)
    assert "6 already recorded" in again.stderr


@pytest.mark.slow
def test_suite_mode_on_two_kernelbench_problems(tmp_path):
    suite, samples = tmp_path / "kb", tmp_path / "samples"
    source = tmp_path / "source"
    source.mkdir()
    for name in ("1_Sum_over_dim.py", "4_LeakyReLU.py"):
        shutil.copy(KERNELBENCH / name, source / name)
    assert cli.main(["import-suite", str(source), "--into", str(suite)]) == 0
    (samples / "1_Sum_over_dim").mkdir(parents=True)
    (samples / "4_LeakyReLU").mkdir(parents=True)
    (samples / "1_Sum_over_dim" / "0.py").write_text(textwrap.dedent("""
        import torch
        class ModelNew(torch.nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.dim = dim
            def forward(self, x):
                # a running sum, not aten::sum: under custom: partial a forward of the reference's op alone is rejected
                d = self.dim
                return x.double().cumsum(dim=d).narrow(d, x.shape[d] - 1, 1).to(x.dtype)
    """))
    (samples / "4_LeakyReLU" / "0.py").write_text(textwrap.dedent("""
        import torch
        class ModelNew(torch.nn.Module):
            def __init__(self, negative_slope=0.01):
                super().__init__()
                self.negative_slope = negative_slope
            def forward(self, x):
                return torch.where(x > 0, x, x * self.negative_slope)
    """))
    (samples / "4_LeakyReLU" / "1.py").write_text(textwrap.dedent("""
        import torch
        class ModelNew(torch.nn.Module):
            def __init__(self, negative_slope=0.01):
                super().__init__()
            def forward(self, x):
                return x.clone()
    """))
    results = tmp_path / "results"
    out = _harness("eval-batch", "--suite", str(suite), "--dir", str(samples), "--results", str(results), "--device", "cpu",
                   "--trials", "2", "--budget", "0.05", "--host-bound-processes", "1")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((results / "summary.json").read_text())
    assert set(summary["problems"]) == {"1_Sum_over_dim", "4_LeakyReLU"}
    assert summary["problems"]["1_Sum_over_dim"]["correct"] == 1
    assert summary["problems"]["4_LeakyReLU"]["candidates"] == 2 and summary["problems"]["4_LeakyReLU"]["correct"] == 1
    assert summary["suite"]["candidates"] == 3 and summary["suite"]["correct"] == 2
    assert summary["suite"]["failures"] == {"wrong-output": 1}
    assert "## Per problem" in (results / "summary.md").read_text()


@pytest.mark.slow
def test_the_ray_backend_on_a_local_cpu_instance(tmp_path):
    """The same work as Ray tasks (only where ray is installed; it is not a core dependency)."""
    pytest.importorskip("ray")
    folder = tmp_path / "cands"
    folder.mkdir()
    for name in ("correct.py", "wrong.py", "crashing.py", "hanging.py"):
        shutil.copy(FIXTURES / name, folder / name)
    results = tmp_path / "results"
    command = ("eval-batch", "softmax", "--dir", str(folder), "--results", str(results), "--backend", "ray", "--device", "cpu", *FAST)
    out = _harness(*command)
    assert out.returncode == 0, out.stderr[-3000:]
    records, _ = read_records(results / "runs.jsonl")
    solutions = {Path(r["path"]).name: r for r in records if r["kind"] == "solution"}
    assert {name: r["status"] for name, r in solutions.items()} == {
        "correct.py": "ok", "wrong.py": "failed", "crashing.py": "failed", "hanging.py": "failed"}
    assert solutions["wrong.py"]["rule"] == "wrong-output" and solutions["hanging.py"]["rule"] == "timeout"
    assert solutions["crashing.py"]["rule"] == "crash"
    assert all(Path(r["path"]).parent == folder for r in solutions.values())  # the driver's paths
    summary = json.loads((results / "summary.json").read_text())["suite"]
    assert summary["correct"] == 1 and summary["fast_p"]["eager"]["0"] == 0.25
    # --resume through Ray: every candidate is recorded already, so nothing is evaluated again
    again = _harness(*command, "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(read_records(results / "runs.jsonl")[0]) == len(records)


def test_build_dir_builds_the_candidates_ahead_of_time(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(build, "BUILD_ROOT", tmp_path / "build")
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "cuda.py").write_text("# cuda_sources=...\nclass ModelNew: pass\n")
    (folder / "plain.py").write_text("class ModelNew: pass\n")
    built = []
    monkeypatch.setattr("harness.runner.prebuild", lambda items, device, jobs=4, timeout=0, **_: built.append(jobs) or
                        {str(p): (False, "error: x") for _, p in items})
    assert cli.main(["build", "softmax", "--dir", str(folder), "--jobs", "3"]) == 1
    out = capsys.readouterr().out
    assert built == [3] and "cuda.py: FAILED: error: x" in out and "plain.py" not in out
    assert cli.main(["build", "--dir", str(folder)]) == 2  # which problem?


@pytest.mark.slow
def test_a_real_worker_killed_mid_candidate_is_replaced_and_the_batch_goes_on(tmp_path):
    """Two CPU workers; the test SIGKILLs one while it runs a child (as the OOM killer would): its task is queued
    again, a fresh worker takes over, and every candidate still gets exactly one record."""
    import os
    import signal
    import time

    from harness import sandbox

    folder = tmp_path / "cands"
    folder.mkdir()
    for name in ("correct.py", "wrong.py", "hanging.py"):
        shutil.copy(FIXTURES / name, folder / name)
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "eval-batch", "softmax", "--dir", str(folder), "--results", str(results),
                             "--gpus", "2", "--device", "cpu", *FAST], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed, deadline = None, time.monotonic() + 300
    while killed is None and proc.poll() is None and time.monotonic() < deadline:
        table = sandbox._process_table()
        for pid, parent in table.items():
            busy = any(p == pid for p in table.values())
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if parent == proc.pid and busy and b"harness.batch" in cmdline:
                os.kill(pid, signal.SIGKILL)
                killed = pid
                break
        time.sleep(0.3)
    out, err = proc.communicate(timeout=600)
    assert killed is not None, err[-3000:]
    assert proc.returncode == 0, err[-3000:]
    assert "died" in err and "replacing it" in err
    events, _ = read_records(results / "workers.jsonl")
    assert len(events) == 1 and events[0]["exit"] == -signal.SIGKILL
    records, _ = read_records(results / "runs.jsonl")
    stems = sorted(Path(r["path"]).stem for r in records if r["kind"] == "solution")
    assert stems == ["correct", "hanging", "wrong"]
    summary = json.loads((results / "summary.json").read_text())
    assert summary["worker_deaths"] == 1 and summary["unrecorded"] == 0 and summary["suite"]["correct"] == 1


@pytest.mark.slow
def test_a_batch_ended_by_sigterm_leaves_no_process_and_keeps_its_records(tmp_path):
    """SIGTERM (a scheduler's, timeout's) to the driver while a worker's child spins in a hanging candidate: the
    worker, and the child it ran, once outlived the driver until the candidate's timeout. Now every process of the
    batch is gone at once, and the records written before stay."""
    import os
    import signal
    import time

    from harness import sandbox

    folder = tmp_path / "cands"
    folder.mkdir()
    for name in ("correct.py", "hanging.py"):
        shutil.copy(FIXTURES / name, folder / name)
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "eval-batch", "softmax", "--dir", str(folder), "--results", str(results),
                             "--device", "cpu", *FAST, "--timeout", "300"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)

    def descendants() -> list:
        table, found = sandbox._process_table(), [proc.pid]
        for pid in found:
            found += [child for child, parent in table.items() if parent == pid]
        return found[1:]

    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:  # the hanging candidate's child is running
        records, _ = read_records(results / "runs.jsonl") if (results / "runs.jsonl").exists() else ([], 0)
        if any((r.get("path") or "").endswith("correct.py") for r in records) and len(descendants()) >= 2:
            break
        time.sleep(0.5)
    left = descendants()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    time.sleep(1)
    alive = [pid for pid in left if os.path.exists(f"/proc/{pid}") and b"harness" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert proc.returncode == 128 + signal.SIGTERM and not alive, alive
    records, _ = read_records(results / "runs.jsonl")
    assert [Path(r["path"]).name for r in records if r["kind"] == "solution"] == ["correct.py"]


def test_a_batch_never_writes_to_the_main_results():
    assert batch.default_results("softmax", cuda=False) == REPO / ".scratch" / "batch" / "softmax"
    assert batch.default_results("softmax", cuda=True) == REPO / "results" / "batch" / "softmax"
