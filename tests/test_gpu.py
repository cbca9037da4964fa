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
    record = evaluate(problem, None, tmp_path, shapes=(shape,), kind="eager", budget=0.3)
    assert record["status"] == "ok", record["reason"]
    timing = record["timings"][0]
    assert timing["timer"] == "cuda-events" and timing["reps"] >= 10 and timing["pct_copy_bw"] > 0


def test_ceilings_are_plausible():
    from harness.timing import copy_bandwidth

    assert 0.5e12 < copy_bandwidth(torch.device("cuda"), nbytes=2**30) < 20e12
