"""The parent process: runs each target in a worker of its own, checks, applies the rules, records.

This process holds the run's master seed, draws every input itself, computes every expected output
(in float64) and never imports solution code. Order per problem: the self-check of the tolerances,
the baselines (eager reference, torch.compile), other libraries, then each solution.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import signal
import statistics
import time
import uuid
from pathlib import Path

import torch
import torch.multiprocessing as mp

from . import worker
from .correctness import check_output, inputs_unchanged, reference_output, self_check
from .problem import Problem, ProblemError
from .records import append_record, environment
from .scan import needs_cuda, scan_source
from .seeds import derive_seed, new_master_seed
from .timing import copy_bandwidth, escape_bound, is_host_bound, matmul_rate, sets_per_batch

# A time that implies more than this multiple of the measured copy bandwidth (or of the bf16 matrix
# rate) cannot be real: read-only streams reach ~1.03x the copy figure, so 1.25x leaves honest margin.
PHYSICS_MARGIN = 1.25


@dataclasses.dataclass
class Target:
    kind: str  # solution | eager | compile | external
    name: str
    path: Path | None = None
    requires: tuple = ()
    function: str = ""

    @property
    def label(self) -> str:
        return str(self.path) if self.path else self.name


@dataclasses.dataclass
class Config:
    trials: int = 5
    budget_s: float = 2.0
    min_reps: int = 10
    keep: int = 2
    call_timeout_s: float = 300.0
    build_timeout_s: float = 1800.0
    shapes: tuple = ()
    profile: bool = True
    memory_budget_bytes: float = 24e9
    host_bound_processes: int = 5  # fresh processes a host-bound entry is timed in, the first included (1: only that)


def timing_shapes(problem: Problem, names: tuple, device: torch.device) -> list:
    """The problem's timing shapes (those named, when names are given; named correctness shapes are
    timed when no timing shape is named). Without a GPU the timing shapes are too large to be useful:
    the largest candidate of at most 64 MB is timed instead (a CPU run exercises the pipeline only)."""
    named = [s for s in problem.shapes if s.name in names]
    shapes = ([s for s in named if "timing" in s.uses] or named) if names else problem.shapes_for("timing")
    if device.type != "cuda":
        small = [s for s in (named or problem.shapes_for("correctness")) if problem.bytes_moved(s) <= 64e6]
        shapes = [max(small, key=problem.bytes_moved)] if small else []
    return shapes


class Failure(Exception):
    def __init__(self, rule: str, reason: str):
        super().__init__(reason)
        self.rule, self.reason = rule, reason


class ShapeFailure(Failure):
    """A baseline or another library failed on one shape only (Liger refuses rows over 64K): the
    shape's entry records it and the target's other shapes still run."""


# A worker that crashed, hung or broke its CUDA context can run nothing more: such a failure ends even a
# baseline's target, whose other shapes would need that worker.
WORKER_LOST = ("crash", "timeout", "cuda-error")


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class WorkerHandle:
    """One spawned worker process and the request/reply protocol with a timeout per request."""

    def __init__(self, spec: dict):
        self.spec = spec
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=worker.main, args=(child, spec), daemon=True)
        self.process.start()
        child.close()

    def request(self, msg: dict, timeout: float, phase: str) -> dict:
        try:
            self.conn.send(msg)
        except (BrokenPipeError, OSError):
            raise self._death(phase) from None
        deadline = time.monotonic() + timeout
        while not self.conn.poll(0.2):
            if not self.process.is_alive() and not self.conn.poll(0.5):
                raise self._death(phase)
            if time.monotonic() > deadline:
                self.kill()
                raise Failure("timeout", f"no answer after {timeout:.0f} s while {phase} (hung kernel or endless loop); process killed")
        try:
            reply = self.conn.recv()
        except (EOFError, OSError):
            raise self._death(phase) from None
        if reply.get("status") == "fail":
            raise Failure(reply["rule"], reply["reason"])
        return reply

    def _death(self, phase: str) -> Failure:
        self.process.join(5)
        code = self.process.exitcode
        if code is not None and code < 0:
            return Failure("crash", f"process killed by {_signal_name(code)} while {phase}")
        return Failure("crash", f"process exited (status {code}) while {phase}")

    def ack(self):
        self.conn.send({"cmd": "ack"})

    def kill(self):
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)

    def close(self):
        try:
            if self.process.is_alive():
                self.conn.send({"cmd": "quit"})
                self.process.join(20)
        except (BrokenPipeError, OSError):
            pass
        self.kill()
        self.conn.close()


class Run:
    """One `eval` invocation: its seed, device, ceilings and where records go."""

    def __init__(self, device: torch.device, results_path: Path, config: Config, seed: int | None = None, reporter=None):
        self.device = device
        self.config = config
        self.results_path = results_path
        self.seed = new_master_seed() if seed is None else seed
        self.run_id = uuid.uuid4().hex[:12]
        self.env = environment(device)
        self.report = reporter or (lambda *a, **k: None)
        self.prebuilt = {}  # path -> (ok, build seconds or reason), filled by prebuild()
        if device.type == "cuda":
            self.report("measuring the device's copy bandwidth and matrix rate")
            self.copy_bw = copy_bandwidth(device)
            self.matmul_rate = matmul_rate(device)
        else:
            self.copy_bw = self.matmul_rate = 0.0
        self.env.update(copy_bw_GBps=self.copy_bw / 1e9, bf16_matmul_TFLOPs=self.matmul_rate / 1e12)

    # ------------------------------------------------------------------------------------------
    def evaluate_problem(self, problem: Problem, targets: list) -> list:
        lines = self_check(problem, self.device)
        wrong = [f"{l.shape}/{l.case}: expected {l.expected}, got {l.got}" for l in lines if not l.ok]
        if wrong:
            raise ProblemError(f"{problem.name}: the self-check failed, its tolerances do not separate right from wrong: {'; '.join(wrong[:4])}")
        self.report(f"self-check: {len(lines)} cases behave as expected (reference passes; zeros, constants, other inputs fail)")
        baselines, records = {}, []
        for target in targets:
            record = self.evaluate_target(problem, target, baselines)
            if target.kind in ("eager", "compile") and record["status"] == "ok":
                for entry in (t for t in record["timings"] if "median_ms" in t):
                    baselines.setdefault(entry["shape"], {})[target.kind] = entry["median_ms"]
            append_record(record, self.results_path)
            records.append(record)
            self.report(record=record)
        return records

    def _base_record(self, problem: Problem, target: Target) -> dict:
        record = {
            "run_id": self.run_id, "seed": self.seed, "problem": problem.name, "kind": target.kind,
            "name": target.name, "path": str(target.path) if target.path else None, "status": "ok",
            "rule": "", "reason": "", "checks": [], "timings": [], "warnings": [], "profile": None,
            "device": self.env.get("gpu"), "env": self.env, "build_s": None,
        }
        if target.path:
            record["sha256"] = hashlib.sha256(Path(target.path).read_bytes()).hexdigest()
            record["warnings"] = scan_source(target.path, problem.reference_ops)
        return record

    def evaluate_target(self, problem: Problem, target: Target, baselines: dict) -> dict:
        record = self._base_record(problem, target)
        if target.kind == "compile" and self.device.type != "cuda":
            record.update(status="skipped", reason="torch.compile baseline is timed on GPU runs only")
            return record
        if target.kind == "solution" and self.device.type != "cuda" and needs_cuda(target.path):
            record.update(status="skipped", reason="builds CUDA kernels: needs a CUDA GPU, and this machine has none (not timed)")
            return record
        spec = {"kind": target.kind, "path": str(target.path) if target.path else None, "problem_dir": str(problem.directory),
                "device": str(self.device), "requires": list(target.requires), "function": target.function}
        self.report(f"{target.label}: starting")
        handle = WorkerHandle(spec)
        try:
            loaded = handle.request({"cmd": "load"}, self.config.build_timeout_s, "building and loading")
            built = self.prebuilt.get(str(target.path))
            record["load_s"] = round(loaded["build_s"], 3)
            record["build_s"] = round(built[1], 3) if built and built[0] else record["load_s"]
            record["rebuilt"] = loaded["rebuilt"] or bool(built and built[0] and built[1] > 5)
            if loaded.get("cpus"):
                record["worker_cpus"] = loaded["cpus"]
            if loaded.get("versions"):
                record["versions"] = loaded["versions"]
                record["requirement_versions"] = loaded.get("requirement_versions") or {}
            if target.kind == "solution":
                self._check_correctness(problem, handle, record, target)
                if self.device.type == "cuda" and self.config.profile:
                    self._profile(problem, handle, record)
            self._time(problem, handle, record, target, baselines)
            if record["timings"] and all("error" in t for t in record["timings"]):
                raise Failure(record["timings"][0]["rule"], record["timings"][0]["error"])
        except Failure as failure:
            status = "skipped" if failure.rule == "unavailable" else "failed"
            record.update(status=status, rule=failure.rule if status == "failed" else "", reason=failure.reason)
        except Exception as error:  # noqa: BLE001 - a fault of the checker itself must not end the run
            first = (str(error).strip().splitlines() or [""])[0][:200]
            record.update(status="failed", rule="harness-error", reason=f"the checker failed ({type(error).__name__}: {first}); not the solution's verdict")
        finally:
            handle.close()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        return record

    # ------------------------------------------------------------------------------------------
    def _check_correctness(self, problem: Problem, handle: WorkerHandle, record: dict, target: Target):
        trials = self.config.trials
        for shape in problem.shapes_for("correctness", self.config.shapes):
            self.report(f"{target.label}: checking {shape.name}")
            tolerance = problem.tolerance_for(shape.dtype)
            seeds = [derive_seed(self.seed, problem.name, shape.name, "check", t) for t in range(trials)]
            plan = [(seed, None, f"trial {t + 1}") for t, seed in enumerate(seeds)]
            plan.append((derive_seed(self.seed, problem.name, shape.name, "probe"), seeds[-1], "cache-probe trial"))
            worst = {"max_abs": 0.0, "max_rel": 0.0, "rel_l2": 0.0}
            for seed, probe_from, label in plan:
                reply = handle.request({"cmd": "check", "shape": shape.name, "seed": seed, "probe_from": probe_from},
                                       self.config.call_timeout_s, f"running {shape.name} {label}")
                try:
                    drawn = problem.make_inputs(shape, seed, self.device, probe_from)
                    changed = inputs_unchanged(drawn, reply["inputs"])
                    if changed:
                        raise Failure("input-mutated", f"{shape.name}, {label}: {changed}")
                    expected = reference_output(problem, shape, drawn, self.device)
                    verdict = check_output(reply["output"], expected, shape.torch_dtype, tolerance)
                finally:
                    del reply
                    handle.ack()
                if not verdict.ok:
                    where = " (inputs share their first and last elements with the previous trial: a cached result?)" if probe_from else ""
                    raise Failure(verdict.rule, f"{shape.name} ({shape.dtype}), {label}: {verdict.reason}{where}")
                for key, value in verdict.summary().items():
                    worst[key] = max(worst[key], value)
            record["checks"].append({"shape": shape.name, "dtype": shape.dtype, "trials": len(plan), "passed": True, **worst})

    def _profile(self, problem: Problem, handle: WorkerHandle, record: dict):
        shape = problem.default_shape
        seed = derive_seed(self.seed, problem.name, shape.name, "profile")
        result = handle.request({"cmd": "profile", "shape": shape.name, "seed": seed}, self.config.call_timeout_s, "profiling")
        result.pop("status", None)
        record["profile"] = result
        if result["kernel_count"] and result["own_kernels"] == 0:
            names = ", ".join(k["name"][:40] for k in result["kernels"][:3])
            raise Failure("not-custom-kernel", f"launched {result['kernel_count']} kernel(s), none of its own ({names})")
        if result["kernel_count"] == 0:
            raise Failure("not-custom-kernel", "launched no GPU kernel at all during forward")

    def _time(self, problem: Problem, handle: WorkerHandle, record: dict, target: Target, baselines: dict):
        shapes = timing_shapes(problem, self.config.shapes, self.device)
        for shape in shapes:
            self.report(f"{target.label}: timing {shape.name}")
            nbytes, flops = problem.bytes_moved(shape), problem.flops(shape)
            sets = sets_per_batch(nbytes, self.config.memory_budget_bytes)
            seed = derive_seed(self.seed, problem.name, shape.name, "time")
            msg = {"cmd": "time", "shape": shape.name, "seed": seed, "budget_s": self.config.budget_s,
                   "min_reps": self.config.min_reps, "keep": self.config.keep, "sets_per_batch": sets}
            try:
                stats, batch = self._time_in(problem, handle, shape, msg, target)
                runs = [(stats["median_ms"], batch, stats.get("host_probe_us"), stats.get("device_ms"))]
                if self.config.host_bound_processes > 1 and is_host_bound(stats["median_ms"], batch):
                    self.report(f"{target.label}: timing {shape.name} again in {self.config.host_bound_processes - 1} more processes (host-bound)")
                    runs += self._time_again(problem, handle, shape, msg, target)
            except ShapeFailure as failure:
                record["timings"].append({"shape": shape.name, "dtype": shape.dtype, "rule": failure.rule, "error": failure.reason})
                continue
            entry = self._timing_entry(shape, stats, batch, [run[0] for run in runs], nbytes, flops, baselines)
            self._note_host_figures(entry, runs)
            record["timings"].append(entry)
            if target.kind == "solution":
                for process, (median, process_batch, *_) in enumerate(runs, 1):
                    self._physics(self._label(shape, process), entry, median, process_batch)

    def _label(self, shape, process: int) -> str:
        """The shape's name, and for an extra process which one, for progress lines and reasons."""
        return shape.name if process == 1 else f"{shape.name} in process {process} of {self.config.host_bound_processes}"

    def _time_in(self, problem: Problem, handle: WorkerHandle, shape, msg: dict, target: Target, process: int = 1) -> tuple:
        """Times `shape` in `handle` and checks the outputs of the timed calls the worker kept, the same
        way in the first process and in every extra one. Returns (stats, batch)."""
        label = self._label(shape, process)
        try:
            reply = handle.request(msg, self.config.call_timeout_s + 10 * self.config.budget_s, f"timing {label}")
        except Failure as failure:
            if target.kind == "solution" or failure.rule in WORKER_LOST:
                raise
            raise ShapeFailure(failure.rule, failure.reason) from None
        try:
            for kept in reply["kept"]:
                drawn = problem.make_inputs(shape, kept["seed"], self.device)
                changed = inputs_unchanged(drawn, kept["inputs"])
                if changed:
                    raise Failure("input-mutated", f"{label}, a timed call: {changed}")
                expected = reference_output(problem, shape, drawn, self.device)
                verdict = check_output(kept["output"], expected, shape.torch_dtype, problem.tolerance_for(shape.dtype))
                del expected, drawn
                if not verdict.ok:
                    rule = "timed-output-wrong" if target.kind == "solution" else verdict.rule
                    raise Failure(rule, f"{label}: the output of a timed call is wrong: {verdict.reason}")
            return reply["stats"], reply.get("batch")
        finally:
            del reply
            handle.ack()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def _time_again(self, problem: Problem, handle: WorkerHandle, shape, msg: dict, target: Target) -> list:
        """(median, batch, host probe, device time) of the same request (same seed, so the same inputs) in fresh workers, one
        after another: a host-bound figure moves more between processes than within one. Timing only:
        the first worker already ran the correctness trials and the profile. Any failure there is a
        solution's failure; for a baseline or another library it ends only this shape."""
        runs = []
        for process in range(2, self.config.host_bound_processes + 1):
            extra = WorkerHandle(handle.spec)
            try:
                extra.request({"cmd": "load"}, self.config.build_timeout_s, f"loading for {self._label(shape, process)}")
                stats, batch = self._time_in(problem, extra, shape, msg, target, process)
                runs.append((stats["median_ms"], batch, stats.get("host_probe_us"), stats.get("device_ms")))
            except Failure as failure:
                if target.kind == "solution":
                    raise
                raise ShapeFailure(failure.rule, failure.reason) from None
            finally:
                extra.close()
        return runs

    @staticmethod
    def _note_host_figures(entry: dict, runs: list):
        """Per process (runs: (median, batch, host probe, device time)): the host's issue time for a tiny
        operation (timing.host_issue_probe), which tells a host-bound figure that moved apart from a host
        that moved; and for a host-bound entry its device time with the host far ahead
        (timing.device_time_per_call), the part of its figure that does not follow the host. The entry's
        device time is the median over the processes that measured one."""
        probes = [run[2] for run in runs]
        if probes and probes[0] is not None:
            entry["host_probe_us"] = probes[0]
            if len(probes) > 1:
                entry["process_host_probe_us"] = list(probes)
        device = [run[3] for run in runs if run[3] is not None]
        if device:
            entry["device_ms"] = statistics.median(device)
            if len(runs) > 1:
                entry["process_device_ms"] = [run[3] for run in runs]

    def _timing_entry(self, shape, stats, batch, medians: list, nbytes, flops, baselines) -> dict:
        """The shape's entry. `medians` has one median per process timed, the first process's first;
        with several, the entry's median is the median of theirs (rates and speedups follow it) and its
        other statistics stay the first process's."""
        median = statistics.median(medians)
        seconds = median / 1e3
        entry = {"shape": shape.name, "dtype": shape.dtype, "median_ms": median, **{k: stats[k] for k in ("mean_ms", "std_ms", "min_ms", "max_ms", "reps", "se_pct", "timer", "budget_hit")},
                 "bytes": nbytes, "flops": flops, "GBps": nbytes / seconds / 1e9 if seconds > 0 else math.inf,
                 "TFLOPs": flops / seconds / 1e12 if seconds > 0 else math.inf, "batch": batch}
        if len(medians) > 1:
            entry.update(median_of="processes", processes=len(medians), process_medians_ms=list(medians))
        if self.copy_bw:
            entry["pct_copy_bw"] = 100.0 * nbytes / seconds / self.copy_bw if seconds > 0 else math.inf
        for kind in ("eager", "compile"):
            base = baselines.get(shape.name, {}).get(kind)
            if base and median > 0:
                entry[f"speedup_{kind}"] = base / median
        return entry

    def _physics(self, label: str, entry: dict, median_ms: float, batch: dict | None):
        """One process's median against the physical floor, and its batch against that median (the
        escape check). Every process is checked, so the entry's median, never below the smallest of
        them, is checked too."""
        if self.device.type != "cuda":
            return
        seconds = median_ms / 1e3
        floor_bytes = entry["bytes"] / (PHYSICS_MARGIN * self.copy_bw)
        floor_flops = entry["flops"] / (PHYSICS_MARGIN * self.matmul_rate) if self.matmul_rate else 0.0
        floor = max(floor_bytes, floor_flops)
        if seconds < floor:
            which = "bytes at the measured copy bandwidth" if floor_bytes >= floor_flops else "flops at the measured bf16 matrix rate"
            raise Failure("impossible-time", f"{label}: median {median_ms * 1e3:.1f} us is below the physical floor of "
                                             f"{floor * 1e6:.1f} us ({which}, with {PHYSICS_MARGIN}x margin)")
        if batch:
            host, launch = batch["wall_ms_per_call"], batch["launch_ms_per_call"]
            tries = f" (fastest of {batch['batches']} batches)" if batch.get("batches", 1) > 1 else ""
            # Under lasting contention the worker re-timed the calls just before its last batches: the bound
            # follows the higher of the two medians (timing.host_batch_check says why that is still safe).
            retimed = batch.get("retimed_median_ms")
            reference = max(median_ms, retimed or 0.0)
            if host > escape_bound(reference, launch):
                seen = f"{median_ms * 1e3:.1f} us" + (f" ({retimed * 1e3:.1f} us re-timed)" if retimed else "")
                raise Failure("escaped-timing", f"{label}: a device-synchronised batch took {host * 1e3:.1f} us per call{tries} but the "
                                                f"timing events saw {seen}: work escaped the events (another stream or thread?)")
            seen = batch.get("events_ms_per_call")
            if seen is not None and host > escape_bound(seen, launch):
                raise Failure("escaped-timing", f"{label}: a device-synchronised batch took {host * 1e3:.1f} us per call but its own "
                                                f"events on the current stream saw {seen * 1e3:.1f} us: work ran on another stream")


