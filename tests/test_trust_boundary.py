"""The trust boundary between the parent and the sandboxed child: every exploit listed in
tests/adversarial/trust_boundary.yaml is rejected by one of the rules its entry expects (or, for an
attempt the harness cannot see, blocked by the sandbox), and leaves nothing behind: the repository's
results file unchanged, no marker file that only a successful attack writes, no surviving process.
CPU cases run in CI; GPU cases (gpu_only, gpu_too) need CUDA.

An entry with `known_open: "<why>"` is a bypass that is known and not fixed: its test is an expected
failure (xfail) while the exploit still gets through (accepted, or its marker file written), and a
plain failure the moment it is rejected, saying to drop the mark (so the list of open holes stays
honest). `known_open_on: [cpu]` limits the mark to the devices named (a hole the GPU's checks close). The side-effect checks (results file, surviving processes) hold for it all the same."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import HAS_CUDA, SMALL, evaluate, sweep
from harness.problem import REPO_ROOT, find_problem

HERE = Path(__file__).resolve().parent / "adversarial"
MANIFEST = yaml.safe_load((HERE / "trust_boundary.yaml").read_text())
CPU_CASES = [e for e in MANIFEST if not e.get("gpu_only")]
GPU_CASES = [e for e in MANIFEST if e.get("gpu_only") or e.get("gpu_too")]
RESULTS = REPO_ROOT / "results" / "runs.jsonl"
# A master seed no exploit can guess (the fixture's default, 7, is one a solution can find by trying small numbers).
MASTER_SEED = 0x3A9D_61C4_7E25_B0F


def _ids(entries):
    return [e["file"].removesuffix(".py") for e in entries]


def _digest(path: Path):
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rpartition(b")")[2].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read()
    except (OSError, IndexError):
        return False
    return state != b"Z" and (b"sleep" in command or b"python" in command)


def _pid_in(path: str):
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _clear(entry):
    for path in entry.get("absent", []) + entry.get("pids", []) + entry.get("cleanup", []):
        Path(path).unlink(missing_ok=True)


def _survivors(entry) -> list:
    """Processes the exploit started that are still alive (each is killed here, so a failing test leaves none)."""
    found = []
    for path in entry.get("pids", []) + entry.get("absent", []):
        pid = _pid_in(path)
        if pid is None:
            continue
        deadline = time.monotonic() + 3.0
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            found.append(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return found


def _run(entry, tmp_path, device: str, shapes, **kwargs):
    _clear(entry)
    before = _digest(RESULTS)
    try:
        record = evaluate(entry["problem"], HERE / entry["file"], tmp_path, device=device, shapes=shapes,
                          seed=entry.get("seed", MASTER_SEED), **kwargs)
        survivors = _survivors(entry)
        present = [path for path in entry.get("absent", []) if Path(path).exists()]
    finally:
        _clear(entry)
    label = f"{entry['file']} (class {entry['class']}: {entry['note']})"
    if entry.get("results_unchanged"):
        assert _digest(RESULTS) == before, f"{label}: results/runs.jsonl changed"
    assert not survivors, f"{label}: process(es) {survivors} it started outlived the evaluation"
    allowed = entry["expect"]
    accepted = record["status"] == "ok" and "ok" not in allowed
    known = entry.get("known_open") if device in entry.get("known_open_on", ("cpu", "cuda")) else None
    if known:
        if accepted or present:
            how = "accepted" if accepted else f"left {present}"
            pytest.xfail(f"known open ({how}): {known}")
        outcome = f"{record['status']}" + (f" by {record['rule']} ({record['reason']})" if record["status"] != "ok" else "")
        pytest.fail(f"{label}: marked known_open ({known}) but it no longer gets through ({outcome}): "
                    "drop its known_open mark (and check that `expect` names the rule that caught it)")
    assert not present, f"{label}: left {present}, which only a successful attack writes"
    if record["status"] == "ok" and "paid_above_ms" in entry:  # accepted, but at a figure that its own trick made slow
        medians = [t.get("median_ms") for t in record["timings"]]
        if all(m is not None and m > entry["paid_above_ms"] for m in medians):
            return
    if record["status"] == "ok":
        assert "ok" in allowed, f"{label} was ACCEPTED (timings: {[t.get('median_ms') for t in record['timings']]})"
        return
    assert record["status"] == "failed", f"{label}: status {record['status']} ({record['reason']})"
    assert record["rule"] in allowed, f"{label}: rejected by {record['rule']} ({record['reason']}), expected one of {allowed}"
    assert record["reason"] and "\n" not in record["reason"]


def test_manifest_is_complete():
    classes = {e["class"] for e in MANIFEST}
    assert classes >= set(range(1, 12)), f"classes without an exploit: {sorted(set(range(1, 12)) - classes)}"
    for entry in MANIFEST:
        assert (HERE / entry["file"]).is_file(), entry["file"]
        assert entry["file"].startswith("x") and entry["expect"], entry["file"]
        assert entry["problem"] in SMALL, entry["file"]
        assert "known_open" not in entry or (isinstance(entry["known_open"], str) and entry["known_open"].strip()), entry["file"]
        assert set(entry.get("known_open_on", ())) <= {"cpu", "cuda"} and ("known_open_on" not in entry or "known_open" in entry), entry["file"]


# One exploit per class that runs on the CPU, in `make test`; `make test-all` runs them all.
QUICK = {"x01_forge_records_softmax.py", "x02_guess_seed_softmax.py", "x03_finalize_fix_softmax.py", "x06_json_encoder_softmax.py",
         "x07_bf16_products_infonce.py", "x08_half_rows_softmax.py", "x09_blind_recorder_cross_entropy.py", "x10_detached_sleeper_softmax.py", "x11_reply_pipe_softmax.py",
         "x09_forged_stdlib_pyc_softmax.py", "x09_zipimport_bytecode_softmax.py", "x09_forged_code_loader_softmax.py",
         "x09_findcaller_clone_softmax.py", "x09_findcaller_code_swap_softmax.py", "x09_compile_trampoline_softmax.py",
         "x09_native_thread_forge_reply_softmax.py", "x10_native_thread_loop_softmax.py"}


@pytest.mark.parametrize("entry", sweep(CPU_CASES, HERE, QUICK))
def test_exploit_is_rejected_on_cpu(tmp_path, entry):
    _run(entry, tmp_path, "cpu", SMALL[entry["problem"]], trials=2, timeout=120)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("entry", GPU_CASES, ids=_ids(GPU_CASES))
def test_exploit_is_rejected_on_gpu(tmp_path, entry):
    problem = entry["problem"]
    shapes = SMALL[problem] + (find_problem(problem).default_shape.name,)  # the seed / default shape: where timing tricks pay
    _run(entry, tmp_path, "cuda", shapes, trials=2, timeout=300, budget=0.3)


def test_reasons_are_inert_text_in_the_report_and_the_leaderboard(tmp_path):
    """The solution chooses its exception's message and its class's name. One that is rich markup ended the eval
    in the parent's report (the solutions after it never ran); one with newlines and markdown wrote a forged
    section into leaderboard.md. Both are rejected, the honest one after them still runs, and every reason is one
    line of text in both."""
    files = [HERE / "x11_markup_reason_softmax.py", HERE / "x11_forged_section_softmax.py", HERE / "honest_softmax_torch.py"]
    args = [a for f in files for a in ("--solution", str(f))]
    out = subprocess.run([sys.executable, "-m", "harness", "eval", "softmax", *args, "--results", str(tmp_path), "--device", "cpu",
                          "--shape", "one_row", "--trials", "2", "--budget", "0.05", "--no-baselines"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stderr[-3000:]  # something was rejected; nothing crashed
    assert "MarkupError" not in out.stderr and "[/zz] nothing here" in out.stderr
    records = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    verdicts = {Path(r["path"]).name: (r["status"], r["rule"]) for r in records}
    assert verdicts == {files[0].name: ("failed", "exception"), files[1].name: ("failed", "exception"), files[2].name: ("ok", "")}
    assert all("\n" not in r["reason"] for r in records)
    board = (tmp_path / "leaderboard.md").read_text()
    assert "forged section" in board and "<!--" not in board
    assert len([line for line in board.splitlines() if line.startswith("## ")]) == 1


@pytest.mark.slow
def test_two_targets_of_one_run_never_see_the_same_inputs(tmp_path, monkeypatch):
    """A batch worker evaluates many candidates in one Run. Twins (the same bytes under two names) share their
    by-content build folder, which the child may write: had they drawn the same inputs, the first could leave
    its answers there for the second to replay (a red-team find). Every target draws its own."""
    from conftest import SMALL
    from harness.runner import Config, Run, Target

    source = (HERE / "honest_softmax_torch.py").read_text()
    twins = [tmp_path / "a_twin.py", tmp_path / "b_twin.py"]
    for twin in twins:
        twin.write_text(source)
    seeds = {}
    run = Run(torch.device("cpu"), tmp_path / "runs.jsonl", Config(trials=2, budget_s=0.05, min_reps=3, shapes=SMALL["softmax"]),
              seed=MASTER_SEED)
    draw = run._draw
    monkeypatch.setattr(run, "_draw", lambda problem, shape, seed, probe_from=None: (
        seeds.setdefault(current[0], set()).add(seed), draw(problem, shape, seed, probe_from))[1])
    for twin in twins:
        current = [twin.name]
        record = run.evaluate_target(find_problem("softmax"), Target("solution", twin.stem, path=twin), baselines={})
        assert record["status"] == "ok", record
    assert seeds["a_twin.py"] and seeds["b_twin.py"] and not seeds["a_twin.py"] & seeds["b_twin.py"]


@pytest.mark.slow
def test_work_between_cpu_calls_counts_in_their_time(tmp_path, monkeypatch):
    """x05_between_calls computes each answer where the per-call timer did not look (a weakref callback as the
    loop dropped the last output). A CPU call's time is its batch's mean now, everything between the calls
    included: the solution is accepted (its math is honest) at the honest solution's time, not 150x below it.
    The children compute on one thread: torch's threads spin-waiting on a loaded 2-core machine made either
    figure 1.6 to 48 ms from one run to the next (the same file), and the comparison meaningless."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    records = {name: evaluate("softmax", HERE / f"{name}.py", tmp_path / name, shapes=("tiny", "odd_prime_width"), device="cpu",
                              seed=MASTER_SEED, budget=0.2)
               for name in ("honest_softmax_torch", "x05_between_calls_softmax")}
    medians = {}
    for name, record in records.items():
        assert record["status"] == "ok", (name, record.get("reason"))
        medians[name] = [t["median_ms"] for t in record["timings"] if t["shape"] == "odd_prime_width"][0]
    assert medians["x05_between_calls_softmax"] > 0.5 * medians["honest_softmax_torch"], medians
