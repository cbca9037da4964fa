"""results/runs.jsonl: one record per target per run, appended atomically.

Each record is written with a single write() of one line under an exclusive lock, then fsynced, so
an interrupted or concurrent run can at worst leave a torn last line, which readers skip and the
next append starts after; earlier records are never rewritten. Derived files (the leaderboard) are replaced atomically.
"""
from __future__ import annotations

import ast
import dataclasses
import datetime
import fcntl
import hashlib
import io
import json
import os
import platform
import subprocess
import tempfile
import tokenize
from pathlib import Path

import torch

from .problem import REPO_ROOT, private_files

RESULTS_DIR = REPO_ROOT / "results"
# CPU runs (no GPU: nothing timed there is a figure anyone should read) write here unless told otherwise.
SCRATCH_RESULTS_DIR = REPO_ROOT / ".scratch" / "results"


@dataclasses.dataclass
class Record:
    """One target's verdict and figures in one run: one line of runs.jsonl. Every stage of an evaluation
    fills its part (load: build and sandbox; correctness: checks; timing: timings and profile), and a
    failure at any stage sets status, rule and reason and keeps what the earlier stages found."""
    run_id: str
    problem: str
    kind: str  # solution | eager | compile | external
    name: str
    path: str | None  # the solution file, as given (relative to the repository where it lies in it)
    device: str | None  # the GPU's name, or "cpu (no CUDA device)"
    env: dict  # environment(): date, versions, hardware, the measured ceilings
    status: str = "ok"  # ok | failed | skipped
    rule: str = ""  # harness/rules.py, when failed
    reason: str = ""  # one line of evidence
    partial: bool = False  # only some shapes, or fewer correctness trials than the default
    sandbox: str = "not started"  # how the child was confined ("none: ..." when it was not)
    checks: list = dataclasses.field(default_factory=list)  # per correctness shape: trials, worst errors
    timings: list = dataclasses.field(default_factory=list)  # per timing shape: median_ms, rates, speedups, bounds
    warnings: list = dataclasses.field(default_factory=list)  # static-scan warnings (never a rejection)
    profile: dict | None = None  # the kernels the profiler saw at the first timing shape, and the solution's own share
    profiles: dict | None = None  # per timing shape: kernel count and own share
    build_s: float | None = None
    load_s: float | None = None
    rebuilt: bool | None = None
    sha256: str | None = None  # of the file as measured
    code_sha256: str | None = None  # of its code only (code_hash): what "file changed" compares
    worker_cpus: str | None = None
    versions: dict | None = None  # another library's release, as installed
    requirement_versions: dict | None = None
    uses_reference_ops: bool | None = None  # under `custom: partial`: forward called some of the reference's ops

    def to_json(self) -> dict:
        """The record as written: optional fields that were never filled are left out."""
        out = dataclasses.asdict(self)
        return {k: v for k, v in out.items() if v is not None or k in _REQUIRED}

    @classmethod
    def from_json(cls, data) -> "Record | None":
        """The record in a line of runs.jsonl, or None when it lacks a field readers need or holds one of the
        wrong type (run_id, problem, kind, status, an env with a date, timings each with a shape)."""
        if not isinstance(data, dict):
            return None
        env, timings = data.get("env"), data.get("timings")
        if not (all(isinstance(data.get(k), str) for k in ("run_id", "status")) and isinstance(env, dict)
                and isinstance(env.get("date"), str) and isinstance(timings, list)
                and all(isinstance(t, dict) and isinstance(t.get("shape"), str) for t in timings)):
            return None
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for key in ("problem", "kind", "name", "path", "device"):
            values.setdefault(key, None)
        return cls(**values)