def prebuild(items: list, device: torch.device, jobs: int = 4, timeout: float = 1800.0) -> dict:
    """Build (import) several solutions at once, each in its own worker, so that the evaluation that
    follows finds every extension cached. items: (problem, path) pairs. Returns {path: (ok, seconds
    or the failure's reason)}."""
    pending = [(problem, path) for problem, path in items if needs_cuda(path)]
    running, results = [], {}
    while pending or running:
        while pending and len(running) < jobs:
            problem, path = pending.pop(0)
            spec = {"kind": "solution", "path": str(path), "problem_dir": str(problem.directory), "device": str(device),
                    "requires": [], "function": ""}
            handle = WorkerHandle(spec)
            handle.conn.send({"cmd": "load"})
            running.append((path, handle, time.monotonic()))
        for item in list(running):
            path, handle, started = item
            if handle.conn.poll(0) or not handle.process.is_alive() or time.monotonic() - started > timeout:
                try:
                    reply = handle.conn.recv() if handle.conn.poll(0.5) else {"status": "fail", "reason": "no answer"}
                    results[str(path)] = (True, reply["build_s"]) if reply["status"] == "ok" else (False, reply["reason"])
                except (EOFError, OSError):
                    results[str(path)] = (False, "worker died while building")
                handle.close()
                running.remove(item)
        time.sleep(0.2)
    return results
