"""Confinement of the worker process that imports an untrusted solution, and clean-up of what it leaves behind.

The worker runs as root on the GPU machine, so file permissions protect nothing: Linux Landlock (raw syscalls
through ctypes, no dependency) restricts which files it may open, create or remove, whom it may signal and
which TCP ports it may use, and keeps it from ptracing, or reading /proc/<pid>/mem of, any process outside its
domain (the parent). Its capabilities are dropped as well, since root's capabilities (mknod, raw I/O, module
loading, bpf, settimeofday) would walk around Landlock. A domain is inherited by every future child and thread
and can never be lifted.

The parent side: become_subreaper() makes orphaned descendants (double fork, setsid) come back to the parent,
where reap_strays() finds and kills them; kill_group() kills a worker's process group.

Import only the standard library here: confine() has to run before torch (or numpy) is imported, because
those start native threads (OpenBLAS) and Landlock confines only the calling thread and its later offspring.
"""
from __future__ import annotations

import ctypes
import errno
import importlib.util
import os
import signal
import stat
import sys
import sysconfig
import time
from pathlib import Path

__all__ = ["SandboxUnavailable", "confine", "child_read_paths", "scratch_environment", "become_subreaper",
           "reap_strays", "kill_group", "landlock_abi"]

REPO_ROOT = Path(__file__).resolve().parent.parent

# Landlock's syscall numbers are the same on x86_64 and aarch64 (allocated after the tables were unified).
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1

# Filesystem access rights, and the ABI that introduced each.
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13        # ABI 2
FS_TRUNCATE = 1 << 14     # ABI 3
FS_IOCTL_DEV = 1 << 15    # ABI 5
NET_BIND_TCP = 1 << 0     # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1                # ABI 6

_FS_BY_ABI = {1: (1 << 13) - 1, 2: FS_REFER, 3: FS_TRUNCATE, 5: FS_IOCTL_DEV}
# The only rights a rule on a single (non-directory) file may carry.
_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
# Device nodes are opened read-write and driven by ioctl (/dev/null, /dev/nvidia*); creating nodes is not allowed.
_DEVICE = _READ | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV
# Everything but making device nodes (a block node in scratch would expose the raw disk) and device ioctls.
_WRITE_EXCLUDED = FS_MAKE_CHAR | FS_MAKE_BLOCK | FS_IOCTL_DEV

# What a worker needs of /dev, instead of /dev as a whole (root could read /dev/sda or /dev/loop* through it,
# or push keystrokes into a terminal with TIOCSTI). /dev/shm is only listed: pass it in write_paths where the
# worker shares tensors through shared memory (torch's CPU tensors, CUDA's own IPC files).
DEVICE_NODES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/shm")
# The GPU's nodes, for a worker that runs on it only: a build that overlaps other candidates' timing hides the
# GPUs from its worker (CUDA_VISIBLE_DEVICES=""), which the solution's import could undo before CUDA starts.
GPU_NODES = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/nvidia-caps-imex-channels")


