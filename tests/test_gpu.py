"""On a GPU: every shipped solution passes the whole pipeline (build, correctness with poisoning and
the cache probe, profiler, timing with checked outputs, physics floor, escape check). Skipped without
CUDA; run on the H200 before resolving GPU work."""
import pytest
import torch

from conftest import HAS_CUDA, evaluate
from harness.problem import discover_solutions, find_problem

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")]

SHIPPED = [(p, path) for p in ("softmax", "cross_entropy", "infonce") for path in discover_solutions(p)]
# A few correctness shapes that catch size assumptions, plus the default (timing) shape.
GPU_SHAPES = {
    "softmax": ("one_row", "tiny", "odd_prime_width", "mid_bf16", "huge_row"),
    "cross_entropy": ("one_row", "two_classes", "odd_prime_width", "vocab_bf16", "huge_row"),
    "infonce": ("tiny", "one_negative", "odd_sizes", "cold_temperature", "256x512_n2560"),
}


@pytest.mark.parametrize("problem, path", SHIPPED, ids=[f"{p}/{path.name}" for p, path in SHIPPED])
def test_shipped_solution_passes_on_gpu(tmp_path, problem, path):
    record = evaluate(problem, path, tmp_path, shapes=GPU_SHAPES[problem], trials=3, timeout=300, budget=0.3)
    assert record["status"] == "ok", f"{record['rule']}: {record['reason']}"
    assert record["profile"]["own_kernels"] >= 1 and record["profile"]["own_share"] > 0.5
    assert all(t["timer"] == "cuda-events" and t["median_ms"] > 0 for t in record["timings"])


@pytest.mark.parametrize("problem", ["softmax", "cross_entropy", "infonce"])
def test_eager_baseline_is_timed_with_events(tmp_path, problem):
    shape = find_problem(problem).default_shape.name
    record = evaluate(problem, None, tmp_path, shapes=(shape,), kind="eager", budget=0.3, min_reps=10)
    assert record["status"] == "ok", record["reason"]
    timing = record["timings"][0]
    assert timing["timer"] == "cuda-events" and timing["reps"] >= 10 and timing["pct_copy_bw"] > 0


def test_ceilings_are_plausible():
    from harness.timing import copy_bandwidth

    assert 0.5e12 < copy_bandwidth(torch.device("cuda"), nbytes=2**30) < 20e12


def test_broken_solutions_beside_good_ones_each_get_their_reason(tmp_path):
    """A crashing, a hanging, a faulting and a non-compiling solution in one `eval` with a good one:
    each gets its one-line reason, the good one is still checked, timed and ranked."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    broken = repo / "tests" / "fixtures" / "broken"
    files = [repo / "solutions" / "softmax" / "fast.py"] + [broken / f"{n}.py" for n in ("segfault", "hang_kernel", "illegal_access", "compile_error")]
    args = [sys.executable, "-m", "harness", "eval", "softmax", "--shape", "one_row", "--shape", "8192x16384_fp32", "--trials", "5",
            "--timeout", "60", "--budget", "0.5", "--no-externals", "--results", str(tmp_path), "--json"]
    for f in files:
        args += ["--solution", str(f)]
    out = subprocess.run(args, cwd=repo, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 1, out.stderr[-3000:]
    records = {Path(r["path"]).stem: r for r in json.loads(out.stdout) if r["kind"] == "solution"}
    assert records["fast"]["status"] == "ok" and records["fast"]["timings"][0]["speedup_eager"] > 0
    assert records["segfault"]["rule"] == "crash" and "SIGSEGV" in records["segfault"]["reason"]
    assert records["hang_kernel"]["rule"] == "timeout"
    assert records["illegal_access"]["rule"] == "cuda-error" and "illegal" in records["illegal_access"]["reason"]
    assert records["compile_error"]["rule"] == "compile-error" and "blockIdxx" in records["compile_error"]["reason"]
    board = (tmp_path / "leaderboard.md").read_text()
    assert "1. fast.py" in board and all(name in board for name in ("segfault.py", "hang_kernel.py", "compile_error.py"))
