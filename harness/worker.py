"""The child process: imports and runs ONE solution (or a baseline), nothing else.

It answers the parent's commands over a pipe (load, check, time, profile, quit). It never sees the
run's master seed (only per-trial seeds, one at a time) and never computes an expected output: it
sends each output, and the inputs as they are after the call, to the parent, which checks them.
Outputs and inputs travel by CUDA IPC (or shared memory on the CPU), so nothing large is copied.
"""
from __future__ import annotations

import collections
import dataclasses
import importlib.util
import os
import random
import sys
import traceback
import warnings
from pathlib import Path

import torch
import torch.multiprocessing  # noqa: F401 - registers the tensor-sharing reductions for the pipe

from . import build, integrity, problem as problem_module, profiling, timing
from .integrity import AtenOpRecorder, TamperGuard, ThreadWatch, poison_freed
from .problem import load_module, load_problem
from .timing import device_time_per_call, host_batch_check, host_issue_probe, is_host_bound, time_calls


def installed_versions(module: str) -> dict:
    """{distribution: version} for what provides an importable top-level module (quack -> quack-kernels), so that a
    reference row says which release of another library it timed."""
    from importlib import metadata

    versions = {}
    for name in metadata.packages_distributions().get(module) or [module]:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def requirement_versions(distributions) -> dict:
    """{distribution: version} of what the given distributions require (extras aside) and is installed, torch
    excepted (the run records it): quack's speed follows the nvidia-cutlass-dsl it found, which quack does not pin."""
    import re
    from importlib import metadata

    versions = {}
    for dist in distributions:
        for requirement in metadata.requires(dist) or []:
            if "extra ==" in requirement:
                continue
            name = re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0]
            if name.lower() == "torch":
                continue
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                pass
    return versions


class Rejected(Exception):
    """A rule, with evidence, rejects the target; `rule` names it."""

    def __init__(self, rule: str, reason: str):
        super().__init__(reason)
        self.rule, self.reason = rule, reason


def classify(error: BaseException, phase: str) -> tuple:
    """(rule, one-line reason) for an exception raised by the target."""
    if isinstance(error, Rejected):
        return error.rule, error.reason
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    if isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in text.lower():
        return "out-of-memory", f"out of GPU memory while {phase}: {first[:200]}"
    if "CUDA error" in text or "cudaError" in text or "illegal memory access" in text or "device-side assert" in text:
        return "cuda-error", f"CUDA error while {phase}: {first[:200]}"
    where = ""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if "harness" not in Path(frame.filename).parts:
            where = f" (at {Path(frame.filename).name}:{frame.lineno})"
            break
    return "exception", f"{type(error).__name__} while {phase}: {first[:200]}{where}"


