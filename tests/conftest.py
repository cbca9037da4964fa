"""Shared test helpers: run one target through the real pipeline (worker process, checker, rules)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from harness.problem import find_problem
from harness.runner import Config, Run, Target

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")

# Small shapes of each problem, cheap enough for the CPU.
SMALL = {
    "softmax": ("one_row", "not_vector_multiple"),
    "cross_entropy": ("one_row", "not_vector_multiple"),
    "infonce": ("tiny", "odd_sizes"),
}


def correctness_shapes(problem_name: str, max_bytes: float = 16e6) -> tuple:
    """Every correctness shape of a problem that is cheap on the CPU (what a size-assuming exploit meets)."""
    problem = find_problem(problem_name)
    return tuple(s.name for s in problem.shapes_for("correctness") if problem.bytes_moved(s) <= max_bytes)


def sweep(entries: list, folder: Path, quick: set) -> list:
    """Manifest entries as pytest params: those named in `quick`, and those the static scan rejects before any
    process starts (cheap), run in `make test`; the rest carry the `slow` marker (`make test-all`, CI)."""
    from harness.scan import scan_violations

    params = []
    for entry in entries:
        cheap = entry["file"] in quick or bool(scan_violations(folder / entry["file"]))
        params.append(pytest.param(entry, id=entry["file"].removesuffix(".py"), marks=() if cheap else pytest.mark.slow))
    return params


def write_solution(tmp_path: Path, source: str, name: str = "candidate.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def evaluate(problem_name: str, path: Path, tmp_path: Path, *, shapes=None, trials: int = 2, timeout: float = 60.0,
             device: str | None = None, seed: int | None = None, budget: float = 0.1, kind: str = "solution", min_reps: int = 3,
             host_bound_processes: int = 5, reporter=None, sandbox: bool = True) -> dict:
    """Evaluate one solution file the way `make eval` does, and return its record. The master seed is
    fresh for every call, as in a real run: no test may pass because it knows the inputs."""
    problem = find_problem(problem_name)
    device = torch.device(device or ("cuda" if HAS_CUDA else "cpu"))
    shapes = tuple(shapes or SMALL[problem_name])
    config = Config(trials=trials, budget_s=budget, min_reps=min_reps, call_timeout_s=timeout, build_timeout_s=900, shapes=shapes,
                    host_bound_processes=host_bound_processes, sandbox=sandbox)
    run = Run(device, tmp_path / "runs.jsonl", config, seed=seed, reporter=reporter)
    target = Target(kind, Path(path).stem if path else kind, path=Path(path) if path else None)
    return run.evaluate_target(problem, target, baselines={})
