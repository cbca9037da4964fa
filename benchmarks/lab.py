"""lab: what the benchmark scripts share; the one module of benchmarks/ that imports the harness (its public
functions only, so a change of the harness changes this file alone).

- problems and solutions: `problem`, `solution_paths`, `load_solution` (built where `harness build` builds it),
  `model` (a solution's ModelNew or the reference Model), `externals` (problem.yaml's libraries that import here);
- inputs: `draw` is the harness's own (Problem.make_inputs); consecutive seeds meet every input family;
- verdicts: `check`: one call into poisoned memory, judged by the harness's check_output against the float64
  reference (max abs, max rel, relative L2; the problem's tolerance), inputs unchanged, a bit-identical repeat;
- timing: `bench` (do_bench-style median, L2 flushed), `harness_timing` (the harness's own loops), `ceilings`;
- processes: `run_child` runs a script in a fresh process and collects what it `emit`s, so a crash, a sticky
  CUDA error or a hang in one target cannot hide the others.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.build import prepare_build_env  # noqa: E402
from harness.channel import describe_shared, open_shared  # noqa: E402,F401
from harness.correctness import check_output, inputs_unchanged, native_reference, reference_output, self_check  # noqa: E402,F401
from harness.problem import ProblemError, available_problems, discover_solutions, find_problem, load_module  # noqa: E402
from harness.runner import Config  # noqa: E402
from harness.timing import (TimingStats, burst_calls, copy_bandwidth, make_timer, pin_near_device,  # noqa: E402,F401
                            read_bandwidth, sets_per_batch)

HARNESS = Config()  # the budgets `make eval` runs with
RESULT = "LAB-RESULT "


def device(name: str | None = None) -> torch.device:
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def problem(name: str):
    try:
        return find_problem(name)
    except ProblemError as error:
        raise SystemExit(str(error)) from None


def solution_paths(prob, names=()) -> list:
    """Files named (paths, or names in solutions/<problem>/), or every solution file of the problem."""
    if not names:
        return discover_solutions(prob.name)
    paths = []
    for name in names:
        path = Path(name) if Path(name).is_file() else ROOT / "solutions" / prob.name / f"{Path(name).stem}.py"
        if not path.is_file():
            known = ", ".join(p.stem for p in discover_solutions(prob.name)) or "none"
            raise SystemExit(f"no solution {name!r} for {prob.name}; its files: {known}")
        paths.append(path.resolve())
    return paths


def load_solution(prob, path: Path):
    prepare_build_env(path, prob.name)
    return load_module(path, f"lab_{prob.name}_{path.stem}")


def model(prob, shape, dev: torch.device, module=None):
    """The solution module's ModelNew (None: the reference Model) for `shape`, as the harness builds it."""
    prob.apply_constants(shape, *([module] if module is not None else []))
    made = (module.ModelNew if module is not None else prob.module.Model)(*prob.module.get_init_inputs())
    return made.to(dev).eval() if isinstance(made, torch.nn.Module) else made


def externals(prob) -> dict:
    """{name: function} for problem.yaml's externals whose packages import here."""
    wanted = [e for e in prob.externals if all(importlib.util.find_spec(p) is not None for p in e.requires)]
    if not wanted:
        return {}
    functions = load_module(prob.directory / "externals.py", f"lab_externals_{prob.name}")
    return {e.name: getattr(functions, e.function) for e in wanted}


def shapes(prob, use: str, names=(), max_bytes: float = math.inf) -> list:
    """The shapes named (whatever their use), else those of `use`; at most `max_bytes` of inputs and outputs."""
    chosen = [prob.shape(n) for n in names] if names else prob.shapes_for(use)
    return [s for s in chosen if prob.bytes_moved(s) <= max_bytes]


def timing_shapes(prob, names=(), max_bytes: float = math.inf) -> list:
    """The timing shapes (or those named) that fit; if none does, the largest correctness shape that does."""
    return shapes(prob, "timing", names, max_bytes) or sorted(shapes(prob, "correctness", (), max_bytes), key=prob.bytes_moved)[-1:]


def draw(prob, shape, seed: int, dev: torch.device, probe_from: int | None = None) -> list:
    return prob.make_inputs(shape, seed, dev, probe_from)


def poison(nbytes: int) -> None:
    """Claim cached CUDA blocks of the output's size (and a small one), fill them with 0xFF bytes (NaN in every
    float format) and free them: an output element the call never writes keeps that pattern."""
    if torch.cuda.is_available():
        for n in {max(int(nbytes), 1), 512}:
            block = torch.empty(n, dtype=torch.uint8, device="cuda")
            block.fill_(0xFF)
            del block


def same_bits(a, b) -> bool:
    as_bytes = lambda t: t.detach().contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
    return type(a) is type(b) is torch.Tensor and a.shape == b.shape and a.dtype == b.dtype and torch.equal(as_bytes(a), as_bytes(b))


