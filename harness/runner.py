"""The parent process: owns the verdict. Runs each target in a sandboxed child, checks, records.

This process holds the run's master seed and is the only one that ever sees a seed. It draws every
input itself, on the device, and shares it with the child (CUDA IPC, or shared files on the CPU). It
hands the child an output slot for every call, filled with a poison pattern; the child copies each
output into its slot right after the call, in stream order, so work that finishes later is not in it.
The parent alone decides which calls it verifies (a random sample the child cannot know, plus the
whole last batch), computes every expected output in float64, times every batch on its own clock and
writes the records. It never imports solution code and never unpickles or executes anything the
child sends: replies are authenticated JSON (harness/channel.py), checked field by field.

Order per problem: the self-check of the tolerances, the baselines (eager, torch.compile), other
libraries, then each solution. The next target's child is started while this one is evaluated (its start,
~6 s of imports and CUDA set-up, is most of a small target's time); no solution code runs in it before its
turn, and it has finished starting before this target is timed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch

from . import build, messages, sandbox
from .channel import ChannelError, describe_shared, new_key, open_channel, send_plain, shared_cpu_tensor
from .correctness import check_output, inputs_unchanged, native_reference, reference_output, self_check
from .guard import GUARD_EXIT
from .problem import REPO_ROOT, Problem, ProblemError, private_files
from .profiling import declared_kernels
from .records import Record, append_record, code_hash, environment, file_sha256
from .rules import CHILD_MAY_REPORT, GUARD, WORKER_LOST, Failure
from .scan import needs_cuda, scan_source, scan_violations
from .seeds import derive_seed, new_master_seed
from .timing import (TimingStats, burst_calls, copy_bandwidth, escape_bound, is_host_bound, matmul_rate, parent_clock_bound,
                     read_bandwidth, sets_per_batch)

# The fastest honest kernels reach ~99% of the copy figure (a copy-like kernel) and ~101% of the read figure
# (a read-mostly one); a time that implies more than this multiple of the ceiling that bounds it is not real.
PHYSICS_MARGIN = 1.05
FLOOR_BYTES = "bytes at the measured read and copy bandwidth"
FLOOR_FLOPS = "flops at the measured bf16 matrix rate"
# A solution's own kernels must take at least this share of its GPU time at every timing shape (the shipped
# ones take over 90%): one trivial kernel beside the library's own op is not a custom kernel.
OWN_SHARE = 0.5
# A timed request's marks: the child sends one as its timed calls begin and one once the device is done, and
# the parent's clock between the two is its own measure of the batch (opening the sets, the child's checkpoint
# and the reply are outside it; no solution code runs there).
MAX_MARKS = 2
# Batches with a trivial call in place of the solution's, for the parent's yardstick.
NULL_BATCHES = 3
CPU_CLOCK_FACTOR = 1.6  # the CPU's bound on the parent's clock, looser than the GPU's: both clocks are the host's, loaded
# The share of the timed calls of every batch but the last (verified whole) whose outputs the parent checks,
# chosen by its secret generator: wrong outputs in a fraction f of N calls pass with odds (1 - f / 4) ** N.
VERIFIED_SHARE = 0.25
# The largest file a child may write (RLIMIT_FSIZE; a build's objects are far smaller): its build folder outlives
# it in the cache. Its output goes to a file of the parent's, of which the parent passes on the last OUTPUT_TAIL
# bytes: one candidate that printed without end filled a batch worker's log.
CHILD_FILE_LIMIT = 1 << 30
OUTPUT_TAIL = 64 << 10


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
    call_timeout_s: float = 300.0
    build_timeout_s: float = 1800.0
    shapes: tuple = ()
    profile: bool = True
    memory_budget_bytes: float = 24e9
    host_bound_processes: int = 5  # fresh processes a host-bound entry is timed in, the first included (1: only that)
    sandbox: bool = True


def timing_shapes(problem: Problem, names: tuple, device: torch.device) -> list:
    """The problem's timing shapes (those named, when names are given; named correctness shapes are
    timed when no timing shape is named). Without a GPU the largest correctness shape of at most 64 MB
    is timed instead (a CPU run exercises the pipeline only)."""
    named = [s for s in problem.shapes if s.name in names]
    shapes = ([s for s in named if "timing" in s.uses] or named) if names else problem.shapes_for("timing")
    if device.type != "cuda":
        small = [s for s in (named or problem.shapes_for("correctness")) if problem.bytes_moved(s) <= 64e6]
        shapes = [max(small, key=problem.bytes_moved)] if small else []
    return shapes


def correctness_shapes(problem: Problem, names: tuple, device: torch.device) -> list:
    """Every correctness shape (those named, when names are given). A named timing shape is checked
    too, so that naming only timing shapes never skips the checks."""
    if not names:
        shapes = problem.shapes_for("correctness")
        # Without a GPU the timing shapes (also correctness shapes) are too large to check in reasonable time.
        return shapes if device.type == "cuda" else [s for s in shapes if problem.bytes_moved(s) <= 64e6]
    return [s for s in problem.shapes if s.name in names and ("correctness" in s.uses or device.type == "cuda")]


def add_baseline(baselines: dict, record: dict) -> None:
    """File an ok eager or torch.compile record's medians in `baselines` ({shape: {kind: ms}}): the figures later
    targets' speedups are taken over."""
    if record.get("kind") in ("eager", "compile") and record.get("status") == "ok":
        for entry in (t for t in record.get("timings", []) if "median_ms" in t):
            baselines.setdefault(entry["shape"], {})[record["kind"]] = entry["median_ms"]


def remove_tree(path: Path) -> None:
    """Remove a folder the child may have written, whatever it left there; never raises. shutil.rmtree recurses
    once per level, so a tree a thousand folders deep (made on purpose) raises RecursionError out of it: `rm -rf`
    finishes what it leaves. Neither follows a symlink out of the tree."""
    try:
        os.chmod(path, 0o700)  # the unlistable shared folders
        shutil.rmtree(path, ignore_errors=True)
    except Exception:  # noqa: BLE001 - RecursionError, or a folder already gone
        pass
    if os.path.lexists(path):
        try:
            subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], capture_output=True, timeout=600)
        except (OSError, subprocess.SubprocessError):
            pass


class ShapeFailure(Failure):
    """A baseline or another library failed on one shape only (Liger refuses rows over 64K)."""


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def child_environment(scratch: Path, extra: dict | None = None) -> dict:
    """A child's environment: the parent's, `extra`, every tool's files in `scratch`, and three settings."""
    env = {**os.environ, **(extra or {}), **sandbox.scratch_environment(scratch)}
    env["KINETO_LOG_LEVEL"] = "6"  # the op trace's profiler would print start/stop lines for every trial
    # torch.compile compiles in the child itself: its pool of compile processes, once warm, failed every later
    # shape in the sandbox (InductorError: SubprocException on the bf16 shapes, H100 and H200, torch 2.11)
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    env.pop("PYTHONPYCACHEPREFIX", None)  # torch's own bytecode beside it; the child moves the cache into scratch itself
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