_REQUIRED = {f.name for f in dataclasses.fields(Record) if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
_REQUIRED |= {"status", "rule", "reason", "partial", "sandbox", "checks", "timings", "warnings", "profile"}


def append_record(record: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # an interrupted writer left a torn line: keep ours whole and separate
        os.write(fd, line)
        os.fsync(fd)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def read_records(path: Path) -> tuple:
    """(records, number of unreadable lines skipped)."""
    records, skipped = [], 0
    if not path.is_file():
        return records, skipped
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                skipped += 1
    return records, skipped


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def code_text(source: str) -> str:
    """A Python file's code without its comments, docstrings and blank lines (text inside other strings,
    such as a kernel's CUDA source, stays whole). Two versions of a file that differ only in those have the
    same code; the positions come from tokenize and ast, which agree across Python versions."""
    try:
        tree = ast.parse(source)
        comments = [(t.start, t.end) for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    except (SyntaxError, tokenize.TokenError, ValueError, RecursionError, MemoryError):
        return source
    docstrings = []
    for node in [tree, *ast.walk(tree)]:
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            doc = body[0].value
            docstrings.append(((doc.lineno, doc.col_offset), (doc.end_lineno, doc.end_col_offset)))
    text_lines = source.splitlines()
    lines = [line.encode() for line in text_lines]
    # ast columns count UTF-8 bytes and tokenize's count characters: every span is cut in bytes, last first
    spans = docstrings + [((a, len(text_lines[a - 1][:b].encode())), (c, len(text_lines[c - 1][:d].encode())))
                          for (a, b), (c, d) in comments]
    for (start_line, start_col), (end_line, end_col) in sorted(set(spans), reverse=True):
        lines[start_line - 1:end_line] = [lines[start_line - 1][:start_col] + lines[end_line - 1][end_col:]]
    lines = [line.decode(errors="replace") for line in lines]
    return "\n".join(line.rstrip() for line in lines if line.strip())


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes: what a record says it measured."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def code_hash(path: Path) -> str:
    """sha256 of a solution's code (`code_text`), and of each shared private file its source names (a
    header's bytes): a comment-only edit of the solution keeps it, any edit of what it includes does not."""
    source = Path(path).read_text(encoding="utf-8", errors="replace")
    digest = hashlib.sha256(code_text(source).encode())
    for shared in private_files(path):
        if shared.name in source:
            digest.update(b"\0" + shared.name.encode() + b"\0" + shared.read_bytes())
    return digest.hexdigest()


def harness_source_hash() -> str:
    """A hash of the harness's own sources: identifies the code even where git is absent (the GPU host)."""
    digest = hashlib.sha256()
    for path in sorted((REPO_ROOT / "harness").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


# What nvidia-smi says of the GPU beside what torch does: the driver, and the clocks the figures ran under.
_SMI_FIELDS = {"driver": "driver_version", "sm_clock_max_MHz": "clocks.max.sm", "memory_clock_max_MHz": "clocks.max.mem",
               "sm_clock_applications_MHz": "clocks.applications.graphics", "power_limit_W": "power.limit"}


def _smi(props) -> dict:
    """nvidia-smi's view of the GPU with these torch properties ({} where it is absent or says nothing). It is
    named by PCI bus id: nvidia-smi's numbering need not be CUDA's (CUDA_VISIBLE_DEVICES reorders)."""
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return {}
    try:
        out = subprocess.run(["nvidia-smi", f"--id={getattr(props, 'pci_domain_id', 0):08X}:{bus:02X}:{getattr(props, 'pci_device_id', 0):02X}.0", f"--query-gpu={','.join(_SMI_FIELDS.values())}",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
        values = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")] if out.returncode == 0 else []
    except (OSError, subprocess.SubprocessError, IndexError):
        return {}
    return {key: value for key, value in zip(_SMI_FIELDS, values) if value and "N/A" not in value and "Not" not in value}


def environment(device: torch.device) -> dict:
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "cuda": torch.version.cuda or "none", "python": platform.python_version(),
        "harness_commit": _git_commit(), "harness_sha": harness_source_hash(), "host_cpu": platform.processor() or platform.machine(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, sm_count=props.multi_processor_count, capability=f"{props.major}.{props.minor}",
                   l2_bytes=getattr(props, "L2_cache_size", 0), memory_bytes=props.total_memory, driver="unknown")
        env.update(_smi(props))
    else:
        env.update(gpu="cpu (no CUDA device)", sm_count=0, capability="", driver="none")
    return env