class Worker:
    def __init__(self, conn, spec: dict):
        self.conn = conn
        self.spec = spec
        self.kind = spec["kind"]
        self.device = torch.device(spec["device"])
        self.cpus = timing.pin_near_device(self.device)
        self.problem = load_problem(spec["problem_dir"])
        self.problem.module  # noqa: B018 - import the reference before the solution
        self.models = {}
        self.solution_module = None
        self.guard = None
        self.threads = None

    # ----- commands ---------------------------------------------------------------------
    def load(self, _msg):
        if self.kind != "solution":
            return self._load_other()
        path = Path(self.spec["path"])
        directory = build.prepare_build_env(path, self.problem.name)
        before = build.built_libraries(directory)
        import torch._dynamo  # noqa: F401 - it rewraps some torch functions on import: snapshot after it
        self.threads = ThreadWatch()
        self.guard = TamperGuard([sys.modules[__name__], timing, integrity, problem_module, profiling])
        start = timing._perf_counter()
        try:
            module = load_module(path, f"solution_{path.stem}")
        except SyntaxError as error:
            raise Rejected("import-error", f"syntax error at line {error.lineno}: {error.msg}") from None
        except BaseException as error:  # noqa: BLE001 - any failure to import is reported, not raised
            if build.is_build_failure(error):
                raise Rejected("compile-error", build.summarise_build_error(str(error))) from None
            rule, reason = classify(error, "importing the solution")
            raise Rejected("import-error" if rule == "exception" else rule, reason) from None
        build_s = timing._perf_counter() - start
        if not isinstance(getattr(module, "ModelNew", None), type):
            names = sorted(n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, torch.nn.Module))
            raise Rejected("missing-ModelNew", "defines no class ModelNew" + (f" (nn.Module classes found: {', '.join(names)})" if names else ""))
        self.solution_module = module
        after = build.built_libraries(directory)
        self._verify("loading")
        return {"build_s": build_s, "rebuilt": bool(after) and after != before, "extension_dir": str(directory),
                "cpus": self.cpus}

    def _load_other(self):
        versions = {}
        if self.kind == "external":
            functions = load_module(self.problem.directory / "externals.py", f"externals_{self.problem.name}")
            for package in self.spec["requires"]:
                if importlib.util.find_spec(package) is None:
                    raise Rejected("unavailable", f"{package} is not importable here")
                versions.update(installed_versions(package))
            self.external_fn = getattr(functions, self.spec["function"])
        return {"build_s": 0.0, "rebuilt": False, "cpus": self.cpus, "versions": versions,
                "requirement_versions": requirement_versions(versions)}

    def model_for(self, shape):
        key = shape.name
        if key not in self.models:
            self.models.clear()
            extra = [self.solution_module] if self.solution_module else []
            self.problem.apply_constants(shape, *extra)
            init = self.problem.module.get_init_inputs()
            if self.kind == "solution":
                model = self.solution_module.ModelNew(*init)
            elif self.kind == "external":
                fn = self.external_fn
                model = lambda *inputs: fn(*inputs)  # noqa: E731
            else:
                model = self.problem.module.Model(*init)
            if isinstance(model, torch.nn.Module):
                model = model.to(self.device).eval()
            if self.kind == "compile":
                model = torch.compile(model, dynamic=False)
            self.models[key] = model
        return self.models[key]

    def check(self, msg):
        shape = self.problem.shape(msg["shape"])
        inputs = self.problem.make_inputs(shape, msg["seed"], self.device, msg.get("probe_from"))
        model = self.model_for(shape)
        recorder = AtenOpRecorder() if self.kind == "solution" else None
        with torch.no_grad():
            if recorder is not None:
                with recorder:
                    output = model(*inputs)
            else:
                output = model(*inputs)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self._verify("the checked call")
        if recorder is not None:
            used = sorted(recorder.ops & set(self.problem.core_aten_ops))
            if used:
                raise Rejected("not-custom-kernel", f"forward calls the reference's own op(s) aten::{', aten::'.join(used)}")
        if type(output) is not torch.Tensor:  # noqa: E721
            raise Rejected("bad-output", f"returned {type(output).__module__}.{type(output).__qualname__}, not a plain torch.Tensor")
        self._send_and_wait({"status": "ok", "output": output, "inputs": inputs})
        sizes = [output.untyped_storage().nbytes()] + [x.untyped_storage().nbytes() for x in inputs if isinstance(x, torch.Tensor)]
        del output, inputs
        poison_freed(sizes if self.device.type == "cuda" else [])
        return None

    def time(self, msg):
        shape = self.problem.shape(msg["shape"])
        model = self.model_for(shape)
        base = msg["seed"]

        def draw(k):
            return self.problem.make_inputs(shape, base + 1 + k, self.device)

        kept, chooser, capacity = [], random.Random(os.urandom(16)), msg["keep"]
        last_batch = collections.deque(maxlen=msg["sets_per_batch"])

        def keep(k, output, inputs):
            """Timed calls whose outputs get checked: all of the last batch, and a random sample of the rest."""
            item = (base + 1 + k, output, inputs)
            if len(last_batch) == last_batch.maxlen:
                older = last_batch[0]
                if len(kept) < capacity:
                    kept.append(older)
                elif (slot := chooser.randrange(k + 1)) < capacity:
                    kept[slot] = older
            last_batch.append(item)

        warm = draw(-1)  # drawn once: the warm-up and the host batch check both use it
        probe_us = host_issue_probe(self.device)
        with torch.no_grad():
            stats = time_calls(model, draw, self.device, budget_s=msg["budget_s"], min_reps=msg["min_reps"],
                               sets_per_batch=msg["sets_per_batch"], on_output=keep, warm_inputs=warm)
            def retime():
                """The timed median again, now (the batch check's answer to lasting contention)."""
                return time_calls(model, draw, self.device, budget_s=min(0.5, msg["budget_s"]), min_reps=10,
                                  sets_per_batch=msg["sets_per_batch"], warm_inputs=warm).median_ms

            batch = host_batch_check(model, [warm], self.device, expected_ms=stats.median_ms, retime=retime) if self.device.type == "cuda" else None
            device_ms = None
            if is_host_bound(stats.median_ms, batch):
                # At most 16 calls: a longer batch of many small kernels could fill the launch queue, and the
                # host would then wait for the device instead of running ahead of it.
                device_ms = device_time_per_call(model, draw, self.device, first_k=stats.reps, calls=min(16, msg["sets_per_batch"]),
                                                 host_ms_per_call=batch["launch_ms_per_call"], on_output=keep)
        self._verify("timing")
        kept.extend(last_batch)
        last_batch.clear()
        del warm
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        for seed, output, _ in kept:
            if type(output) is not torch.Tensor:  # noqa: E721
                raise Rejected("bad-output", f"a timed call returned {type(output).__qualname__}, not a plain torch.Tensor")
        reply = {"status": "ok", "stats": dataclasses.asdict(stats) | {"host_probe_us": probe_us, "device_ms": device_ms}, "batch": batch,
                 "kept": [{"seed": s, "output": o, "inputs": i} for s, o, i in kept]}
        self._send_and_wait(reply)
        kept.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return None

    def profile(self, msg):
        shape = self.problem.shape(msg["shape"])
        model = self.model_for(shape)
        inputs = self.problem.make_inputs(shape, msg["seed"], self.device)
        with torch.no_grad():
            result = profiling.profile_kernels(model, inputs)
        self._verify("profiling")
        return result

    # ----- plumbing -----------------------------------------------------------------------
    def _verify(self, phase: str):
        if self.guard is not None:
            changed = self.guard.violations()
            if changed:
                raise Rejected("tampering", f"after {phase}: {'; '.join(changed[:3])}")
        if self.threads is not None:
            extra = self.threads.new_threads()
            if extra:
                raise Rejected("background-thread", f"after {phase}: {len(extra)} thread(s) still running ({', '.join(extra[:3])})")

    def _send_and_wait(self, reply):
        self.conn.send(reply)
        ack = self.conn.recv()
        if ack.get("cmd") != "ack":
            raise RuntimeError(f"protocol: expected ack, got {ack.get('cmd')}")

    def serve(self):
        phases = {"load": ("loading", self.load), "check": ("running a correctness trial", self.check),
                  "time": ("timing", self.time), "profile": ("profiling", self.profile)}
        while True:
            msg = self.conn.recv()
            if msg["cmd"] == "quit":
                return
            phase, handler = phases[msg["cmd"]]
            try:
                result = handler(msg)
            except BaseException as error:  # noqa: BLE001 - every failure becomes a one-line reason
                rule, reason = classify(error, phase)
                self.conn.send({"status": "fail", "rule": rule, "reason": reason})
                # A solution is done at its first failure; a baseline or another library may still
                # run the other shapes (Liger's softmax refuses rows over 64K), unless CUDA is broken.
                if self.kind == "solution" or msg["cmd"] == "load" or rule == "cuda-error":
                    return
                continue
            if result is not None:
                self.conn.send({"status": "ok", **result})


def main(conn, spec):
    """Entry point of the spawned process."""
    warnings.simplefilter("ignore")  # library chatter (profiler, inductor) would bury the one-line verdicts
    try:
        Worker(conn, spec).serve()
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass
    except BaseException as error:  # noqa: BLE001
        rule, reason = classify(error, "starting")
        try:
            conn.send({"status": "fail", "rule": rule, "reason": reason})
        except Exception:  # noqa: BLE001
            pass
    finally:
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
