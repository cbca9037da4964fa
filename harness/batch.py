"""Batch evaluation: many candidate ModelNew files per problem, one record each, and a summary.

The parent (this module's `run_batch`) finds the candidates (every *.py in a folder, or samples/<problem>/<k>.py
for a suite), skips those already recorded when resuming (keyed by path and sha256 of the file), builds the rest
in parallel (runner.prebuild, extension folders keyed by the file's sha256, so a candidate is never built twice),
and hands the work to one worker process per GPU (CUDA_VISIBLE_DEVICES names its GPU; on a machine without one,
`--gpus N` runs N CPU workers). Builds overlap with the evaluation: a candidate is sent to a worker as soon as its
build ends, and the build workers see no GPU and run at a low priority, so that no solution code reaches a GPU
while another target is timed (`--build-first` builds everything first). A worker (`python -m harness.batch`) holds one Run and evaluates what it is sent
exactly as `eval` does: Run.evaluate_target, each target in its own sandboxed child, every check. First, per
problem, the self-check and the baselines (eager, torch.compile), once per batch; then the candidates, one at a
time, each given the problem's baseline medians. The worker appends each record to the batch's own runs.jsonl
as it finishes (never the main leaderboard).

A worker that dies (not a candidate's child: the Run isolates those) is replaced; the candidate it held is
queued again once, and recorded as a `crash` if it takes a second worker down.

The summary (summarize) reads the final records: counts, compile and correctness rates, fast_p against each
baseline, the geometric-mean speedup of the correct candidates and the failures grouped by rule.
"""
from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import math
import os
import select
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from .problem import PROBLEMS_DIR, REPO_ROOT, ProblemError, load_problem
from .leaderboard import geomean
from .records import RESULTS_DIR, Record, append_record, file_sha256, read_records, write_atomic

BATCH_RESULTS = RESULTS_DIR / "batch"  # GPU runs
SCRATCH_BATCH_RESULTS = REPO_ROOT / ".scratch" / "batch"  # CPU runs: nothing timed there is a figure to read
P_VALUES = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
BASELINES = ("eager", "compile")
# Rules that mean the candidate never became a module with a ModelNew: not compiled.
NOT_COMPILED = frozenset({"compile-error", "import-error", "missing-ModelNew"})
# A candidate that takes this many workers down is recorded as a crash.
MAX_ATTEMPTS = 2


# ---- candidates -------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Candidate:
    ref: str  # the problem: a folder holding problem.yaml, or a KernelBench-format file (absolute)
    problem: str  # the problem's name
    path: Path  # absolute
    sha256: str

    @property
    def key(self) -> tuple:
        """(problem, path, sha256): the same file offered to two problems is two candidates."""
        return self.problem, str(self.path), self.sha256

    @property
    def record_path(self) -> str:
        """As records give it: relative to the repository where it lies in it."""
        return record_path(self.path)