class SandboxUnavailable(Exception):
    """Landlock cannot be applied here; str(e) says why."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # packed in the kernel's uapi header
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.restype = ctypes.c_int
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAP_VERSION_3 = 0x20080522


def _syscall(number: int, *args) -> int:
    """The raw syscall: its result, or -errno on failure (the kernel's convention; tests replace this)."""
    result = _libc.syscall(ctypes.c_long(number), *args)
    return -ctypes.get_errno() if result == -1 else result


def _prctl(option: int, arg: int = 0) -> int:
    """prctl(option, arg, 0, 0, 0): 0 or more, or -errno."""
    result = _libc.prctl(option, arg, 0, 0, 0)
    return -ctypes.get_errno() if result == -1 else result


def _why(code: int) -> str:
    return errno.errorcode.get(-code, str(-code)) + ": " + os.strerror(-code)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where Landlock is missing or disabled (for callers and tests)."""
    try:
        return max(0, _syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)))
    except OSError:
        return 0


def _require_abi() -> int:
    abi = _syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    if abi == -errno.ENOSYS:
        raise SandboxUnavailable("the kernel has no Landlock syscalls (needs Linux >= 5.13 with CONFIG_SECURITY_LANDLOCK,"
                                 " or a seccomp filter blocks them)")
    if abi == -errno.EOPNOTSUPP:
        raise SandboxUnavailable("Landlock is built into the kernel but disabled at boot (add 'landlock' to lsm=)")
    if abi < 1:
        raise SandboxUnavailable(f"landlock_create_ruleset(version) failed: {_why(abi) if abi < 0 else abi}")
    return abi


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading
        return threading.active_count()


def _expand(paths) -> list[str]:
    """Existing absolute paths with symlinks resolved (Landlock binds a rule to the inode the path reaches)."""
    import glob

    found = []
    for path in paths:
        for match in (sorted(glob.glob(str(path))) if any(c in str(path) for c in "*?[") else [str(path)]):
            if os.path.exists(match):
                found.append(os.path.realpath(match))
    return found


def _read_rules(read_paths, gpu: bool = True) -> list[tuple[str, int]]:
    """(path, rights) for the read paths, with /dev and /proc narrowed: a worker gets the device nodes it needs and,
    of /proc, the system-wide entries and its own pid's folder, not the folders of other processes (the parent's
    command line can hold --seed). The price: a process the worker starts cannot open its own /proc/self files
    (Landlock has no notion of "self"); compilers do not care, but CUDA in such a grandchild fails (error 304)."""
    rules = []
    for path in _expand(read_paths):
        if path == "/dev":
            rules.append((path, FS_READ_DIR))
            nodes = DEVICE_NODES + (GPU_NODES if gpu else ())
            rules += [(node, FS_READ_DIR if node == "/dev/shm" else _DEVICE) for node in _expand(nodes)]
        elif path.startswith("/dev/"):
            rules.append((path, _DEVICE))
        elif path == "/proc":
            rules.append((path, FS_READ_DIR))
            # /proc/self and /proc/thread-self lead here; the CUDA driver fopen(..., "w")s a file of its own there
            # (without write and truncate, cudaGetDeviceCount fails with error 304).
            rules.append((f"/proc/{os.getpid()}", _READ | FS_WRITE_FILE | FS_TRUNCATE))
            with os.scandir("/proc") as entries:
                for entry in entries:
                    if not entry.name.isdigit() and not entry.is_symlink():  # self, mounts, net lead into the pid
                        rules.append((entry.path, _READ))
        else:
            rules.append((path, _READ))
    return rules


def _add_rule(ruleset: int, path: str, rights: int, handled: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # vanished (a /proc entry), or never there: nothing to allow
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS
        rights &= handled
        if not rights:
            return
        attr = _PathBeneathAttr(rights, fd)
        result = _syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(attr),
                          ctypes.c_uint32(0))
        if result < 0:
            raise SandboxUnavailable(f"landlock_add_rule({path}) failed: {_why(result)}")
    finally:
        os.close(fd)


def _drop_capabilities() -> None:
    """Empty the bounding, ambient, effective, permitted and inheritable sets: root keeps its uid but loses
    mknod, raw I/O (/proc/kcore), module loading, bpf, DAC override and the rest. With no_new_privs set, no later
    execve can give any of them back."""
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap)  # fails without CAP_SETPCAP, when there is nothing to drop anyway
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise SandboxUnavailable(f"capset(0) failed: {os.strerror(ctypes.get_errno())}")


def confine(read_paths, write_paths, map_paths=(), gpu: bool = True) -> str:
    """Call in the child before any untrusted code runs, and before anything starts a thread (import torch or
    numpy only afterwards: OpenBLAS starts one at import). Landlock restricts the calling thread and everything it
    starts later, so a thread that already exists would stay free; with more than one thread this refuses.

    After it: files can be read/executed only under `read_paths` and `write_paths` (dirs or single files; /dev and
    /proc are narrowed, see _read_rules), created/written/removed/renamed only under `write_paths` (device nodes
    excepted); with ABI >= 4 no TCP bind/connect; with ABI >= 6 no signals to, nor abstract-unix connections to,
    processes outside the domain (the parent). Landlock itself forbids ptrace of, and /proc/<pid>/mem or environ
    of, processes outside the domain. All capabilities are dropped. Paths that do not exist are skipped.
    Put /dev/shm in `write_paths` where CUDA IPC is used (torch's reference-count files, CUDA's own cuda.shm.*
    files). Files under `map_paths` (the parent's shared files of a CPU run) can be read and written, not
    created, removed or truncated: a file cut short under the parent's mapping would kill it with SIGBUS.
    `gpu` False leaves the GPU's device nodes out. Returns a short description; raises SandboxUnavailable when
    this cannot be done (the message says why)."""
    abi = _require_abi()
    threads = _thread_count()
    if threads > 1:
        raise SandboxUnavailable(f"{threads} threads already run in this process and Landlock ABI {abi} confines only "
                                 "the calling thread: confine before importing torch/numpy or starting threads")
    handled_fs = 0
    for version, rights in _FS_BY_ABI.items():
        if abi >= version:
            handled_fs |= rights
    handled_net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    attr = _RulesetAttr(handled_fs, handled_net, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8  # older kernels reject fields they do not know

    rules = _read_rules(read_paths, gpu) + [(path, handled_fs & ~_WRITE_EXCLUDED) for path in _expand(write_paths)]
    rules += [(path, handled_fs & (FS_READ_FILE | FS_WRITE_FILE)) for path in _expand(map_paths)]
    ruleset = _syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise SandboxUnavailable(f"landlock_create_ruleset failed (ABI {abi}): {_why(ruleset)}")
    try:
        for path, rights in rules:
            _add_rule(ruleset, path, rights, handled_fs)
        result = _prctl(PR_SET_NO_NEW_PRIVS, 1)
        if result < 0:
            raise SandboxUnavailable(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {_why(result)}")
        result = _syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
        if result < 0:
            raise SandboxUnavailable(f"landlock_restrict_self failed: {_why(result)}")
    finally:
        os.close(ruleset)
    _drop_capabilities()
    parts = ["fs"] + (["net"] if handled_net else []) + (["signals", "abstract-unix"] if scoped else [])
    return f"landlock ABI {abi} ({', '.join(parts)}), capabilities dropped"


def _is_within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def child_read_paths(solution: Path | None, problem_dir: Path, extra=()) -> list[Path]:
    """What a worker legitimately reads: the Python installation, torch, CUDA, the system folders, the harness
    package, the problem folder and the solution file alone (not its folder). Never the repository root (it holds
    results/), nor /tmp or /root as a whole; an interpreter or sys.path entry that lives under them is listed
    alone. Deduplicated, with paths nested under another dropped."""
    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    candidates += [p for p in sys.path if p]  # '' is the current folder: never
    candidates += [value for key, value in sysconfig.get_paths().items() if key != "scripts"]
    try:
        import site
        candidates += site.getsitepackages() + [site.getusersitepackages()]
    except (AttributeError, ImportError):
        pass
    torch_spec = importlib.util.find_spec("torch")  # located, not imported
    if torch_spec and torch_spec.submodule_search_locations:
        torch_dir = list(torch_spec.submodule_search_locations)[0]
        candidates += [torch_dir, os.path.join(torch_dir, "lib")]
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidates += [cuda_home, os.path.join(cuda_home, "lib64"), os.path.join(cuda_home, "lib")]
    candidates += ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/opt", "/dev", "/proc", "/sys",
                   "/run/nvidia-persistenced", "/run/nvidia-fabricmanager"]
    candidates += [str(Path(__file__).resolve().parent), str(problem_dir)] + ([str(solution)] if solution else [])
    candidates += [str(p) for p in extra]

    # Folders that must never be readable as a whole: a candidate equal to one of them, or above one, is dropped.
    # The solution's own folder is one of them (only the file is read; other solutions may lie beside it).
    forbidden = [str(REPO_ROOT), str(REPO_ROOT / "results"), "/tmp", "/root", "/home", "/work", "/"]
    forbidden += [str(Path(solution).parent)] if solution else []
    resolved = []
    for path in candidates:
        if not os.path.isabs(path) or not os.path.exists(path):
            continue
        real = os.path.realpath(path)
        if any(_is_within(os.path.realpath(f), real) for f in forbidden if os.path.exists(f)):
            continue
        resolved.append(real)
    # Nested paths dropped by looking their folders up (linear: thousands of `_*` files beside a solution made a
    # pairwise comparison take seconds in the parent)
    found = set(resolved)
    kept = [p for p in found if not any(str(parent) in found for parent in Path(p).parents)]
    return [Path(p) for p in sorted(kept)]


def scratch_environment(scratch: Path) -> dict:
    """Variables that send every tool's temporary and cache files into `scratch` (created here), so nothing needs
    to write under HOME or /tmp. HOME itself is kept. TORCH_EXTENSIONS_DIR is left to the caller (the build
    folder). Python's bytecode cache is not among them: a fresh PYTHONPYCACHEPREFIX would make every child compile
    torch's modules from source (4 of its 8 s to start on 2 cores); the child points sys.pycache_prefix at
    scratch/pycache itself, after importing torch and before the solution (pycache_prefix)."""
    scratch = Path(scratch)
    folders = {
        "TMPDIR": scratch / "tmp", "TEMP": scratch / "tmp", "TMP": scratch / "tmp",
        "XDG_CACHE_HOME": scratch / "cache", "XDG_CONFIG_HOME": scratch / "config",
        "CUDA_CACHE_PATH": scratch / "cache" / "nv", "TRITON_CACHE_DIR": scratch / "cache" / "triton",
        "TRITON_HOME": scratch / "triton", "TORCHINDUCTOR_CACHE_DIR": scratch / "cache" / "inductor",
        "TORCH_HOME": scratch / "cache" / "torch",
        "MPLCONFIGDIR": scratch / "config" / "matplotlib", "NUMBA_CACHE_DIR": scratch / "cache" / "numba",
        "CUPY_CACHE_DIR": scratch / "cache" / "cupy",
    }
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return {key: str(value) for key, value in folders.items()}


def pycache_prefix(scratch) -> str:
    """Where a child caches the bytecode of what it imports once the solution may run: in its own scratch folder,
    so that a .pyc shipped beside a solution is never read in place of the source the scan read."""
    return os.path.join(str(scratch), "pycache")


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants: one orphaned by a double fork or setsid comes back to
    it (not to init), where reap_strays finds it. False where unsupported."""
    try:
        return _prctl(PR_SET_CHILD_SUBREAPER, 1) == 0
    except (OSError, AttributeError):
        return False


def _process_table() -> dict[int, int]:
    """{pid: parent pid} of every process now (threads are not listed at the top of /proc)."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data.rpartition(b")")[2].split()  # the command name may hold spaces and parentheses
        if len(fields) > 1:
            table[int(name)] = int(fields[1])
    return table


def _helper_pids() -> set[int]:
    """multiprocessing's own helpers in this process (resource tracker, forkserver), which are not strays."""
    pids = set()
    for module, attr in (("multiprocessing.resource_tracker", "_resource_tracker"),
                         ("multiprocessing.forkserver", "_forkserver")):
        helper = getattr(sys.modules.get(module), attr, None)
        pid = getattr(helper, "_pid", None) or getattr(helper, "_forkserver_pid", None)
        if pid:
            pids.add(pid)
    return pids


def _kill_if_child_of(pid: int, parent: int) -> bool:
    """SIGKILL pid if it is still the child of `parent` (checked through a pidfd, so a recycled pid is spared)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):
        fd = None
    try:
        if _process_table_entry(pid) != parent:
            return False
        if fd is None:
            os.kill(pid, signal.SIGKILL)
        else:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if fd is not None:
            os.close(fd)


def _process_table_entry(pid: int):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rpartition(b")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def reap_strays(keep=(), timeout: float = 2.0) -> list[int]:
    """SIGKILL every child of this process but those in `keep` (pids, or objects with .pid such as Popen or
    multiprocessing.Process, whose exit status stays theirs to collect) and multiprocessing's helpers, and all
    their descendants; reap the children (waitpid on each pid, never -1, WNOHANG in a loop bounded by `timeout`),
    and repeat while killed parents hand orphans back to us. Returns the pids killed."""
    me = os.getpid()
    kept = {k if isinstance(k, int) else getattr(k, "pid", None) for k in keep} | _helper_pids()
    kept.discard(None)
    killed: dict[int, None] = {}
    unreaped: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        table = _process_table()
        strays = [pid for pid, parent in table.items() if parent == me and pid not in kept]
        victims = [(pid, me) for pid in strays]
        for pid, parent in victims:  # grows while we walk: the whole subtree under each stray
            victims += [(child, pid) for child, p in table.items() if p == pid]
        for pid, parent in victims:
            if _kill_if_child_of(pid, parent) or parent == me:
                killed[pid] = None
        unreaped |= set(strays)
        while unreaped and time.monotonic() < deadline:
            for pid in list(unreaped):
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        unreaped.discard(pid)
                except ChildProcessError:
                    unreaped.discard(pid)
            if unreaped:
                time.sleep(0.005)
        if not strays or time.monotonic() >= deadline:
            break
        time.sleep(0.005)  # let orphans of the killed be handed back before the next pass
    return list(killed)


def kill_group(pgid: int) -> None:
    """SIGKILL a process group (a worker started with its own session), ignoring one already gone. Refuses
    pgid <= 1 and this process's own group, which killpg would take down with it."""
    if pgid <= 1 or pgid == os.getpgrp():
        raise ValueError(f"refusing to kill process group {pgid}")
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped (state Z) or already gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return bool(fields) and fields[0] not in (b"Z", b"X")
    except OSError:
        return False


def children() -> list[int]:
    """Live pids whose parent is this process (workers, and orphans handed back to it as subreaper)."""
    me = os.getpid()
    return sorted(pid for pid, parent in _process_table().items() if parent == me and _alive(pid))


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` in the process tree, at any depth."""
    table, found, frontier = _process_table(), [], [pid]
    while frontier:
        below = [child for child, parent in table.items() if parent in frontier]
        found += below
        frontier = below
    return [p for p in found if _alive(p)]
