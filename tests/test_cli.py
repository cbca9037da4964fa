"""The command line: listing, clear messages for wrong names, JSON output and exit status."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _harness(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_list_names_problems_and_solutions():
    out = _harness("list")
    assert out.returncode == 0
    for name in ("softmax", "cross_entropy", "infonce", "simple.py"):
        assert name in out.stdout


def test_wrong_problem_lists_what_exists():
    out = _harness("eval", "softmx", "--device", "cpu")
    assert out.returncode == 2
    assert "no problem named 'softmx'" in out.stderr and "cross_entropy" in out.stderr


def test_wrong_solution_lists_what_exists():
    out = _harness("eval", "--solution", "solutions/softmax/nope.py", "--device", "cpu")
    assert out.returncode == 2
    assert "no solution file" in out.stderr and "simple.py" in out.stderr


def test_eval_json_and_exit_status(tmp_path):
    good = tmp_path / "good.py"
    good.write_text("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                    "        e = (x.float() - x.float().amax(-1, keepdim=True)).exp()\n        return (e / e.sum(-1, keepdim=True)).to(x.dtype)\n")
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.zeros_like(x)\n")
    args = ["eval", "softmax", "--device", "cpu", "--shape", "one_row", "--trials", "2", "--budget", "0.1", "--no-baselines",
            "--results", str(tmp_path / "results"), "--json", "--seed", "99", "--solution", str(good), "--solution", str(bad)]
    out = _harness(*args)
    assert out.returncode == 1, out.stderr[-2000:]  # one rejected solution fails the run; exit 0 is test_a_cpu_run_...
    ok, failed = json.loads(out.stdout)
    assert ok["status"] == "ok" and ok["timings"][0]["timer"] == "wall-clock"
    assert failed["rule"] == "wrong-output" and "seed" not in failed
    seeds = [json.loads(line) for line in (tmp_path / "results" / "seeds.jsonl").read_text().splitlines()]
    assert seeds[-1]["seed"] == 99 and seeds[-1]["run_id"] == failed["run_id"]  # written when the run ended
    board = (tmp_path / "results" / "leaderboard.md").read_text()
    assert "good.py" in board and "bad.py" in board and "wrong-output" in board


def test_cuda_solutions_are_not_pretended_on_cpu(tmp_path):
    out = _harness("eval", "softmax", "--device", "cpu", "--solution", "solutions/softmax/simple.py", "--shape", "one_row",
                   "--no-baselines", "--results", str(tmp_path), "--json")
    record = json.loads(out.stdout)[0]
    assert record["status"] == "skipped" and "needs a CUDA GPU" in record["reason"] and not record["timings"]
    assert "need a GPU" in out.stderr


@pytest.mark.slow
def test_broken_solutions_beside_a_good_one_on_cpu(tmp_path):
    """The CPU twin of the GPU test: one eval, a good solution ranked, each broken one with its reason."""
    broken = REPO / "tests" / "fixtures" / "broken"
    files = [REPO / "tests" / "adversarial" / "honest_softmax_torch.py", broken / "segfault.py", broken / "hang_python.py",
             broken / "compile_error_cpp.py"]
    args = ["eval", "softmax", "--device", "cpu", "--shape", "one_row", "--trials", "5", "--budget", "0.1", "--timeout", "10",
            "--results", str(tmp_path), "--json"]
    for f in files:
        args += ["--solution", str(f)]
    out = _harness(*args, timeout=900)
    assert out.returncode == 1, out.stderr[-2000:]
    records = {Path(r["path"]).stem: r for r in json.loads(out.stdout) if r["kind"] == "solution"}
    assert records["honest_softmax_torch"]["status"] == "ok"
    assert records["segfault"]["rule"] == "crash" and "SIGSEGV" in records["segfault"]["reason"]
    assert records["hang_python"]["rule"] == "timeout"
    assert records["compile_error_cpp"]["rule"] == "compile-error" and "undeclared" in records["compile_error_cpp"]["reason"]
    board = (tmp_path / "leaderboard.md").read_text()
    assert "1. honest_softmax_torch.py" in board and "**crash**" in board and "**timeout**" in board and "**compile-error**" in board


def test_host_bound_processes_flag():
    from harness.cli import _parser

    assert _parser().parse_args(["eval"]).host_bound_processes == 5
    assert _parser().parse_args(["eval", "--host-bound-processes", "1"]).host_bound_processes == 1
    assert "median of their medians" in _harness("eval", "--help").stdout


def test_an_unknown_shape_is_a_usage_error_before_anything_runs(tmp_path, capsys):
    """`--shape` with a name no selected problem has would check no shape and still say "correct"."""
    import pytest

    from harness.cli import _check_shape_names, main
    from harness.problem import ProblemError, find_problem

    softmax, infonce = find_problem("softmax"), find_problem("infonce")
    assert main(["eval", "softmax", "--shape", "one_row", "--shape", "nope", "--device", "cpu", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: problem softmax has no shape 'nope'; shapes: {', '.join(s.name for s in softmax.shapes)}"]
    assert not any(tmp_path.iterdir())  # nothing ran, nothing was recorded
    # Several problems: a name must be one problem's at least, and each problem runs the names it has.
    with pytest.raises(ProblemError, match="problems softmax, infonce have no shape 'nope'; shapes: softmax: .*; infonce: "):
        _check_shape_names([softmax, infonce], ["tiny", "nope"])
    assert _check_shape_names([softmax, infonce], ["one_row", "one_query"]) == ([softmax, infonce], [])
    assert _check_shape_names([softmax, infonce], ["width_one"]) == ([softmax], [infonce])
    assert _check_shape_names([softmax, infonce], []) == ([softmax, infonce], [])


def test_an_abbreviated_or_unknown_option_is_a_usage_error(capsys):
    """`eval --problem softmax` once passed as `--problems-dir softmax`: no problem found, nothing run, exit 0."""
    import pytest

    from harness.cli import _parser, main

    with pytest.raises(SystemExit) as stop:
        main(["eval", "--problem", "softmax"])
    assert stop.value.code == 2
    assert "python -m harness: error: unrecognized arguments: --problem" in capsys.readouterr().err
    for argv in (["eval", "--problems", "x"], ["eval", "--sol", "a.py"], ["compare", "--prob", "softmax"], ["leaderboard", "--res", "x"]):
        with pytest.raises(SystemExit) as stop:
            _parser().parse_args(argv)
        assert stop.value.code == 2, argv
    capsys.readouterr()
    assert _parser().parse_args(["eval", "--solution", "a.py"]).solution == ["a.py"]  # whole names still work


def test_a_cpu_run_writes_to_scratch_and_leaves_the_committed_results_alone(tmp_path, monkeypatch):
    from harness import cli

    committed, scratch = tmp_path / "results", tmp_path / "scratch"
    monkeypatch.setattr(cli, "RESULTS_DIR", committed)
    monkeypatch.setattr(cli, "SCRATCH_RESULTS_DIR", scratch)
    honest = REPO / "tests" / "adversarial" / "honest_softmax_torch.py"
    code = cli.main(["eval", "softmax", "--device", "cpu", "--shape", "one_row", "--trials", "2", "--budget", "0.05",
                     "--no-baselines", "--host-bound-processes", "1", "--solution", str(honest)])
    assert code == 0
    assert (scratch / "runs.jsonl").is_file() and (scratch / "leaderboard.md").is_file()
    assert not committed.exists()


def test_a_missing_gpu_is_a_one_line_usage_error(capsys):
    import torch

    from harness.cli import main

    if torch.cuda.is_available():
        return
    assert main(["eval", "softmax", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --device cuda: no CUDA device") and "Traceback" not in err


def test_every_option_shows_its_default_in_help():
    from harness.cli import _parser

    text = _parser()._subparsers._group_actions[0].choices["eval"].format_help()
    assert "(default: 5)" in text and "(default: 2.0)" in text and "(default: cuda when available)" in text


def test_prompt_prints_a_prompt_for_a_problem():
    out = _harness("prompt", "softmax", timeout=120)
    assert out.returncode == 0 and "## Your answer" in out.stdout and "torch.softmax" in out.stdout