def record_path(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def record_key(record: dict) -> tuple | None:
    """The (problem, absolute path, sha256) of a candidate's record, as Candidate.key; None for a baseline's."""
    if record.get("kind") != "solution" or not record.get("path") or not record.get("sha256"):
        return None
    path = Path(record["path"])
    return record.get("problem"), str(path if path.is_absolute() else (REPO_ROOT / path).resolve()), record["sha256"]


def problem_ref(name: str, problems_dir: Path = PROBLEMS_DIR) -> str:
    """A problem named on the command line as the path a worker loads: a KernelBench file, or a problem folder."""
    if name.endswith(".py"):
        if not Path(name).is_file():
            raise ProblemError(f"no KernelBench file {name!r} (a problem given as a .py file must exist)")
        return str(Path(name).resolve())
    folder = problems_dir / name
    if not (folder / "problem.yaml").is_file():
        raise ProblemError(f"no problem named {name!r} in {problems_dir}")
    return str(folder.resolve())


def _files(directory: Path) -> list:
    """The candidate files, each once: links to one file would count it once per link."""
    return sorted({p.resolve() for p in Path(directory).glob("*.py") if p.is_file() and not p.name.startswith("_")})


def candidates_for(ref: str, directory: Path, problem_name: str | None = None) -> list:
    """Every *.py in `directory` (not _private.py) as a candidate for the problem at `ref`."""
    if not Path(directory).is_dir():
        raise ProblemError(f"--dir {directory}: not a folder")
    name = problem_name or load_problem(Path(ref)).name
    return [Candidate(ref, name, p, file_sha256(p)) for p in _files(directory)]


def suite_candidates(suite: Path, directory: Path) -> tuple:
    """(problem refs of the suite, candidates): samples/<problem>/<k>.py for each problem folder of the suite."""
    suite, directory = Path(suite), Path(directory)
    if not suite.is_dir():
        raise ProblemError(f"--suite {suite}: not a folder")
    if not directory.is_dir():
        raise ProblemError(f"--dir {directory}: not a folder")
    refs, found = [], []
    for folder in sorted(p for p in suite.iterdir() if (p / "problem.yaml").is_file()):
        name = load_problem(folder).name
        refs.append(str(folder.resolve()))
        if (directory / folder.name).is_dir():
            found += candidates_for(str(folder.resolve()), directory / folder.name, name)
    if not refs:
        raise ProblemError(f"--suite {suite}: no problem folders (each holds a problem.yaml)")
    if not found:
        raise ProblemError(f"--dir {directory}: no candidates under <problem>/ for any problem of {suite}")
    return refs, found


def default_results(label: str, cuda: bool) -> Path:
    return (BATCH_RESULTS if cuda else SCRATCH_BATCH_RESULTS) / label


def latest_records(records: list) -> dict:
    """{candidate key: its latest record} in the order written."""
    out = {}
    for record in records:
        key = record_key(record)
        if key is not None:
            out[key] = record
    return out


def recorded_baselines(records: list, problem: str) -> dict:
    """{shape: {kind: median_ms}} from the latest ok eager and compile records of `problem` in a results file."""
    from .runner import add_baseline

    latest = {}
    for record in records:
        if record.get("problem") == problem and record.get("kind") in BASELINES and record.get("status") == "ok":
            latest[record["kind"]] = record
    baselines = {}
    for record in latest.values():
        add_baseline(baselines, record)
    return baselines


# ---- the summary -------------------------------------------------------------------------------------------
def speedup(record: dict, kind: str) -> float | None:
    """The candidate's speedup over the baseline `kind`: the geometric mean over its timing shapes."""
    return geomean(t.get(f"speedup_{kind}") for t in record.get("timings", []) if "error" not in t)


def is_correct(record: dict) -> bool:
    """Passed every check (correctness, then the timing stage's checks): status ok."""
    return record.get("status") == "ok"


def is_compiled(record: dict) -> bool:
    """Built and imported into a module with a ModelNew (a skipped candidate was never tried)."""
    return record.get("status") == "ok" or (record.get("status") == "failed" and record.get("rule") not in NOT_COMPILED)


def summarize(records: list, baselines: dict | None = None) -> dict:
    """One problem's (or a suite's pooled) summary of its candidates' final records. fast_p is KernelBench's: the
    share of ALL candidates that are correct and more than p times faster than the baseline. `baselines` says
    which baselines were timed ({"eager": True, "compile": False}); a baseline that was not has no fast_p (None).
    Left out, a baseline counts as timed when any record has a speedup over it."""
    n = len(records)
    if baselines is None:
        baselines = {kind: any(speedup(r, kind) is not None for r in records) for kind in BASELINES}
    status = collections.Counter(r.get("status") for r in records)
    correct = [r for r in records if is_correct(r)]
    compiled = sum(is_compiled(r) for r in records)
    failures = collections.Counter(r.get("rule") or "unknown" for r in records if r.get("status") == "failed")
    skipped = collections.Counter((r.get("reason") or "skipped")[:80] for r in records if r.get("status") == "skipped")
    fast_p, mean = {}, {}
    for kind in BASELINES:
        if not baselines.get(kind):
            fast_p[kind], mean[kind] = None, None
            continue
        speeds = [speedup(r, kind) for r in correct]
        fast_p[kind] = {_p(p): (sum(1 for s in speeds if s is not None and s > p) / n if n else 0.0) for p in P_VALUES}
        mean[kind] = geomean(speeds)
    return {"candidates": n, "ok": status.get("ok", 0), "failed": status.get("failed", 0), "skipped": status.get("skipped", 0),
            "compiled": compiled, "compile_rate": compiled / n if n else 0.0, "correct": len(correct),
            "correct_rate": len(correct) / n if n else 0.0, "partial": sum(bool(r.get("uses_reference_ops")) for r in correct),
            "fast_p": fast_p, "geomean_speedup": mean, "failures": dict(failures.most_common()),
            "skipped_reasons": dict(skipped.most_common())}


def _p(p: float) -> str:
    return f"{p:g}"


def suite_summary(by_problem: dict, baselines: dict) -> dict:
    """{problem: records} -> per-problem summaries and the suite's, whose fast_p is over all candidates of all problems."""
    problems = {name: summarize(records, baselines.get(name)) for name, records in sorted(by_problem.items())}
    pooled = [r for records in by_problem.values() for r in records]
    timed = {kind: any((baselines.get(name) or {}).get(kind) for name in by_problem) for kind in BASELINES}
    return {"problems": problems, "suite": summarize(pooled, timed)}


def _rate(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _x(value) -> str:
    return "-" if value is None else f"{value:.3g}x"


def render_markdown(summary: dict, title: str) -> str:
    lines = [f"# Batch: {title}", ""]
    if summary.get("meta"):
        meta = summary["meta"]
        lines += [f"{meta.get('date', '')} on {meta.get('device', '?')}; {meta.get('workers', '?')} worker(s); "
                  f"records in `{meta.get('results', '')}`"]
        if meta.get("build_s") is not None:
            lines.append((f"{meta['wall_s']} s in all: " if meta.get("wall_s") is not None else "")
                         + f"builds {meta['build_s']} s ({meta.get('builds', 0)} built, "
                         + (f"{meta['cached_builds']} cached, " if meta.get("cached_builds") else "")
                         + f"{meta.get('failed_builds', 0)} failed"
                         + (f", {meta['build_jobs']} at once" if meta.get("build_jobs") else "")
                         + (", overlapping the evaluation" if meta.get("overlap") else "") + "), "
                         f"evaluation {meta.get('evaluate_s')} s for {meta.get('evaluated')} candidate(s)")
            if meta.get("s_per_candidate", {}).get("build"):
                lines.append(f"- build: {meta['s_per_candidate']['build']} s mean per candidate built")
        for phase, figures in (meta.get("phase_s") or {}).items():
            lines.append(f"- {phase}: {figures['mean_s']} s mean, {figures['median_s']} s median per candidate ({figures['candidates']})")
        lines.append("")
    suite = summary["suite"]
    lines += ["fast_p: the share of all candidates that are correct and more than p times faster than the baseline "
              "(a candidate's speedup is the geometric mean over the problem's timing shapes).", "",
              "| | candidates | compiled | correct | " + " | ".join(f"fast_{_p(p)}" for p in P_VALUES) + " | geomean speedup |",
              "|---|---:|---:|---:|" + "---:|" * len(P_VALUES) + "---:|"]
    for kind in BASELINES:
        fast = suite["fast_p"].get(kind)
        cells = [_rate(fast[_p(p)]) for p in P_VALUES] if fast else ["-"] * len(P_VALUES)
        lines.append(f"| vs {kind} | {suite['candidates']} | {_rate(suite['compile_rate'])} | {_rate(suite['correct_rate'])} | "
                     + " | ".join(cells) + f" | {_x(suite['geomean_speedup'].get(kind))} |")
    if len(summary["problems"]) > 1 or summary.get("problem_errors"):
        lines += ["", "## Per problem", "",
                  "| problem | candidates | compiled | correct | fast_1 eager | fast_1 compile | geomean vs eager | geomean vs compile |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name, s in summary["problems"].items():
            fast = {k: (s["fast_p"][k] or {}).get("1") for k in BASELINES}
            lines.append(f"| {name} | {s['candidates']} | {_rate(s['compile_rate'])} | {_rate(s['correct_rate'])} | "
                         f"{_rate(fast['eager'])} | {_rate(fast['compile'])} | {_x(s['geomean_speedup']['eager'])} | "
                         f"{_x(s['geomean_speedup']['compile'])} |")
        for name, error in (summary.get("problem_errors") or {}).items():
            lines.append(f"| {name} | not evaluated: {error[:120]} | | | | | | |")
    if suite.get("partial"):
        lines += ["", f"{suite['partial']} of the correct candidates call some of the reference's ops (`custom: partial`); "
                      "they count in fast_p."]
    lines += ["", "## Failures by rule", ""]
    if suite["failures"] or suite["skipped"]:
        lines += ["| rule | candidates |", "|---|---:|"]
        lines += [f"| `{rule}` | {count} |" for rule, count in suite["failures"].items()]
        lines += [f"| not run: {reason} | {count} |" for reason, count in suite["skipped_reasons"].items()]
    else:
        lines.append("none")
    if summary.get("worker_deaths"):
        lines += ["", f"{summary['worker_deaths']} worker process(es) died and were replaced."]
    if summary.get("unrecorded"):
        lines += ["", f"{summary['unrecorded']} candidate(s) have no record (the batch was cut short)."]
    return "\n".join(lines) + "\n"


def write_summary(results: Path, candidates: list, refs: list, title: str, meta: dict, problem_errors: dict | None = None,
                  worker_deaths: int = 0) -> dict:
    """summary.json and summary.md in `results`, from its runs.jsonl: the latest record of each candidate."""
    records, _ = read_records(results / "runs.jsonl")
    latest = latest_records(records)
    names = {}
    for ref in refs:
        names.setdefault(_name_of(ref, candidates), ref)
    by_problem = {name: [] for name in names}
    unrecorded = 0
    for candidate in candidates:
        record = latest.get(candidate.key)
        if record is None:
            unrecorded += 1
        else:
            by_problem.setdefault(candidate.problem, []).append(record)
    errors = problem_errors or {}
    by_problem = {k: v for k, v in by_problem.items() if k not in errors or v}
    baselines = {name: {kind: any(kind in shape for shape in recorded_baselines(records, name).values()) for kind in BASELINES}
                 for name in by_problem}
    summary = suite_summary(by_problem, baselines)
    summary.update(meta=meta, problem_errors=errors, worker_deaths=worker_deaths, unrecorded=unrecorded)
    write_atomic(results / "summary.json", json.dumps(summary, indent=1, sort_keys=True) + "\n")
    write_atomic(results / "summary.md", render_markdown(summary, title))
    return summary


def _name_of(ref: str, candidates: list) -> str:
    for candidate in candidates:
        if candidate.ref == ref:
            return candidate.problem
    return load_problem(Path(ref)).name


# ---- builds ---------------------------------------------------------------------------------------------
def use_content_keys() -> None:
    """Extension folders keyed by the file's sha256 (harness/build.py), here and in every process started from here."""
    from . import build

    os.environ[build.KEY_VARIABLE] = "content"


def builds_code(candidate: Candidate) -> bool:
    """Whether the build step builds this candidate (CUDA sources, and nothing the scan rejects before a build)."""
    from .scan import needs_cuda, scan_violations

    try:
        return needs_cuda(candidate.path) and not scan_violations(candidate.path)
    except Exception:  # noqa: BLE001 - its own evaluation builds it, and reports what failed there
        return False


def build_candidates(candidates: list, jobs: int, device, timeout: float = 1800.0, report=None, on_done=None,
                     hide_gpus: bool = False) -> dict:
    """Build every candidate that builds CUDA code and has not been built before (its sha256-named extension
    folder holds no library), `jobs` at once, each in a sandboxed worker (runner.prebuild). Two files with the
    same bytes are built once. Returns {str(path): (ok, seconds or reason)} for those built now; a cached one
    maps to (True, 0.0). `on_done(path, outcome)` hears of each candidate as soon as its outcome is known.

    `hide_gpus`: the builds overlap with timing, so no solution code may reach a GPU, and they run at a low
    priority. The build workers see no GPU and compile for the arch of the GPUs the evaluation uses."""
    from . import build
    from .runner import prebuild

    use_content_keys()
    report = report or (lambda *_: None)
    on_done = on_done or (lambda path, outcome: None)
    outcomes, todo, twins, problems = {}, [], {}, {}

    def finish(candidate: Candidate, outcome: tuple):
        for twin in twins.get(candidate.sha256, [candidate]):  # duplicates share their twin's outcome
            outcomes[str(twin.path)] = outcome
            on_done(str(twin.path), outcome)

    for c in candidates:
        if not builds_code(c):
            continue
        if c.sha256 in twins:
            twins[c.sha256].append(c)
            continue
        if build.built_libraries(build.extension_dir(c.path, c.problem)):
            finish(c, (True, 0.0))
            continue
        twins[c.sha256] = [c]
        problems.setdefault(c.ref, load_problem(Path(c.ref)))
        todo.append((problems[c.ref], c.path))
    by_path = {str(c.path): c for c in candidates}
    env, nice = {}, 0
    if hide_gpus:
        import torch

        env, nice, device = {"CUDA_VISIBLE_DEVICES": "", "TORCH_CUDA_ARCH_LIST": build.arch_list()}, 10, torch.device("cpu")
    if todo:
        report(f"building {len(todo)} candidate(s), {jobs} at once ({len(outcomes)} cached)")
        ended = prebuild(todo, device, jobs=jobs, timeout=timeout, env=env, nice=nice,
                         on_done=lambda path, outcome: finish(by_path[path], outcome))
        for path, outcome in ended.items():
            if path not in outcomes:
                finish(by_path[path], outcome)
    return outcomes


# ---- the parent's side of the workers ----------------------------------------------------------------------
@dataclasses.dataclass
class Task:
    id: int
    op: str  # baselines | eval
    ref: str
    candidate: Candidate | None = None
    attempts: int = 0
    marks: dict = dataclasses.field(default_factory=dict)  # when it was sent, and when each phase began (monotonic)

    def phases(self, end: float) -> dict:
        """Seconds spent loading (building, importing), checking and timing, as the worker's phase events say."""
        sent, check, timing = self.marks.get("sent", end), self.marks.get("checking"), self.marks.get("timing")
        out = {"load": (check or timing or end) - sent}
        if check is not None:
            out["check"] = (timing or end) - check
        if timing is not None:
            out["time"] = end - timing
        return out


class Slot:
    """One worker process (one GPU): spawned, sent one task at a time, replaced when it dies."""

    def __init__(self, index: int, argv: list, env: dict, log: Path):
        self.index, self.argv, self.env, self.log = index, argv, env, log
        self.process = None
        self.fd = None
        self.buffer = b""
        self.task: Task | None = None
        self.reserved: Task | None = None  # the candidate it is sent next, named in the current task (its child starts early)
        self.spawns = 0

    def spawn(self):
        read, write = os.pipe()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([*self.argv, "--reply-fd", str(write)], stdin=subprocess.PIPE, stdout=log,
                                            stderr=subprocess.STDOUT, pass_fds=(write,), env=self.env, cwd=str(REPO_ROOT),
                                            start_new_session=True)
        os.close(write)
        self.fd, self.buffer, self.task = read, b"", None
        self.spawns += 1
        from .runner import Worker

        Worker.owned.add(self.process.pid)  # the builds' reaping must spare it

    def send(self, message: dict) -> bool:
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode())
            self.process.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def messages(self) -> list:
        """Whole lines read so far (call when select says the fd is readable); [] at end of file."""
        try:
            data = os.read(self.fd, 1 << 16)
        except OSError:
            data = b""
        if not data:
            return []
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        out = []
        for line in lines:
            try:
                message = json.loads(line)
                if isinstance(message, dict):
                    out.append(message)
            except json.JSONDecodeError:
                pass
        return out

    def dead(self) -> bool:
        return self.process is None or self.process.poll() is not None

    def close(self, timeout: float = 60.0):
        if self.process is None:
            return
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self._close_fd()

    def kill(self):
        from . import sandbox

        if self.process is not None and self.process.poll() is None:
            sandbox.kill_group(self.process.pid)
            self.process.wait(10)
        self._close_fd()

    def _close_fd(self):
        from .runner import Worker

        if self.process is not None:
            Worker.owned.discard(self.process.pid)
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


class Progress:
    """The progress line: built, checked and timed counts, and an ETA from this batch's pace."""

    def __init__(self, total: int, built: int, console, workers: int):
        self.total, self.built, self.console, self.workers = total, built, console, workers
        self.checked = self.timed = self.done = 0
        self.start = time.monotonic()
        self.phase_s = {"load": [], "check": [], "time": []}  # per candidate evaluated

    def phase_summary(self) -> dict:
        """Mean and median seconds per candidate in each phase (of those that reached it)."""
        import statistics

        return {phase: {"candidates": len(v), "mean_s": round(statistics.fmean(v), 2), "median_s": round(statistics.median(v), 2)}
                for phase, v in self.phase_s.items() if v}

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        eta = "?" if not self.done else _duration(elapsed / self.done * (self.total - self.done))
        return (f"[{self.done}/{self.total}] built {self.built}, checked {self.checked}, timed {self.timed}; "
                f"{_duration(elapsed)} elapsed, ETA {eta}")

    def finished(self, label: str, reply: dict):
        self.done += 1
        if reply.get("checked"):
            self.checked += 1
        if reply.get("status") == "ok":
            self.timed += 1
        verdict = "correct" if reply.get("status") == "ok" else \
            f"{reply.get('status')}: {reply.get('rule') or ''} {reply.get('reason', '')[:100]}"
        if self.console is not None:
            from rich.markup import escape

            self.console.print(f"{escape(self.line())}  [bold]{escape(label)}[/bold]: {escape(verdict)}")


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def death_record(candidate: Candidate, code, device: str) -> dict:
    """The record of a candidate whose evaluation took MAX_ATTEMPTS workers down (never isolated in its child)."""
    record = Record(run_id="batch-driver", problem=candidate.problem, kind="solution", name=candidate.path.stem,
                    path=candidate.record_path, device=device,
                    env={"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
                    status="failed", rule="crash", sha256=candidate.sha256,
                    reason=f"the batch worker evaluating it died {MAX_ATTEMPTS} times (last exit status {code}); no verdict from its child")
    return record.to_json()


def run_pool(tasks: list, slots: list, results: Path, progress: Progress, device_name: str, built: dict,
             preset: dict | None = None, max_restarts: int | None = None, building: set | None = None) -> tuple:
    """Run `tasks` (baselines first per problem, then candidates) on `slots`. A candidate task waits until its
    problem's baselines are known, and until its build has ended when its path is in `building` (which the build
    thread empties, filling `built`). Returns ({ref: baselines}, {ref: error}, worker deaths)."""
    from . import sandbox
    from .runner import Worker

    sandbox.become_subreaper()  # what a dead worker leaves behind comes back here and is reaped
    queue = collections.deque(tasks)
    baselines, errors, deaths = dict(preset or {}), {}, 0
    max_restarts = max_restarts if max_restarts is not None else 2 * len(tasks) + 2 * len(slots)
    for slot in slots:
        slot.spawn()
    waiting = {t.ref for t in tasks if t.op == "baselines"}
    building = building if building is not None else set()

    def ready(task: Task) -> bool:
        return task.op == "baselines" or (task.ref not in waiting and str(task.candidate.path) not in building)

    def handle(slot: Slot, message: dict):
        task = slot.task
        if task is None or message.get("task") != task.id:
            return
        if message.get("event") == "phase" and message.get("phase") in ("checking", "timing"):
            task.marks.setdefault(message["phase"], time.monotonic())
        if message.get("event") != "done":
            return
        slot.task = None
        if task.op == "baselines":
            waiting.discard(task.ref)
            if message.get("error"):
                errors[task.ref] = str(message["error"])
                if progress.console is not None:
                    progress.console.print(f"[red]{task.ref}: not evaluated: {message['error']}[/red]")
            else:
                baselines[task.ref] = message.get("baselines") or {}
        else:
            for phase, seconds in task.phases(time.monotonic()).items():
                progress.phase_s[phase].append(seconds)
            progress.finished(task.candidate.record_path, message)

    try:
        while queue or any(s.task or s.reserved for s in slots):
            for slot in slots:
                if slot.task is None and not slot.dead():
                    task, slot.reserved = slot.reserved or next((t for t in queue if ready(t)), None), None
                    if task is None:
                        break
                    if task in queue:
                        queue.remove(task)
                    if task.op == "eval" and task.ref in errors:
                        continue
                    message = {"op": task.op, "task": task.id, "ref": task.ref}
                    if task.op == "eval":
                        message.update(path=task.candidate.record_path, baselines=baselines.get(task.ref, {}),
                                       built=built.get(str(task.candidate.path)))
                        # The candidate this worker takes next, if one is ready: named now, so that its child starts
                        # while this one is evaluated
                        follow = next((t for t in queue if t.op == "eval" and ready(t) and t.ref not in errors), None)
                        if follow is not None:
                            queue.remove(follow)
                            slot.reserved = follow
                            message["then"] = {"ref": follow.ref, "path": follow.candidate.record_path,
                                               "built": built.get(str(follow.candidate.path))}
                    slot.task = task
                    task.attempts += 1
                    task.marks = {"sent": time.monotonic()}
                    slot.send(message)  # a dead worker is found below
            fds = {s.fd: s for s in slots if s.fd is not None}
            readable = select.select(list(fds), [], [], 0.5)[0] if fds else []
            if not fds:
                time.sleep(0.2)
            for fd in readable:
                for message in fds[fd].messages():
                    handle(fds[fd], message)
            for slot in slots:
                if slot.process is None or not slot.dead():
                    continue
                while slot.fd is not None and select.select([slot.fd], [], [], 0)[0]:  # what it said before it died
                    said = slot.messages()
                    if not said:
                        break
                    for message in said:
                        handle(slot, message)
                task, code = slot.task, slot.process.returncode
                slot._close_fd()
                deaths += 1
                sandbox.reap_strays(keep=[*(s.process for s in slots if s.process is not None and not s.dead()), *Worker.live])
                append_record({"event": "worker-died", "worker": slot.index, "exit": code,
                               "task": task.candidate.record_path if task and task.candidate else (task.ref if task else None)},
                              results / "workers.jsonl")
                if progress.console is not None:
                    progress.console.print(f"[yellow]worker {slot.index} died (exit status {code})"
                                           + (f" while on {task.candidate.record_path if task.candidate else task.ref}" if task else "")
                                           + "; replacing it[/yellow]")
                slot.task = None
                if slot.reserved is not None:  # back in line, behind the task it followed
                    queue.appendleft(slot.reserved)
                    slot.reserved = None
                if task is not None:
                    if task.attempts < MAX_ATTEMPTS:
                        queue.appendleft(task)
                    elif task.op == "eval":
                        append_record(death_record(task.candidate, code, device_name), results / "runs.jsonl")
                        progress.finished(task.candidate.record_path, {"status": "failed", "rule": "crash", "reason": "worker died twice"})
                    else:
                        waiting.discard(task.ref)
                        errors[task.ref] = f"the worker timing its baselines died {MAX_ATTEMPTS} times"
                if deaths <= max_restarts:
                    slot.spawn()
                else:
                    slot.process = None
            if all(s.process is None for s in slots):
                break  # every worker is gone for good: what is left has no record
    except BaseException:  # interrupted (Ctrl-C, SIGTERM): the workers and what they run die now, not after their task
        for slot in slots:
            slot.kill()
        sandbox.reap_strays()  # their candidates' processes, handed back to this subreaper
        raise
    finally:
        for slot in slots:
            slot.close()
    return baselines, errors, deaths


# ---- the batch ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Options:
    trials: int = 5
    budget: float = 2.0
    timeout: float = 300.0
    build_timeout: float = 1800.0
    shapes: tuple = ()
    host_bound_processes: int = 5
    jobs: int = 0  # builds at once (0: the CPU count)
    gpus: int | None = None  # workers (None: every visible GPU; 1 on the CPU)
    device: str | None = None
    resume: bool = False
    build_first: bool = False  # every build before any evaluation (default: candidates are evaluated as builds end)

    def config(self) -> dict:
        return {"trials": self.trials, "budget": self.budget, "timeout": self.timeout, "build_timeout": self.build_timeout,
                "shapes": list(self.shapes), "host_bound_processes": self.host_bound_processes}


def visible_gpus() -> list:
    """The GPUs a worker may be given, as CUDA_VISIBLE_DEVICES entries."""
    import torch

    if not torch.cuda.is_available():
        return []
    listed = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return listed or [str(i) for i in range(torch.cuda.device_count())]


def run_batch(refs: list, candidates: list, results: Path, options: Options, title: str, console=None) -> dict:
    """Build, evaluate and summarise `candidates` (of the problems at `refs`); returns the summary."""
    import torch

    cuda = (options.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    gpus = visible_gpus() if cuda else []
    if cuda and not gpus:
        raise ProblemError("--device cuda: no CUDA device is visible here")
    workers = max(1, options.gpus if options.gpus is not None else (len(gpus) or 1))
    if cuda and workers > len(gpus):
        raise ProblemError(f"--gpus {workers}: only {len(gpus)} GPU(s) visible ({', '.join(gpus)})")
    results.mkdir(parents=True, exist_ok=True)
    use_content_keys()
    say = (lambda text: console.print(text)) if console is not None else (lambda text: None)

    existing, _ = read_records(results / "runs.jsonl")
    done = set(latest_records(existing)) if options.resume else set()
    todo = [c for c in candidates if c.key not in done]
    say(f"{len(candidates)} candidate(s) of {len(refs)} problem(s); {len(candidates) - len(todo)} already recorded"
        + (" (--resume)" if options.resume else "") + f"; records: {results / 'runs.jsonl'}")

    # Builds need only CPUs: by default they overlap with the evaluation (the GPUs hidden from them, at a low
    # priority, leaving two cores to each GPU worker), and candidates are evaluated as their builds end.
    overlap = not options.build_first
    jobs = options.jobs or (max(1, (os.cpu_count() or 1) - 2 * workers) if overlap else os.cpu_count() or 1)
    device_name = "cuda" if cuda else "cpu"
    started = time.monotonic()
    built, build_s = {}, [0.0]
    building = {str(c.path) for c in todo if builds_code(c)}
    progress = Progress(len(todo), sum(1 for c in todo if str(c.path) not in building), console, workers)

    def build_done(path: str, outcome: tuple):
        built[path] = outcome
        progress.built += bool(outcome[0])
        building.discard(path)

    def build_all():
        try:
            build_candidates(todo, jobs, torch.device(device_name), options.build_timeout, say, build_done, hide_gpus=overlap)
        except Exception as error:  # noqa: BLE001 - the candidates' own workers then build them; the batch goes on
            say(f"[red]the build step failed ({type(error).__name__}: {error}); each candidate is built by its own evaluation[/red]")
        finally:
            for path in list(building):
                build_done(path, (False, "the build step ended without building it"))
            build_s[0] = time.monotonic() - started
            failed = sum(1 for ok, _ in built.values() if not ok)
            if built:
                say(f"builds: {len(built) - failed} ok, {failed} failed ({_duration(build_s[0])})")

    builder = threading.Thread(target=build_all, name="builds", daemon=True)
    if todo:
        builder.start()
        if not overlap:
            builder.join()

    tasks, next_id = [], 0
    used = {c.ref for c in todo}
    for ref in refs:
        if ref not in used:
            continue
        name = next(c.problem for c in todo if c.ref == ref)
        if not (options.resume and recorded_baselines(existing, name)):
            tasks.append(Task(next_id, "baselines", ref))
            next_id += 1
    for c in todo:
        tasks.append(Task(next_id, "eval", c.ref, c))
        next_id += 1
    # Baselines already recorded (--resume) are handed to the candidates as they are.
    reused = {c.ref: recorded_baselines(existing, c.problem) for c in todo if options.resume and recorded_baselines(existing, c.problem)}

    argv = [sys.executable, "-m", "harness.batch", "--device", device_name, "--results", str(results / "runs.jsonl"),
            "--config", json.dumps(options.config())]
    slots = []
    for index in range(workers):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        if cuda:
            env["CUDA_VISIBLE_DEVICES"] = gpus[index]
        slots.append(Slot(index, argv, env, results / f"worker-{index}.log"))
    deaths, errors = 0, {}
    evaluate_start = time.monotonic()
    if tasks:
        say(f"evaluating on {workers} {'GPU' if cuda else 'CPU'} worker(s)" + (" as builds end" if overlap and building else ""))
        baselines, errors, deaths = run_pool(tasks, slots, results, progress, device_name, built, preset=reused, building=building)
    if todo:
        builder.join()
    end = time.monotonic()
    failed_builds = sum(1 for ok, _ in built.values() if not ok)
    build_times = [seconds for ok, seconds in built.values() if ok and seconds]
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "device": device_name,
            "workers": workers, "results": str(results), "wall_s": round(end - started, 1), "overlap": overlap,
            "build_jobs": jobs, "build_s": round(build_s[0], 1), "evaluate_s": round(end - evaluate_start, 1),
            "evaluated": progress.done, "builds": len(built) - failed_builds - sum(1 for ok, s in built.values() if ok and not s),
            "cached_builds": sum(1 for ok, s in built.values() if ok and not s), "failed_builds": failed_builds,
            "s_per_candidate": {"build": round(statistics.fmean(build_times), 2) if build_times else 0.0,
                                "evaluate": round((end - evaluate_start) * workers / max(1, progress.done), 2) if progress.done else 0.0},
            "phase_s": progress.phase_summary()}
    names = {c.ref: c.problem for c in candidates}
    return write_summary(results, candidates, refs, title, meta, {names.get(r, r): e for r, e in errors.items()}, deaths)


# ---- the worker: one Run, tasks from stdin, replies on a pipe ----------------------------------------------
class Evaluator:
    """What a worker does with a task, through the same Run as `eval`: the problem's self-check and baselines,
    or one candidate's record (appended to the batch's runs.jsonl as soon as it is known)."""

    def __init__(self, device, results_path: Path, config: dict, report=None):
        from .runner import Config, Run

        self.config = Config(trials=config["trials"], budget_s=config["budget"], call_timeout_s=config["timeout"],
                             build_timeout_s=config["build_timeout"], shapes=tuple(config["shapes"]),
                             host_bound_processes=config["host_bound_processes"])
        self.results_path = results_path
        self.run = Run(device, results_path, self.config, reporter=report)
        self.problems = {}

    def problem(self, ref: str):
        if ref not in self.problems:
            self.problems[ref] = load_problem(Path(ref))
        return self.problems[ref]

    def baselines(self, ref: str, write: bool = True) -> tuple:
        """(the baselines' medians {shape: {kind: ms}}, their records); ProblemError when the self-check fails."""
        from .runner import Target, add_baseline

        problem = self.problem(ref)
        self.run.check_tolerances(problem)
        baselines, records = {}, []
        targets = (Target("eager", "eager"), Target("compile", "torch.compile"))
        for target, then in zip(targets, (targets[1], None)):
            record = self.run.evaluate_target(problem, target, baselines, then and (problem, then))
            add_baseline(baselines, record)
            if write:
                append_record(record, self.results_path)
            records.append(record)
        return baselines, records

    def evaluate(self, ref: str, path: str, baselines: dict, built=None, write: bool = True, then: dict | None = None) -> dict:
        """One candidate's record. `then` ({ref, path, built}) names the candidate this worker is sent next: its
        child starts while this one is evaluated (Run.start_ahead)."""
        from .runner import Target

        following = None
        for item, item_built in ((path, built), (then and then["path"], then and then.get("built"))):
            if item and item_built:
                self.run.prebuilt[item] = (bool(item_built[0]), item_built[1])
        if then:
            following = (self.problem(then["ref"]), Target("solution", Path(then["path"]).stem, path=Path(then["path"])))
        record = self.run.evaluate_target(self.problem(ref), Target("solution", Path(path).stem, path=Path(path)), baselines,
                                          following)
        if write:
            append_record(record, self.results_path)
        return record

    def finish(self):
        """The seed is written only now, as `eval` does: nothing a candidate could read held it."""
        self.run.drop_ahead()
        append_record({"run_id": self.run.run_id, "seed": self.run.seed, "date": self.run.env["date"]},
                      self.results_path.parent / "seeds.jsonl")


def _worker(argv) -> int:
    import argparse

    import torch

    parser = argparse.ArgumentParser(prog="python -m harness.batch")
    parser.add_argument("--device", required=True)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--reply-fd", type=int, required=True)
    args = parser.parse_args(argv)
    reply = os.fdopen(args.reply_fd, "w", buffering=1)
    os.set_inheritable(args.reply_fd, False)
    current = {"task": None}

    def send(message: dict):
        reply.write(json.dumps(message, default=str) + "\n")
        reply.flush()

    def report(message: str = "", record=None):
        for phase in ("checking", "timing"):
            if f": {phase} " in message and current["task"] is not None:
                send({"task": current["task"], "event": "phase", "phase": phase})
                return

    evaluator = Evaluator(torch.device(args.device), args.results, json.loads(args.config), report)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            task = json.loads(line)
            current["task"] = task["task"]
            if task["op"] == "baselines":
                try:
                    baselines, _ = evaluator.baselines(task["ref"])
                    send({"task": task["task"], "event": "done", "baselines": baselines})
                except ProblemError as error:
                    send({"task": task["task"], "event": "done", "error": str(error)})
            else:
                record = evaluator.evaluate(task["ref"], task["path"], task.get("baselines") or {}, task.get("built"),
                                            then=task.get("then"))
                send({"task": task["task"], "event": "done", "status": record["status"], "rule": record.get("rule", ""),
                      "reason": record.get("reason", "")[:200], "checked": is_compiled(record)})
            current["task"] = None
    finally:
        evaluator.finish()
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
