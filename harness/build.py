"""Where solutions' extensions are built, for which GPU, and how a failed build is summarised.

Each solution file gets its own TORCH_EXTENSIONS_DIR under .build/, keyed by torch version and target
arch. torch's JIT loader rebuilds only when the sources or flags change (it hashes them and ninja
sees unchanged files), so a second `make eval` reuses the build.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import torch

from .problem import REPO_ROOT
from .records import file_sha256

BUILD_ROOT = Path(os.environ.get("HARNESS_BUILD_DIR", REPO_ROOT / ".build"))


def arch_list() -> str:
    """The arch flags that match this GPU (9.0 on an H200); TORCH_CUDA_ARCH_LIST wins when set."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor}"
    return "9.0"


# Set to "content" (the batch driver does, and its workers and their children inherit it): extension folders are
# keyed by the file's sha256 alone, so a candidate built once is never built again, wherever it is moved.
KEY_VARIABLE = "HARNESS_BUILD_KEY"


def extension_dir(solution: Path, problem: str) -> Path:
    tag = f"torch{torch.__version__.split('+')[0]}-cuda{torch.version.cuda or 'none'}-sm{arch_list().replace('.', '').replace(';', '_')}"
    if os.environ.get(KEY_VARIABLE) == "content":
        return BUILD_ROOT / tag / "by-content" / file_sha256(solution)[:20]
    digest = hashlib.sha256(str(solution.resolve()).encode()).hexdigest()[:8]
    return BUILD_ROOT / tag / f"{problem}-{solution.stem}-{digest}"


def prepare_build_env(solution: Path, problem: str) -> Path:
    """Set the variables torch.utils.cpp_extension reads, before the solution is imported."""
    directory = extension_dir(solution, problem)  # torch creates it on the first build
    os.environ["TORCH_EXTENSIONS_DIR"] = str(directory)
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list()
    os.environ.setdefault("MAX_JOBS", str(max(1, min(8, (os.cpu_count() or 2)))))
    if not os.environ.get("CUDA_HOME") and Path("/usr/local/cuda").is_dir():
        os.environ["CUDA_HOME"] = "/usr/local/cuda"
    return directory


def clear_stale_locks(directory: Path) -> list:
    """Remove the `lock` files torch's JIT loader leaves in an extension folder when its build is killed (a timeout,
    Ctrl-C): the next load would wait on them forever. Call only where nothing else builds in `directory` (the
    harness builds each folder from one process at a time). Returns the files removed."""
    removed = []
    for lock in _build_files(directory, "lock"):
        try:
            lock.unlink()
            removed.append(lock)
        except OSError:
            pass
    return removed


def built_libraries(directory: Path) -> dict:
    """{path: mtime} of the extensions built in an extension folder (torch puts each at <folder>/<name>/<name>.so)."""
    found = {}
    for library in _build_files(directory, ".so"):
        try:
            found[str(library)] = library.lstat().st_mtime
        except OSError:
            pass
    return found


def _build_files(directory: Path, ending: str) -> list:
    """Regular files named `*ending` one level down in an extension folder, read without following a link: the
    child may write the folder (a symlink there would lead the parent's unlink or walk anywhere), and no deeper
    (a tree it made a thousand levels deep would exhaust a recursive walk)."""
    found = []
    try:
        with os.scandir(directory) as entries:
            folders = [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return found
    for folder in folders:
        try:
            with os.scandir(folder) as entries:
                found += [Path(e.path) for e in entries if e.name.endswith(ending) and e.is_file(follow_symlinks=False)]
        except OSError:
            pass
    return sorted(found)


_ERROR_LINE = re.compile(r"(error|undefined reference|fatal)", re.IGNORECASE)
# Build-log lines that mention "error" without being one: ninja's summary, the failed command lines.
_NOISE = re.compile(r"^(ninja: build stopped|FAILED:|Error building extension|subprocess\.|Traceback|\s*\^|\[\d+/\d+\]|"
                    r"(\S*/)?(c\+\+|g\+\+|gcc|clang\+\+|nvcc|cc)\s)")


def summarise_build_error(message: str, max_lines: int = 2, width: int = 300) -> str:
    """The first compiler error lines of a failed build, on one line."""
    picked = []
    for line in message.splitlines():
        line = line.strip()
        if line and _ERROR_LINE.search(line) and not _NOISE.match(line):
            line = re.sub(r"^/\S*/", "", line)  # drop the long build-directory prefix of paths
            if line not in picked:
                picked.append(line)
        if len(picked) == max_lines:
            break
    text = " | ".join(picked) if picked else message.strip().splitlines()[0] if message.strip() else "build failed"
    return text[:width]


def is_build_failure(error: BaseException) -> bool:
    return "Error building extension" in str(error) or "error: command" in str(error)