class Worker:
    """The parent's end of one child process: spawn, sandbox spec, authenticated requests, cleanup. Each
    request names a command whose handler of the same name runs in the child (harness/child.py)."""

    def __init__(self, spec: dict, config: Config, env: dict | None = None, nice: int = 0):
        self.spec = spec
        self.scratch = Path(tempfile.mkdtemp(prefix="harness-child-"))
        self.shared = None
        try:  # every path first: a folder that cannot be made must fail here, before any process exists
            self.shared = self._shared_memory_folder(spec)
            paths = {"read_paths": [str(p) for p in self._read_paths()], "write_paths": self._write_paths(),
                     "map_paths": [str(self.shared)] if self.shared else [], "trusted_dirs": self._trusted_dirs()}
        except BaseException:
            self._remove_folders()
            raise
        cmd_r, cmd_w = os.pipe()
        reply_r, reply_w = os.pipe()
        self.guard_r, guard_w = os.pipe()
        key = new_key()
        # The parent's other children now, but not the workers of other targets (Worker.live, excused while they
        # live): a pid excused here stays excused, and once such a child has exited an orphan could take its pid
        self.children_before = set(sandbox.children()) - Worker.live - Worker.owned
        env = child_environment(self.scratch, env)
        self.output = tempfile.TemporaryFile(prefix="harness-output-")  # unlinked: the child has only the descriptor
        self.process = subprocess.Popen([sys.executable, "-m", "harness.child", str(cmd_r), str(reply_w), str(guard_w)],
                                        pass_fds=(cmd_r, reply_w, guard_w), start_new_session=True, env=env, cwd=str(self.scratch),
                                        stdin=subprocess.DEVNULL, stdout=self.output, stderr=subprocess.STDOUT)
        for fd in (cmd_r, reply_w, guard_w):
            os.close(fd)
        self.fds = (reply_r, cmd_w)
        try:
            if nice:  # before the child is sent its spec: the compilers it starts inherit the priority
                os.setpriority(os.PRIO_PROCESS, self.process.pid, nice)
            send_plain(cmd_w, {**spec, "key": key.hex(), "sandbox": config.sandbox, "scratch": str(self.scratch),
                               "file_limit": CHILD_FILE_LIMIT, **paths})
            self.send, self.recv = open_channel(reply_r, cmd_w, key)
        except BaseException:  # a child never given its orders must not live on as someone's stray
            self.kill()
            for fd in (*self.fds, self.guard_r):
                os.close(fd)
            self._remove_folders()
            raise

    def _read_paths(self) -> list:
        solution = Path(self.spec["path"]) if self.spec.get("path") else None
        extra = [REPO_ROOT / "harness"]
        if solution is not None:  # shared device code (_*.cuh), not the other solutions beside it
            extra += private_files(solution)
        return sandbox.child_read_paths(solution, Path(self.spec["problem_dir"]), extra)

    @staticmethod
    def _shared_memory_folder(spec: dict) -> Path | None:
        """CPU runs: the folder of the files the parent shares with this child (one unlistable folder per shape
        inside it). The child may read and write them, never create, cut short or remove one (Landlock's
        map_paths): a file cut short under the parent's mapping would kill the parent with SIGBUS."""
        if spec.get("device", "cpu").startswith("cuda"):
            return None
        folder = Path(tempfile.mkdtemp(prefix="harness-shared-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
        folder.chmod(0o300)
        return folder

    def _write_paths(self) -> list:
        # CUDA IPC needs /dev/shm (torch's reference-count files, CUDA's own); a CPU child shares through self.shared
        paths = [str(self.scratch)] + ([] if self.shared else ["/dev/shm"])
        if self.spec.get("extension_dir"):
            Path(self.spec["extension_dir"]).mkdir(parents=True, exist_ok=True)
            build.clear_stale_locks(Path(self.spec["extension_dir"]))  # nothing else builds there now
            paths.append(self.spec["extension_dir"])
        return paths

    @staticmethod
    def _trusted_dirs() -> list:
        import sysconfig

        dirs = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
        dirs |= {p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p)}
        return sorted(dirs | {str(REPO_ROOT / "harness"), str(Path(torch.__file__).parent)})

    def request(self, msg, timeout: float, phase: str, reply_type=None, marks: list | None = None):
        """Send one request (a messages.Request) and wait for its reply: a failure reply raises Failure with
        the child's rule; otherwise the reply is read as `reply_type` (the raw mapping when None).
        A timed request passes `marks`: the parent's clock at each mark the child sends before its reply
        (as its timed calls begin and end) is appended there; a mark on any other request is a bad reply."""
        try:
            self.send(msg.wire() if isinstance(msg, messages.Request) else msg)
        except (BrokenPipeError, OSError):
            raise self._death(phase) from None
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply = self.recv(timeout=0.5)
                if reply.get("status") == "mark" and marks is not None and len(marks) < MAX_MARKS:
                    marks.append(time.perf_counter())
                    continue
                break
            except TimeoutError:
                if self.process.poll() is not None:
                    # A child that exits cleanly after its first failure may have replied between the wait and
                    # its exit: that reply is the verdict. One killed by a signal crashed, whatever it said.
                    reply = self._last_words() if self.process.returncode == 0 else None
                    if reply is not None:
                        break
                    raise self._death(phase) from None
                if time.monotonic() > deadline:
                    self.kill()
                    raise Failure("timeout", f"no answer after {timeout:.0f} s while {phase} (hung kernel or endless loop); process killed") from None
            except ChannelError as error:
                if self.process.poll() is not None or "closed" in str(error):
                    raise self._death(phase) from None
                self.kill()
                raise Failure("bad-reply", f"while {phase}: {error}") from None
        if reply.get("status") == "fail":
            rule, reason = reply.get("rule"), reply.get("reason")
            if not isinstance(rule, str) or not isinstance(reason, str):
                raise Failure("bad-reply", f"while {phase}: a failure reply without a rule and reason")
            if self.spec["kind"] == "solution" and rule not in CHILD_MAY_REPORT:
                raise Failure("bad-reply", f"while {phase}: the child reported rule {rule[:40]!r}, which no solution can earn")
            raise Failure(rule, reason[:600])
        if reply.get("status") != "ok":
            raise Failure("bad-reply", f"while {phase}: a reply with status {str(reply.get('status'))[:40]!r}")
        if self.spec["kind"] == "solution":  # after every request, not only the import: nothing may outlive a call
            strays = self.strays()
            if strays:
                raise Failure("background-process", f"{len(strays)} process(es) still running after {phase} (pid {strays[0]}): "
                                                    "nothing the solution starts may outlive the call that started it")
            report = self._guard_report()  # the child lives: a copy of it (a raw fork) met the guard
            if report:
                raise self._guard_failure(report, f"in a process the solution started, while {phase}")
        return messages.read(reply_type, reply, phase) if reply_type is not None else reply

    def _last_words(self) -> dict | None:
        """A reply already in the pipe from a child that has since exited, or None."""
        try:
            return self.recv(timeout=0)
        except (TimeoutError, ChannelError):
            return None

    def _death(self, phase: str) -> Failure:
        try:
            code = self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.process.returncode
        if code == GUARD_EXIT:
            return self._guard_failure(self._guard_report(), f"while {phase}")
        if code is not None and code < 0:
            return Failure("crash", f"process killed by {_signal_name(code)} while {phase}")
        return Failure("crash", f"process exited (status {code}) while {phase}")

    @staticmethod
    def _guard_failure(report: str, where: str) -> Failure:
        """The rule and reason of the guard's "rule<TAB>reason" line; a line that says neither is still the guard's."""
        rule, _, reason = report.partition("\t")
        if rule in GUARD and reason:
            return Failure(rule, f"{reason.strip()[:500]} ({where})")
        return Failure("introspection", f"killed by the runtime guard {where}")

    def _guard_report(self) -> str:
        os.set_blocking(self.guard_r, False)
        try:
            return os.read(self.guard_r, 4096).decode(errors="replace").splitlines()[0]
        except (OSError, IndexError):
            return ""

    def strays(self) -> list:
        """Processes the child left behind: its descendants, and orphans re-parented to this process since
        it started (children this process had before are not the child's)."""
        return sandbox.descendants(self.process.pid) + [p for p in sandbox.children()
                                                        if p != self.process.pid and p not in Worker.live and p not in Worker.owned
                                                        and p not in self.children_before]

    def kill(self):
        sandbox.kill_group(self.process.pid)
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def close(self):
        try:
            if self.process.poll() is None:
                self.send({"cmd": "quit"})
                self.process.wait(20)
        except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
            pass
        self.kill()
        sandbox.reap_strays(keep=(Worker.live | Worker.owned) - {self.process.pid})
        for fd in (*self.fds, self.guard_r):
            try:
                os.close(fd)
            except OSError:
                pass
        Worker.live.discard(self.process.pid)
        self._pass_on_output()
        self._remove_folders()

    def _remove_folders(self):
        remove_tree(self.scratch)
        if self.shared:
            remove_tree(self.shared)

    def _pass_on_output(self):
        """The child's output, its last OUTPUT_TAIL bytes, on this process's stderr: printable characters only
        (no terminal escapes), each line behind "| ", between two lines that name the target (the solution
        writes what it likes, a verdict line or the closing line included: the prefix tells them apart)."""
        try:
            size = self.output.seek(0, os.SEEK_END)
            self.output.seek(max(0, size - OUTPUT_TAIL))
            text = self.output.read().decode("utf-8", "replace")
            self.output.close()
        except (OSError, ValueError):
            return
        text = "".join(c for c in text if c.isprintable() or c in "\n\t").strip()
        if text:
            name = Path(str(self.spec.get("path") or self.spec.get("name") or "the child")).name
            cut = f" (its last {OUTPUT_TAIL >> 10} KiB of {size >> 10} KiB)" if size > OUTPUT_TAIL else ""
            text = "\n".join("| " + line for line in text.splitlines())
            sys.stderr.write(f"--- output of {name}{cut} ---\n{text}\n--- end of the output of {name} ---\n")

    live: set = set()  # pids of the children running a target now
    owned: set = set()  # pids of this parent's own other processes (eval-batch's GPU workers): never strays


def spawn(spec: dict, config: Config, env: dict | None = None, nice: int = 0) -> Worker:
    worker = Worker(spec, config, env, nice)
    Worker.live.add(worker.process.pid)
    return worker


def marked_wall(marks: list, phase: str) -> float:
    """Seconds on the parent's clock between a timed request's two marks."""
    if len(marks) != MAX_MARKS:
        raise Failure("bad-reply", f"while {phase}: the reply came with {len(marks)} mark(s), not {MAX_MARKS}")
    return marks[1] - marks[0]


class SharedPool:
    """The parent's buffers for one shape: input sets and output slots, allocated once and refilled in
    place for every batch (the child maps each once), on the device or in shared files on the CPU."""

    def __init__(self, device: torch.device, directory: Path | None):
        self.device, self.directory = device, directory

    def tensor(self, shape, dtype) -> torch.Tensor:
        if self.device.type == "cuda":
            return torch.empty(tuple(shape), dtype=dtype, device=self.device)
        return shared_cpu_tensor(self.directory, secrets.token_hex(16), shape, dtype)

    def share(self, inputs: list) -> list:
        """Buffers holding `inputs`. Described (describe()) only when sent: torch frees the memory behind a
        CUDA description only once the child has opened and released it, so one never sent pins it."""
        buffers = []
        for x in inputs:
            if isinstance(x, torch.Tensor):
                buffer = self.tensor(x.shape, x.dtype)
                buffer.copy_(x)
                buffers.append(buffer)
            else:
                buffers.append(x)
        return buffers

    @staticmethod
    def refill(buffers: list, inputs: list):
        for buffer, x in zip(buffers, inputs):
            if isinstance(x, torch.Tensor):
                buffer.copy_(x)


def describe(items: list) -> list:
    return [{"tensor": describe_shared(x)} if isinstance(x, torch.Tensor) else {"value": x} for x in items]


def poison(slot: torch.Tensor) -> torch.Tensor:
    slot.reshape(-1).view(torch.uint8).fill_(0xFF) if slot.numel() else None
    return slot


class Run:
    """One `eval` invocation: its seed, device, ceilings and where records go."""

    def __init__(self, device: torch.device, results_path: Path, config: Config, seed: int | None = None, reporter=None):
        self.device = device
        self.config = config
        self.results_path = results_path
        self.seed = new_master_seed() if seed is None else seed
        self.target_seed = self.seed  # evaluate_target derives one per target
        self.run_id = uuid.uuid4().hex[:12]
        self.env = environment(device)
        self.report = reporter or (lambda *a, **k: None)
        self.prebuilt = {}  # path -> (ok, build seconds or reason), filled by prebuild()
        self.output_metas = {}  # (problem, shape) -> the reference output's (shape, dtype): _output_meta
        self.sampler = random.Random(os.urandom(16))  # which timed calls are verified: the parent's secret
        self.subreaper = sandbox.become_subreaper()
        self.ahead: tuple | None = None  # (spec, Worker, ready): the next target's child, started early
        torch.backends.cudnn.allow_tf32 = False  # the self-check's eager at fp32, as the baselines run it
        if device.type == "cuda":
            self.report("measuring the device's copy and read bandwidth and matrix rate")
            self.copy_bw, self.read_bw = copy_bandwidth(device), read_bandwidth(device)
            self.matmul_rate = matmul_rate(device)
        else:
            self.copy_bw = self.read_bw = self.matmul_rate = 0.0
        self.env.update(copy_bw_GBps=self.copy_bw / 1e9, read_bw_GBps=self.read_bw / 1e9, bf16_matmul_TFLOPs=self.matmul_rate / 1e12)

    # ------------------------------------------------------------------------------------------
    def check_tolerances(self, problem: Problem) -> None:
        """The problem's self-check on this device: ProblemError unless its tolerances separate right from wrong."""
        lines = self_check(problem, self.device)
        wrong = [f"{l.shape}/{l.case}: expected {l.expected}, got {l.got}" for l in lines if not l.ok]
        if wrong:
            raise ProblemError(f"{problem.name}: the self-check failed, its tolerances do not separate right from wrong: {'; '.join(wrong[:4])}")
        self.report(f"self-check: {len(lines)} cases behave as expected (reference passes; zeros, constants, other inputs fail)")

    def evaluate_problem(self, problem: Problem, targets: list) -> list:
        self.check_tolerances(problem)
        baselines, records = {}, []
        try:
            for index, target in enumerate(targets):
                then = (problem, targets[index + 1]) if index + 1 < len(targets) else None
                record = self.evaluate_target(problem, target, baselines, then)
                add_baseline(baselines, record)
                append_record(record, self.results_path)
                records.append(record)
                self.report(record=record)
        finally:
            self.drop_ahead()
        return records

    def _base_record(self, problem: Problem, target: Target) -> Record:
        names = {s.name for s in problem.shapes}
        record = Record(run_id=self.run_id, problem=problem.name, kind=target.kind, name=target.name,
                        path=str(target.path) if target.path else None, device=self.env.get("gpu"), env=self.env,
                        partial=bool(self.config.shapes) and not names <= set(self.config.shapes) or self.config.trials < 5)
        if target.path:
            record.sha256 = file_sha256(target.path)
            record.code_sha256 = code_hash(target.path)
            record.warnings = scan_source(target.path, problem.reference_ops)
        if self.device.type != "cuda" and not self.config.shapes:
            checked = {s.name for s in correctness_shapes(problem, (), self.device)}
            unchecked = [s.name for s in problem.shapes_for("correctness") if s.name not in checked]
            if unchecked:  # a CPU run is a check of the pipeline: say what it did not look at
                record.partial = True
                record.warnings.append(f"not checked without a GPU (over 64 MB): {', '.join(unchecked)}")
        return record

    def _spec(self, problem: Problem, target: Target) -> dict:
        spec = {"kind": target.kind, "path": str(Path(target.path).resolve()) if target.path else None,
                "problem_dir": str(problem.directory.resolve()), "device": str(self.device), "requires": list(target.requires),
                "function": target.function}
        if target.path:
            spec["extension_dir"] = str(build.extension_dir(Path(target.path), problem.name))
            sources = [Path(target.path), *private_files(Path(target.path))]
            spec["own_kernels"] = sorted(set().union(*(declared_kernels(p.read_text(errors="replace")) for p in sources)))
        return spec

    def evaluate_target(self, problem: Problem, target: Target, baselines: dict, then: tuple | None = None) -> dict:
        """The target's record (as written to runs.jsonl): every stage fills its part of one Record. `then`, the
        (problem, target) evaluated next, has its child started as this one's starts (start_ahead)."""
        try:
            record = self._base_record(problem, target)
        except Exception as error:  # noqa: BLE001 - a file the checker cannot read is this target's failure alone
            record = Record(run_id=self.run_id, problem=problem.name, kind=target.kind, name=target.name,
                            path=str(target.path) if target.path else None, device=self.env.get("gpu"), env=self.env)
            record.status, record.rule = "failed", "harness-error"
            record.reason = f"the checker could not read the target ({type(error).__name__}: {str(error)[:200]}); not the solution's verdict"
            return record.to_json()
        if target.kind == "compile" and self.device.type != "cuda":
            record.status, record.reason = "skipped", "torch.compile baseline is timed on GPU runs only"
            return record.to_json()
        if target.kind == "solution" and self.device.type != "cuda" and needs_cuda(target.path):
            record.status, record.reason = "skipped", "builds CUDA kernels: needs a CUDA GPU, and this machine has none (not timed)"
            return record.to_json()
        self.report(f"{target.label}: starting")
        # Inputs of this target's own: two candidates of a batch (one Run) never see the same sets, so one cannot
        # hand the other answers (twins share their by-content build folder, which the child may write).
        self.target_seed = derive_seed(self.seed, "target", target.kind, target.label, str(target.path or ""))
        worker = ahead = None
        try:
            ahead = self._take_ahead(problem, target)  # after the returns above: start_ahead never starts a child for those
            if target.kind == "solution":
                violations = scan_violations(target.path)
                if violations:
                    raise Failure(*violations[0])
            worker = ahead or spawn(self._spec(problem, target), self.config)
            ahead = None
            if then is not None:
                self.start_ahead(*then)
            self._load(worker, record, target)
            if target.kind == "solution":
                self._check_correctness(problem, worker, record, target)
            self._await_ahead()  # the next child's start (imports, CUDA's context) is over before this target is timed
            self._time(problem, worker, record, target, baselines)
            if record.timings and all("error" in t for t in record.timings):
                raise Failure(record.timings[0]["rule"], record.timings[0]["error"])
        except Failure as failure:
            status = "skipped" if failure.rule == "unavailable" else "failed"
            record.status, record.rule, record.reason = status, failure.rule if status == "failed" else "", failure.reason
        except Exception as error:  # noqa: BLE001 - a fault of the checker itself must not end the run
            first = (str(error).strip().splitlines() or [""])[0][:300]
            record.status, record.rule = "failed", "harness-error"
            record.reason = f"the checker failed ({type(error).__name__}: {first}); not the solution's verdict"
        finally:
            for child in (worker, ahead):  # ahead: started for this target, which ended before needing it
                if child is not None:
                    child.close()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        return record.to_json()

    # ---- the next target's child, started early ------------------------------------------------
    def start_ahead(self, problem: Problem, target: Target) -> None:
        """Start the child of the target evaluated next. It confines itself, imports torch and makes its CUDA
        context now, and runs no solution code until that target's turn sends it Load. Only where Landlock
        scopes signals and ptrace (ABI 6 or later): two children then live at once, and the running solution
        must not be able to reach the next one. A child that will not be used (a scan violation, a target
        CUDA cannot run here) is never started; a failure to start is that target's, found on its turn."""
        self.drop_ahead()
        if not self.config.sandbox or sandbox.landlock_abi() < 6:
            return
        if target.kind == "compile" and self.device.type != "cuda":
            return
        try:
            if target.path is not None and (scan_violations(target.path) or (self.device.type != "cuda" and needs_cuda(target.path))):
                return
            spec = self._spec(problem, target)
            self.ahead = (spec, spawn(spec, self.config), False)
        except Exception:  # noqa: BLE001 - nothing of the next target may reach this one's record: on its turn it
            self.ahead = None  # spawns its own child, and meets the error there

    def _await_ahead(self) -> None:
        """Wait until the child started ahead has finished starting (it answers Ready). One that fails to
        start is dropped: its target spawns afresh on its turn and meets the failure there."""
        if self.ahead is None or self.ahead[2]:
            return
        spec, worker, _ = self.ahead
        try:
            worker.request(messages.Ready(), self.config.call_timeout_s, "starting", messages.ReadyReply)
            self.ahead = (spec, worker, True)
        except Failure:
            self.drop_ahead()

    def _take_ahead(self, problem: Problem, target: Target):
        """The child started ahead for exactly this target (the same spec), once it has answered Ready; else None
        (any other is closed). It started while another solution ran, which may have starved it (all of the GPU's
        memory taken as it made its CUDA context): one that did not come up is never this target's failure, and
        the target spawns a fresh child."""
        if self.ahead is None:
            return None
        try:
            same = self.ahead[0] == self._spec(problem, target)
        except BaseException:
            self.drop_ahead()
            raise
        if not same:
            self.drop_ahead()
            return None
        self._await_ahead()
        worker, self.ahead = (self.ahead[1] if self.ahead else None), None
        return worker

    def drop_ahead(self) -> None:
        """Close the child started ahead, if any (the run ends, or another target comes next)."""
        if self.ahead is not None:
            worker, self.ahead = self.ahead[1], None
            worker.close()

    def _load(self, worker: Worker, record: Record, target: Target):
        loaded = worker.request(messages.Load(), self.config.build_timeout_s, "building and loading", messages.LoadReply)
        record.sandbox = loaded.sandbox[:200]
        built = self.prebuilt.get(str(target.path))
        record.load_s = round(loaded.load_s, 3)
        record.build_s = round(built[1], 3) if built and built[0] else record.load_s
        record.rebuilt = loaded.rebuilt or bool(built and built[0] and built[1] > 5)
        if loaded.cpus:
            record.worker_cpus = loaded.cpus
        if loaded.versions:
            record.versions = {str(k): str(v) for k, v in loaded.versions.items()}
            record.requirement_versions = {str(k): str(v) for k, v in loaded.requirement_versions.items()}

    # ---- inputs and slots, all the parent's ---------------------------------------------------
    def _draw(self, problem: Problem, shape, seed: int, probe_from=None) -> list:
        return problem.make_inputs(shape, seed, self.device, probe_from)

    def _output_meta(self, problem: Problem, shape) -> tuple:
        """(shape, dtype) of the reference's output at the problem's dtype, which a solution must match. The
        reference runs once per shape in a run: the trials, the profile and every timing process share it."""
        key = (problem.name, shape.name)
        if key not in self.output_metas:
            out = native_reference(problem, shape, self._draw(problem, shape, derive_seed(self.target_seed, problem.name, shape.name, "meta")), self.device)
            self.output_metas[key] = (tuple(out.shape), out.dtype)
        return self.output_metas[key]

    def _verify(self, problem: Problem, shape, seed: int, slot: torch.Tensor, inputs: list, label: str, timed: str = "",
                probe_from=None, drawn: list | None = None) -> dict:
        """The parent's verdict on one call: its inputs as the child left them against a fresh draw (or `drawn`,
        the parent's own copy of what it shared, which the child never saw), its copied output against the
        float64 reference. `timed` names the kind of timed call ("" for a trial); a wrong timed output is
        `timed-output-wrong`, for a solution and a baseline alike."""
        drawn = drawn if drawn is not None else self._draw(problem, shape, seed, probe_from)
        changed = inputs_unchanged(drawn, inputs)
        if changed:
            raise Failure("input-mutated", f"{label}{', ' + timed if timed else ''}: {changed}")
        expected = reference_output(problem, shape, drawn, self.device)
        verdict = check_output(slot, expected, slot.dtype, problem.tolerance_for(shape.dtype))
        del expected, drawn
        if not verdict.ok:
            if timed:
                raise Failure("timed-output-wrong", f"{label}: the output of {timed} is wrong: {verdict.reason}")
            raise Failure(verdict.rule, f"{label}: {verdict.reason}")
        return verdict.summary()

    def _scratch(self, worker: Worker) -> Path | None:
        """Where CPU buffers shared with the child live (shared memory the child may map); None on a GPU, whose
        buffers travel by CUDA IPC."""
        if worker.shared is None:
            return None
        directory = Path(tempfile.mkdtemp(prefix="shape-", dir=worker.shared))
        directory.chmod(0o300)  # the child opens the files it is told of (random names) but cannot list the rest
        return directory

    @staticmethod
    def _remove(directory: Path | None):
        if directory is not None:
            remove_tree(directory)

    # ---- correctness -------------------------------------------------------------------------
    def _check_correctness(self, problem: Problem, worker: Worker, record: Record, target: Target):
        trials = self.config.trials
        directory = self._scratch(worker)
        shapes = correctness_shapes(problem, self.config.shapes, self.device)
        if not shapes:
            raise Failure("harness-error", "no correctness shape was selected: a verdict needs at least one")
        try:
            for shape in shapes:
                self.report(f"{target.label}: checking {shape.name}")
                out_shape, out_dtype = self._output_meta(problem, shape)
                # Trial t draws input family t % n: every shape meets every family, the seeds stay secret.
                seeds = [problem.seed_for_trial(derive_seed(self.target_seed, problem.name, shape.name, "check", t), t) for t in range(trials)]
                plan = [(seed, None, f"trial {t + 1} ({problem.family_of(seed)} inputs)") for t, seed in enumerate(seeds)]
                probe = problem.seed_for_trial(derive_seed(self.target_seed, problem.name, shape.name, "probe"), trials)
                plan.append((probe, seeds[-1], "cache-probe trial"))
                worst = {"max_abs": 0.0, "max_rel": 0.0, "rel_l2": 0.0}
                for seed, probe_from, label in plan:
                    pool = SharedPool(self.device, directory)
                    drawn = self._draw(problem, shape, seed, probe_from)  # kept: the pristine inputs, never shared
                    inputs = pool.share(drawn)
                    described = describe(inputs)
                    slot = poison(pool.tensor(out_shape, out_dtype))
                    self._sync()
                    reply = worker.request(messages.Call(shape.name, described, describe_shared(slot)), self.config.call_timeout_s,
                                           f"running {shape.name} {label}", messages.CallReply)
                    self._judge_ops(problem, record, reply.ops)
                    where = " (inputs share their first and last elements with the previous trial: a cached result?)" if probe_from else ""
                    summary = self._verify(problem, shape, seed, slot, inputs, f"{shape.name} ({shape.dtype}), {label}{where}", "",
                                           probe_from, drawn)
                    for key, value in summary.items():
                        worst[key] = max(worst[key], value)
                    del inputs, slot, pool, drawn
                record.checks.append({"shape": shape.name, "dtype": shape.dtype, "trials": len(plan), "passed": True, **worst})
        finally:
            self._remove(directory)

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ---- timing --------------------------------------------------------------------------------
    def _time(self, problem: Problem, worker: Worker, record: Record, target: Target, baselines: dict):
        for shape in timing_shapes(problem, self.config.shapes, self.device):
            self.report(f"{target.label}: timing {shape.name}")
            nbytes, flops = problem.bytes_moved(shape), problem.flops(shape)
            try:
                if target.kind == "solution" and self.device.type == "cuda" and self.config.profile:
                    self._profile(problem, worker, record, shape)
                stats, batch, parent = self._time_in(problem, worker, shape, target, 1)
                runs = [(stats, batch, parent)]
                if self.config.host_bound_processes > 1 and is_host_bound(stats.median_ms, batch):
                    self.report(f"{target.label}: timing {shape.name} again in {self.config.host_bound_processes - 1} more processes (host-bound)")
                    runs += self._time_again(problem, worker, shape, target)
            except ShapeFailure as failure:
                record.timings.append({"shape": shape.name, "dtype": shape.dtype, "rule": failure.rule, "error": failure.reason})
                continue
            entry = self._timing_entry(problem, shape, runs, nbytes, flops, baselines)
            record.timings.append(entry)
            if target.kind == "solution":
                for process, (stats_p, batch_p, parent_p) in enumerate(runs, 1):
                    self._physics(problem, shape, self._label(shape, process), entry, stats_p.median_ms, batch_p, parent_p)

    def _label(self, shape, process: int) -> str:
        return shape.name if process == 1 else f"{shape.name} in process {process} of {self.config.host_bound_processes}"

    def _time_in(self, problem: Problem, worker: Worker, shape, target: Target, process: int) -> tuple:
        """Times `shape` in `worker`: batches of fresh parent-drawn sets until the standard error is under
        1% (or the budget is spent), then the escape check and, for a host-bound figure, the device time.
        The outputs of a secret sample of calls and of the whole last batch are verified here.
        Returns (stats, batch check, the parent's clock figures)."""
        label = self._label(shape, process)
        try:
            return self._time_calls(problem, worker, shape, target, process, label)
        except Failure as failure:
            if target.kind == "solution" or failure.rule in WORKER_LOST:
                raise
            raise ShapeFailure(failure.rule, failure.reason) from None
        finally:
            if self.device.type == "cuda":
                torch.cuda.ipc_collect()  # shares the child has released, out of torch's limbo
                torch.cuda.empty_cache()

    def _time_calls(self, problem: Problem, worker: Worker, shape, target: Target, process: int, label: str) -> tuple:
        config, is_cuda = self.config, self.device.type == "cuda"
        out_shape, out_dtype = self._output_meta(problem, shape)
        count = sets_per_batch(problem.bytes_moved(shape), config.memory_budget_bytes)
        directory = self._scratch(worker)
        pool = SharedPool(self.device, directory)
        timeout = config.call_timeout_s + 10 * config.budget_s

        def seed_of(batch: int, i: int) -> int:
            """Never seen before in this run (fresh for every call, every process, every re-timing); calls rotate
            through the input families."""
            return problem.seed_for_trial(derive_seed(self.target_seed, problem.name, shape.name, "time", process, batch, i), batch + i)

        try:
            first = [self._draw(problem, shape, seed_of(0, i)) for i in range(count)]
            buffers = [pool.share(inputs) for inputs in first]
            slots = [poison(pool.tensor(out_shape, out_dtype)) for _ in range(count)]
            del first

            def sets_described(n: int = count) -> list:
                """Described afresh for every request: each description is one share that the child releases."""
                return [describe(b) for b in buffers[:n]]
            probe = worker.request(messages.Probe(), timeout, f"probing the host for {label}", messages.ProbeReply).probe_us

            def batch_request(batch: int, extra: dict) -> tuple:
                if batch:
                    for i, buffer in enumerate(buffers):
                        SharedPool.refill(buffer, self._draw(problem, shape, seed_of(batch, i)))
                for slot in slots:
                    poison(slot)
                message = messages.Time(shape.name, sets_described(), [describe_shared(s) for s in slots], **extra)
                self._sync()
                marks = []  # the parent's clock as the child's timed calls begin and once the device is done
                t0 = time.perf_counter()
                reply = worker.request(message, timeout, f"timing {label}", messages.TimeReply, marks)
                whole = time.perf_counter() - t0  # the whole request, for the record: the marks come from the child
                if len(reply.times_ms) != count or any(t < 0 for t in reply.times_ms):
                    raise Failure("bad-reply", f"while timing {label}: the reply's times are not {count} non-negative numbers")
                return [float(t) for t in reply.times_ms], marked_wall(marks, f"timing {label}"), whole

            samples, walls, wholes, start, batch = [], [], [], time.perf_counter(), 0
            batch_means, stats = [], None
            while True:
                times, wall, whole = batch_request(batch, {"warmup_s": 0.1} if batch == 0 else {})
                samples += times
                batch_means.append(statistics.fmean(times))
                if batch:
                    walls.append(wall)
                    wholes.append(whole)
                else:  # the budget is for timed batches: not the warm-up, nor the compile a first call may do
                    start = time.perf_counter()
                stats = TimingStats.from_samples(samples, "cuda-events" if is_cuda else "wall-clock")
                if not is_cuda:  # a CPU call's figure is its batch's mean: the spread that counts is between batches
                    stats.se_pct = TimingStats.from_samples(batch_means, "wall-clock").se_pct if len(batch_means) > 2 else 100.0
                enough = len(samples) >= config.min_reps and (stats.se_pct < 1.0 or len(samples) >= 2000)
                stats.budget_hit = not enough and time.perf_counter() - start > config.budget_s and len(samples) >= config.min_reps
                last = enough or stats.budget_hit
                # The whole last batch, and a secret share of every other, verified before the next batch refills
                # their sets: a solution that can tell which batch is the last (it can steer when timing stops)
                # gains nothing.
                for i, slot in enumerate(slots):
                    if last or self.sampler.random() < VERIFIED_SHARE:
                        self._verify(problem, shape, seed_of(batch, i), slot, buffers[i], label, "a timed call")
                if last:
                    break
                batch += 1
            parent = {}
            batch_check = None
            if walls:  # the parent's clock over the timed batches and a trivial call's: it bounds the child's figure
                null = [batch_request(batch + 1 + k, {"null": True}) for k in range(NULL_BATCHES)]
                per_call = lambda seconds: statistics.median(seconds) * 1e3 / count  # noqa: E731
                parent = {"wall_ms_per_call": per_call(walls), "null_ms_per_call": per_call([n[1] for n in null]),
                          "request_ms_per_call": per_call(wholes), "null_request_ms_per_call": per_call([n[2] for n in null]),
                          "batches": len(walls), "calls": count}
            if is_cuda:
                batch_check = self._escape_check(worker, shape, sets_described, stats.median_ms, label, timeout,
                                                 lambda: batch_request(batch + 1 + NULL_BATCHES, {})[0])
                retimed = batch_check.get("retimed_median_ms")
                if retimed is not None and retimed > stats.median_ms:  # the check passed against this figure: it is reported
                    stats = dataclasses.replace(stats, median_ms=retimed)
                if is_host_bound(stats.median_ms, batch_check):
                    device_ms = self._device_time(problem, shape, worker, sets_described, slots, buffers, seed_of, batch + 10,
                                                  batch_check["launch_ms_per_call"], label, timeout)
                    stats_device = device_ms
                else:
                    stats_device = None
                parent["device_ms"] = stats_device
            parent["host_probe_us"] = probe if isinstance(probe, (int, float)) else None
            return stats, batch_check, parent
        finally:
            del pool
            self._remove(directory)

    def _escape_check(self, worker: Worker, shape, sets_described, median_ms: float, label: str, timeout: float, retime) -> dict:
        """Back-to-back calls ending in a device-wide synchronise, timed by the child and, between the
        child's marks, by the parent: work that escaped the events makes the batch slow every time.
        A slow moment is measured again (up to 6 batches, the fastest kept); contention that outlasts the
        batches slows the calls too, so once two batches have failed the median is taken again (fresh
        inputs) and the bound follows the higher of the two, which is then the figure reported: a solution
        that slows the re-time on purpose is charged what it spent."""
        calls = burst_calls(median_ms)
        best, retimed, done = None, None, 0
        while done < 6:
            self._sync()
            marks = []
            reply = worker.request(messages.Burst(shape.name, sets_described(), calls), timeout, f"the escape check of {label}",
                                   messages.BurstReply, marks)
            wall_ms = marked_wall(marks, f"the escape check of {label}") * 1e3
            done += 1
            batch = {"calls": calls, "launch_ms_per_call": float(reply.launch_ms_per_call),
                     "wall_ms_per_call": max(float(reply.wall_ms_per_call), 0.0), "parent_wall_ms": wall_ms}
            if reply.events_ms_per_call is not None:
                batch["events_ms_per_call"] = float(reply.events_ms_per_call)
            if best is None or batch["parent_wall_ms"] < best["parent_wall_ms"]:
                best = batch
            if done < 2:
                continue
            reference = max(median_ms, retimed or 0.0)
            if best["parent_wall_ms"] <= calls * escape_bound(reference, best["launch_ms_per_call"], calls):
                break
            if retimed is None:
                retimed = statistics.median(retime())
        best["batches"] = done
        if retimed is not None:
            best["retimed_median_ms"] = retimed
        return best

    def _device_time(self, problem, shape, worker, sets_described, slots, buffers, seed_of, batch, launch_ms, label, timeout):
        """A host-bound call's time with the host far ahead (the device waits while the host queues the
        batch): the part of its figure that does not follow the host. Its outputs are verified too."""
        calls = min(16, len(slots))
        for i in range(calls):
            SharedPool.refill(buffers[i], self._draw(problem, shape, seed_of(batch, i)))
            poison(slots[i])
        self._sync()
        reply = worker.request(messages.Queued(shape.name, sets_described(calls), [describe_shared(s) for s in slots[:calls]], launch_ms),
                               timeout, f"the device time of {label}", messages.QueuedReply)
        device_ms = reply.device_ms
        if device_ms is None:
            return None
        for i in range(calls):
            self._verify(problem, shape, seed_of(batch, i), slots[i], buffers[i], label, "a queued call")
        return float(device_ms)

    def _judge_ops(self, problem: Problem, record: Record, ops: list):
        """A call that ran the reference's own ops is not a custom kernel, unless the problem allows some (custom:
        partial) beside work of its own. On a GPU the kernel profile sees that work. On the CPU only dispatched
        ops are seen: a forward of the reference's ops alone must dispatch some that are not the reference's and
        not mere data movement. An extension's loops dispatch nothing, and its presence proves nothing (a library
        built or planted beside a forward that calls the reference op alone): it does not count."""
        used = problem.reference_ops_in(ops)
        if used and problem.custom != "partial":
            raise Failure("not-custom-kernel", f"forward calls the reference's own op(s) aten::{', aten::'.join(used)}")
        if not used:
            return
        if self.device.type == "cpu" and not problem.ops_beside_reference(ops):
            raise Failure("not-custom-kernel", f"every op forward dispatched is the reference's (aten::{', aten::'.join(used)}) "
                                               "or moves data: nothing of its own that the CPU can see (a GPU's profile sees an extension's kernels)")
        record.uses_reference_ops = True

    def _profile(self, problem: Problem, worker: Worker, record: Record, shape):
        """Which kernels the call launched at this timing shape: none of its own is not a custom kernel. The
        profiled calls are checked as a trial is (ops and output): a forward that can tell them from the others
        must still do the work in them."""
        out_shape, out_dtype = self._output_meta(problem, shape)
        pool = SharedPool(self.device, None)
        seed = derive_seed(self.target_seed, problem.name, shape.name, "profile")
        inputs = pool.share(self._draw(problem, shape, seed))
        slot = poison(pool.tensor(out_shape, out_dtype))
        self._sync()
        reply = worker.request(messages.Profile(shape.name, describe(inputs), describe_shared(slot)), self.config.call_timeout_s,
                               f"profiling {shape.name}", messages.ProfileReply)
        self._judge_ops(problem, record, reply.ops)
        self._verify(problem, shape, seed, slot, inputs, f"{shape.name} ({shape.dtype}), the profiled call", "the profiled call")
        del inputs, slot, pool
        result = dataclasses.asdict(reply)
        del result["ops"]
        record.profile = record.profile or result
        record.profiles = record.profiles or {}
        record.profiles[shape.name] = {k: result[k] for k in ("kernel_count", "own_kernels", "own_share")}
        if result["kernel_count"] and result["own_kernels"] and result["own_share"] < OWN_SHARE and problem.custom == "partial":
            record.uses_reference_ops = True  # library kernels did most of the work beside its own: allowed, marked
        elif result["kernel_count"] and result["own_kernels"] and result["own_share"] < OWN_SHARE:
            names = ", ".join(str(k.get("name", ""))[:40] for k in result["kernels"][:3] if isinstance(k, dict) and not k.get("own"))
            raise Failure("not-custom-kernel", f"{shape.name}: its own kernels took {100 * result['own_share']:.0f}% of the GPU time, "
                                               f"library kernels the rest ({names}): one trivial kernel does not make a custom one")
        if result["kernel_count"] and result["own_kernels"] == 0:
            names = ", ".join(str(k.get("name", ""))[:40] for k in result["kernels"][:3] if isinstance(k, dict))
            raise Failure("not-custom-kernel", f"{shape.name}: launched {result['kernel_count']} kernel(s), none of its own ({names})")
        if result["kernel_count"] == 0:
            raise Failure("not-custom-kernel", f"{shape.name}: launched no GPU kernel at all during forward")

    def _time_again(self, problem: Problem, worker: Worker, shape, target: Target) -> list:
        """The same shape in fresh workers, one after another (fresh inputs in each): a host-bound figure
        moves more between processes than within one."""
        runs = []
        for process in range(2, self.config.host_bound_processes + 1):
            extra = spawn(worker.spec, self.config)
            try:
                extra.request(messages.Load(), self.config.build_timeout_s, f"loading for {self._label(shape, process)}", messages.LoadReply)
                runs.append(self._time_in(problem, extra, shape, target, process))
            except Failure as failure:
                if target.kind == "solution":
                    raise
                raise ShapeFailure(failure.rule, failure.reason) from None
            finally:
                extra.close()
        return runs

    def _timing_entry(self, problem: Problem, shape, runs: list, nbytes, flops, baselines) -> dict:
        """The shape's entry. With several processes the median is the median of theirs (rates and
        speedups follow it) and the other statistics stay the first process's."""
        stats, batch, parent = runs[0]
        medians = [r[0].median_ms for r in runs]
        median = statistics.median(medians)
        seconds = median / 1e3
        entry = {"shape": shape.name, "dtype": shape.dtype, "median_ms": median,
                 **{k: getattr(stats, k) for k in ("mean_ms", "std_ms", "min_ms", "max_ms", "reps", "se_pct", "timer", "budget_hit")},
                 "bytes": nbytes, "flops": flops, "GBps": nbytes / seconds / 1e9 if seconds > 0 else math.inf,
                 "TFLOPs": flops / seconds / 1e12 if seconds > 0 else math.inf, "batch": batch}
        if parent.get("wall_ms_per_call") is not None:
            entry["parent_clock"] = {k: parent[k] for k in ("wall_ms_per_call", "null_ms_per_call", "request_ms_per_call",
                                                            "null_request_ms_per_call", "batches", "calls")}
        if len(medians) > 1:
            entry.update(median_of="processes", processes=len(medians), process_medians_ms=list(medians))
        if self.copy_bw:
            entry["pct_copy_bw"] = 100.0 * nbytes / seconds / self.copy_bw if seconds > 0 else math.inf
            floor, bound = self.floor_seconds(problem, shape)
            entry["pct_floor"] = 100.0 * floor / seconds if seconds > 0 else math.inf
            entry["floor_bound"] = "bytes" if bound == FLOOR_BYTES else "flops"
        for kind in ("eager", "compile"):
            base = baselines.get(shape.name, {}).get(kind)
            if base and median > 0:
                entry[f"speedup_{kind}"] = base / median
        probes = [r[2].get("host_probe_us") for r in runs]
        if probes and probes[0] is not None:
            entry["host_probe_us"] = probes[0]
            if len(probes) > 1:
                entry["process_host_probe_us"] = list(probes)
        device = [r[2].get("device_ms") for r in runs if r[2].get("device_ms") is not None]
        if device:
            entry["device_ms"] = statistics.median(device)
            if len(runs) > 1:
                entry["process_device_ms"] = [r[2].get("device_ms") for r in runs]
        return entry

    def floor_seconds(self, problem: Problem, shape) -> tuple:
        """(the least time the shape's bytes and flops allow at the measured ceilings, what bounds it).
        Reads stream at up to the read ceiling; what is written costs what it costs in a copy beyond its
        read half, so a copy-like kernel is bounded by the copy figure and a read-only one by the read figure."""
        total = problem.bytes_moved(shape)
        written = problem.bytes_written(shape)
        read = max(total - written, 0.0)
        read_bw = max(self.read_bw, self.copy_bw)
        write_cost = max(2.0 / self.copy_bw - 1.0 / read_bw, 0.0)  # seconds per written byte
        floor_bytes = read / read_bw + written * write_cost
        floor_flops = problem.flops(shape) / self.matmul_rate if self.matmul_rate else 0.0
        if floor_bytes >= floor_flops:
            return floor_bytes, FLOOR_BYTES
        return floor_flops, FLOOR_FLOPS

    def _physics(self, problem, shape, label: str, entry: dict, median_ms: float, batch: dict | None, parent: dict):
        """One process's median against the physical floor (GPU), against the parent's own clock over the timed
        batches, and the escape check's batch against it (GPU). On the CPU the child's clock is all the figure
        has (a solution with raw memory access rewired time.perf_counter in place): the parent's clock bounds it
        there too, CPU_CLOCK_FACTOR looser."""
        cuda = self.device.type == "cuda"
        if cuda:
            floor, which = self.floor_seconds(problem, shape)
            floor /= PHYSICS_MARGIN
            if median_ms / 1e3 < floor:
                raise Failure("impossible-time", f"{label}: median {median_ms * 1e3:.2f} us is below the physical floor of "
                                                 f"{floor * 1e6:.2f} us ({which}, with {PHYSICS_MARGIN}x margin)")
        host = batch["parent_wall_ms"] / batch["calls"] if batch else 0.0  # the parent's clock per call, back to back
        if parent.get("wall_ms_per_call") is not None:
            seen = parent["wall_ms_per_call"] - parent["null_ms_per_call"]
            bound = parent_clock_bound(median_ms, parent.get("calls", 1), host) * (1.0 if cuda else CPU_CLOCK_FACTOR)
            if seen > bound:
                measured = (f"the events {median_ms * 1e3:.1f} us (back to back {host * 1e3:.1f} us)" if cuda
                            else f"the child's {median_ms * 1e3:.1f} us")
                raise Failure("escaped-timing", f"{label}: the parent's clock saw {seen * 1e3:.1f} us per call beyond a trivial call "
                                                f"over {parent['batches']} timed batches, {measured}: the timing was not what the calls took")
        if batch:
            retimed = batch.get("retimed_median_ms")
            reference = max(median_ms, retimed or 0.0)
            calls = batch["calls"]
            tries = f" (fastest of {batch['batches']} batches)" if batch.get("batches", 1) > 1 else ""
            if batch["parent_wall_ms"] > calls * escape_bound(reference, batch["launch_ms_per_call"], calls):
                seen = f"{median_ms * 1e3:.1f} us" + (f" ({retimed * 1e3:.1f} us re-timed)" if retimed else "")
                raise Failure("escaped-timing", f"{label}: {calls} device-synchronised calls took {host * 1e3:.1f} us each{tries} on the "
                                                f"parent's clock but the timing events saw {seen}: work escaped the events (another stream or thread?)")
            events = batch.get("events_ms_per_call")
            if events is not None and batch["wall_ms_per_call"] > escape_bound(events, batch["launch_ms_per_call"], calls):
                raise Failure("escaped-timing", f"{label}: a device-synchronised batch took {batch['wall_ms_per_call'] * 1e3:.1f} us per call but "
                                                f"its own events on the current stream saw {events * 1e3:.1f} us: work ran on another stream")


def prebuild(items: list, device: torch.device, jobs: int = 4, timeout: float = 1800.0, config: Config | None = None,
             on_done=None, env: dict | None = None, nice: int = 0) -> dict:
    """Build (import) several solutions at once, each in its own sandboxed worker, so that the
    evaluation that follows finds every extension cached. Returns {path: (ok, seconds or reason)}.
    Every process a build left is killed as soon as its build ends (Worker.close).

    For builds that overlap with timing (eval-batch): `on_done(path, outcome)` hears of each build as it ends,
    `env` is laid over the workers' environment (the batch hides the GPUs), and `nice` lowers their priority and
    that of the compilers they start. Reaping spares Worker.owned (the batch's GPU workers)."""
    config = config or Config()
    pending = [(problem, path) for problem, path in items if needs_cuda(path) and not scan_violations(path)]
    running, results = [], {}
    sandbox.become_subreaper()
    while pending or running:
        while pending and len(running) < jobs:
            problem, path = pending.pop(0)
            spec = {"kind": "solution", "path": str(Path(path).resolve()), "problem_dir": str(problem.directory.resolve()),
                    "device": str(device), "requires": [], "function": "", "extension_dir": str(build.extension_dir(Path(path), problem.name))}
            worker = spawn(spec, config, env, nice)
            worker.send(messages.Load().wire())
            running.append((path, worker, time.monotonic()))
        for item in list(running):
            path, worker, started = item
            finished = worker.process.poll() is not None or time.monotonic() - started > timeout
            try:
                reply = worker.recv(timeout=0.05)
                results[str(path)] = (True, float(reply["load_s"])) if reply.get("status") == "ok" else (False, str(reply.get("reason"))[:300])
            except TimeoutError:
                if not finished:
                    continue
                results[str(path)] = (False, "worker died or hung while building")
            except Exception as error:  # noqa: BLE001 - one build's reply, however malformed, never stops the others
                results[str(path)] = (False, f"worker sent a malformed reply while building ({type(error).__name__})")
            worker.close()  # and what its import started dies with it
            running.remove(item)
            if on_done is not None:
                on_done(str(path), results[str(path)])
        time.sleep(0.05)
    return results