def check(prob, shape, fn, inputs: list, dev: torch.device, truth=None) -> tuple:
    """(ok, summary) of one call fn(*inputs): poisoned output memory, check_output against the float64
    reference, the inputs bit for bit as drawn, and a second call bit-identical to the first."""
    truth = reference_output(prob, shape, inputs, dev) if truth is None else truth
    originals = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    expected = prob.output_dtype(shape)
    poison(truth.numel() * torch.empty((), dtype=expected).element_size())
    with torch.no_grad():
        out = fn(*inputs)
        sync(dev)
        verdict = check_output(out, truth, expected, prob.tolerance_for(shape.dtype))
        wrong = [w for w in ("" if verdict.ok else verdict.reason, inputs_unchanged(originals, inputs)) if w]
        if verdict.ok and not same_bits(out, fn(*inputs)):
            wrong.append("a second call on the same inputs differs")
    summary = f"abs {verdict.max_abs:.2e} rel {verdict.max_rel:.2e} L2 {verdict.rel_l2:.2e}"
    return not wrong, summary + ("" if not wrong else "  " + "; ".join(wrong))


_FLUSH = {}


def bench(fn, dev: torch.device, warmup_ms: float = 25, rep_ms: float = 100, use_triton: bool = True) -> float:
    """Median ms of fn(): triton.testing.do_bench where it imports, else its method here: calls queued back to
    back, each after an L2 flush (2x the L2, at least 256 MB) between CUDA events. On the CPU, wall time."""
    if dev.type == "cuda" and use_triton and importlib.util.find_spec("triton") is not None:
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    if dev.type == "cuda" and dev not in _FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 * 2**20)
        _FLUSH[dev] = torch.empty(max(2 * l2, 256 * 2**20) // 4, dtype=torch.int32, device=dev)

    def timed(calls: int) -> list:
        if dev.type != "cuda":
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            return times
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
        for begin, end in pairs:
            _FLUSH[dev].zero_()
            begin.record()
            fn()
            end.record()
        sync(dev)
        return [begin.elapsed_time(end) for begin, end in pairs]
    per_call = max(statistics.fmean(timed(5)), 1e-3)
    timed(1 + int(warmup_ms / per_call))
    return statistics.median(timed(max(10, int(rep_ms / per_call))))


def harness_timing(fn, sets: list, dev: torch.device, budget_s: float = HARNESS.budget_s) -> dict:
    """fn timed by the harness's loops as `make eval` runs them: warm-up, batches over `sets` until the standard
    error is under 1% (or the budget is spent); issue_ms from a back-to-back burst, device_ms with the host
    queueing ahead (None where it never got ahead, or on the CPU), probe_us of one tiny operation."""
    warm_up, timed_batch, burst, queued, issue_probe, _after, seal, _sync, _guarded = make_timer(dev, lambda: None)
    with torch.no_grad():
        first = fn(*sets[0])
        slots = [torch.empty_like(first) for _ in sets]
        probe_us = issue_probe()
        warm_up(fn, sets[0], 0.1)
        samples, start = [], time.perf_counter()
        while True:
            samples += timed_batch(fn, sets, slots)
            seal()
            stats = TimingStats.from_samples(samples, "lab")
            if len(samples) >= HARNESS.min_reps and (stats.se_pct < 1.0 or len(samples) >= 2000 or time.perf_counter() - start > budget_s):
                break
        issue_ms = burst(fn, sets, burst_calls(stats.median_ms))["launch_ms_per_call"]
        device_ms = queued(fn, sets[:16], slots[:16], issue_ms)
        seal()
    return {"median_ms": stats.median_ms, "reps": stats.reps, "se_pct": stats.se_pct, "issue_ms": issue_ms,
            "device_ms": device_ms, "probe_us": probe_us}


def ceilings(dev: torch.device) -> dict:
    """The copy and read bandwidth (bytes/s) the harness measures in every run; {} without a GPU."""
    return {"copy": copy_bandwidth(dev), "read": read_bandwidth(dev)} if dev.type == "cuda" else {}


def emit(**fields) -> None:
    """A result line for the parent's run_child (plain output is echoed, this is collected)."""
    print(RESULT + json.dumps(fields), flush=True)


def run_child(script, args: list, hang_s: float, env: dict | None = None) -> tuple:
    """Run `python script args` in a fresh process, echo its output, collect its emit()s. Killed when it prints
    nothing for hang_s seconds. Returns (exit status, None if killed; the emitted dicts)."""
    proc = subprocess.Popen([sys.executable, str(script), *map(str, args)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    killed, results, timer = [], [], None

    def kill():
        killed.append(True)
        proc.kill()
    try:
        while True:
            timer = threading.Timer(hang_s, kill)
            timer.start()
            line = proc.stdout.readline()
            timer.cancel()
            if not line:
                break
            if line.startswith(RESULT):
                results.append(json.loads(line[len(RESULT):]))
            else:
                print(line, end="", flush=True)
    finally:
        timer.cancel()
        proc.stdout.close()
    status = proc.wait()
    return (None if killed else status), results
