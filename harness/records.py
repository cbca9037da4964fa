"""results/runs.jsonl: one record per target per run, appended atomically.

Each record is written with a single write() of one line under an exclusive lock, then fsynced, so
an interrupted or concurrent run can at worst leave a torn last line, which readers skip and the
next append starts after; earlier records are never rewritten. Derived files (the leaderboard) are replaced atomically.
"""
from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch

from .problem import REPO_ROOT

RESULTS_DIR = REPO_ROOT / "results"
# CPU runs (no GPU: nothing timed there is a figure anyone should read) write here unless told otherwise.
SCRATCH_RESULTS_DIR = REPO_ROOT / ".scratch" / "results"


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


def harness_source_hash() -> str:
    """A hash of the harness's own sources: identifies the code even where git is absent (the GPU host)."""
    digest = hashlib.sha256()
    for path in sorted((REPO_ROOT / "harness").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def environment(device: torch.device) -> dict:
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "cuda": torch.version.cuda or "none", "python": platform.python_version(),
        "harness_commit": _git_commit(), "harness_sha": harness_source_hash(), "host_cpu": platform.processor() or platform.machine(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, sm_count=props.multi_processor_count, capability=f"{props.major}.{props.minor}",
                   l2_bytes=getattr(props, "L2_cache_size", 0), memory_bytes=props.total_memory, driver=_driver_version())
    else:
        env.update(gpu="cpu (no CUDA device)", sm_count=0, capability="", driver="none")
    return env
