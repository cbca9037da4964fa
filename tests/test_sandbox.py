"""harness.sandbox: a confined worker can do its job and nothing else; strays of a worker are found and killed.

Every confinement runs in a fresh subprocess (a Landlock domain can never be lifted); the pytest process is never
confined and never made a subreaper.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from harness import sandbox

ABI = sandbox.landlock_abi()
needs_landlock = pytest.mark.skipif(ABI < 1, reason="Landlock is not available on this machine")

# Prelude of every confined scenario: confine first (before torch starts threads), then report as JSON.
PRELUDE = """
import json, os, subprocess, sys
from pathlib import Path
from harness import sandbox
args = json.loads(sys.argv[1])
reads = sandbox.child_read_paths(Path(args["solution"]), Path(args["problem"]))
description = sandbox.confine(reads, args["writes"], args.get("maps", ()))
out = {"description": description}

def attempt(name, action):
    try:
        action()
        out[name] = "ok"
    except OSError as e:
        out[name] = __import__("errno").errorcode.get(e.errno, str(e.errno))
"""


@pytest.fixture
def layout(tmp_path):
    """A fake repository layout: a solution file with a sibling, a problem folder, results/ with a secret, scratch."""
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "candidate.py").write_text("class ModelNew: pass\n")
    (tmp_path / "solutions" / "other.py").write_text("# another solution\n")
    (tmp_path / "problem").mkdir()
    (tmp_path / "problem" / "reference.py").write_text("# reference\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "runs.jsonl").write_text('{"seed": "s3cr3t"}\n')
    (tmp_path / "scratch").mkdir()
    return tmp_path


def confined_command(layout: Path, body: str, writes=None, maps=()) -> list:
    """The command line of a fresh interpreter that runs PRELUDE + body."""
    args = {"solution": str(layout / "solutions" / "candidate.py"), "problem": str(layout / "problem"),
            "writes": [str(p) for p in (writes or [layout / "scratch"])], "maps": [str(p) for p in maps]}
    return [sys.executable, "-c", PRELUDE + textwrap.dedent(body), json.dumps(args)]


def run_confined(layout: Path, body: str, writes=None, timeout: float = 120, maps=()) -> dict:
    """Run PRELUDE + body in a fresh interpreter with the scratch environment; return its JSON `out`."""
    command = confined_command(layout, textwrap.dedent(body) + "\nprint('RESULT' + json.dumps(out))\n", writes, maps)
    env = dict(os.environ, **sandbox.scratch_environment(layout / "scratch"))
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=layout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert proc.returncode == 0 and lines, f"confined child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len("RESULT"):])


@needs_landlock
def test_confined_child_can_do_its_job(layout):
    out = run_confined(layout, """
        import torch
        out["torch"] = float(torch.ones(3).sum())
        out["solution"] = Path(args["solution"]).read_text()
        out["problem"] = (Path(args["problem"]) / "reference.py").read_text()
        scratch = Path(args["writes"][0])
        (scratch / "made").mkdir()
        (scratch / "made" / "file.txt").write_text("x")
        os.rename(scratch / "made" / "file.txt", scratch / "moved.txt")
        out["wrote"] = (scratch / "moved.txt").read_text()
        out["true"] = subprocess.run(["/bin/true"], stdout=subprocess.DEVNULL).returncode
        import tempfile
        out["tempdir"] = tempfile.gettempdir()
        out["cpu_threads"] = len(os.listdir("/proc/self/task"))
        out["shared"] = float(torch.ones(2).share_memory_().sum())
        cc = __import__("shutil").which("cc")
        if cc:
            source = scratch / "hello.c"
            source.write_text('#include <stdio.h>\\nint main(void) { puts("built"); return 0; }\\n')
            subprocess.run([cc, str(source), "-o", str(scratch / "hello")], check=True, capture_output=True)
            out["cc"] = subprocess.run([str(scratch / "hello")], capture_output=True, text=True).stdout.strip()
        """, writes=[layout / "scratch", "/dev/shm"])
    assert out["description"].startswith(f"landlock ABI {ABI} (fs")
    assert out["torch"] == 3.0 and out["shared"] == 2.0
    assert out["solution"].startswith("class ModelNew") and out["problem"] == "# reference\n"
    assert out["wrote"] == "x" and out["true"] == 0
    assert Path(out["tempdir"]).is_relative_to(layout / "scratch")
    if shutil.which("cc"):
        assert out["cc"] == "built"


@needs_landlock
def test_confined_child_cannot_escape(layout):
    listener = None
    name = f"harness-sandbox-test-{uuid.uuid4().hex}"
    if ABI >= 6:  # an abstract socket of the "parent" that the child must not reach
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind("\0" + name)
        listener.listen(1)
    try:
        out = run_confined(layout, f"""
            import ctypes, socket, stat
            root, parent = Path(args["solution"]).parent.parent, os.getppid()
            attempt("write_results", lambda: (root / "results" / "new.jsonl").write_text("forged"))
            attempt("append_results", lambda: open(root / "results" / "runs.jsonl", "a").write("forged"))
            attempt("read_results", lambda: (root / "results" / "runs.jsonl").read_text())
            attempt("read_sibling", lambda: (root / "solutions" / "other.py").read_text())
            attempt("write_solution", lambda: open(args["solution"], "a").write("#"))
            attempt("pyc_beside_solution", lambda: (root / "solutions" / "__pycache__").mkdir())
            attempt("parent_mem", lambda: open(f"/proc/{{parent}}/mem", "rb").read(1))
            attempt("parent_environ", lambda: open(f"/proc/{{parent}}/environ", "rb").read())
            attempt("parent_cmdline", lambda: open(f"/proc/{{parent}}/cmdline", "rb").read())
            attempt("own_status", lambda: open("/proc/self/status").read())
            attempt("cpuinfo", lambda: open("/proc/cpuinfo").read())
            attempt("signal_parent", lambda: os.kill(parent, 0))
            attempt("block_device", lambda: os.mknod(Path(args["writes"][0]) / "disk", stat.S_IFBLK | 0o600,
                                                      os.makedev(7, 0)))
            attempt("dev_null", lambda: open("/dev/null", "r+b").write(b"x"))
            libc = ctypes.CDLL(None, use_errno=True)
            PTRACE_SEIZE, PTRACE_DETACH = 0x4206, 17
            if libc.ptrace(PTRACE_SEIZE, parent, 0, 0) == 0:
                libc.ptrace(PTRACE_DETACH, parent, 0, 0)
                out["ptrace"] = "ok"
            else:
                out["ptrace"] = __import__("errno").errorcode[ctypes.get_errno()]
            def tcp_bind():
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
            attempt("tcp_bind", tcp_bind)
            def abstract_connect():
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect("\\0{name}")
            attempt("abstract_connect", abstract_connect)
            out["caps"] = [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff")][0]
            grandchild = subprocess.run([sys.executable, "-c",
                "import sys; from pathlib import Path; r = Path(sys.argv[1]);"
                "(r / 'results' / 'g.jsonl').write_text('forged')", str(root)], capture_output=True, text=True)
            out["grandchild_write"] = "PermissionError" in grandchild.stderr
            grandchild = subprocess.run([sys.executable, "-c",
                "import sys; print(open(sys.argv[1]).read())", str(root / "results" / "runs.jsonl")],
                capture_output=True, text=True)
            out["grandchild_read"] = "PermissionError" in grandchild.stderr and "s3cr3t" not in grandchild.stdout
            """)
    finally:
        if listener:
            listener.close()
    for name in ("write_results", "append_results", "read_results", "read_sibling", "write_solution",
                 "pyc_beside_solution", "parent_mem", "parent_environ", "parent_cmdline", "block_device"):
        assert out[name] in ("EACCES", "EPERM"), (name, out[name])
    assert out["own_status"] == "ok" and out["cpuinfo"] == "ok" and out["dev_null"] == "ok"
    assert out["ptrace"] in ("EPERM", "EACCES")
    assert int(out["caps"], 16) == 0
    assert out["grandchild_write"] and out["grandchild_read"]
    assert not (layout / "results" / "new.jsonl").exists() and not (layout / "results" / "g.jsonl").exists()
    if ABI >= 4:
        assert out["tcp_bind"] == "EACCES"
    if ABI >= 6:
        assert out["signal_parent"] == "EPERM"
        assert out["abstract_connect"] == "EPERM"


@needs_landlock
@pytest.mark.skipif(ABI < 6, reason="Landlock scopes signals from ABI 6 on (Run.start_ahead starts no child early below it)")
def test_a_confined_child_cannot_reach_a_sibling_in_its_own_domain(layout):
    """Run.start_ahead keeps the next target's child alive while a solution runs: the solution's process may not
    signal it, ptrace it or read its memory (each child confines itself in a domain of its own)."""
    env = dict(os.environ, **sandbox.scratch_environment(layout / "scratch"))
    sibling = subprocess.Popen(confined_command(layout, "print('READY', flush=True)\nimport time\ntime.sleep(300)\n"),
                               stdout=subprocess.PIPE, text=True, env=env, cwd=layout)
    try:
        assert sibling.stdout.readline().strip() == "READY"
        out = run_confined(layout, f"""
            import ctypes, signal
            sibling = {sibling.pid}
            attempt("signal", lambda: os.kill(sibling, signal.SIGKILL))
            attempt("memory", lambda: open(f"/proc/{{sibling}}/mem", "rb").read(1))
            libc = ctypes.CDLL(None, use_errno=True)
            out["ptrace"] = "ok" if libc.ptrace(0x4206, sibling, 0, 0) == 0 else __import__("errno").errorcode[ctypes.get_errno()]
            """)
        assert out["signal"] == "EPERM" and out["memory"] in ("EACCES", "EPERM") and out["ptrace"] in ("EACCES", "EPERM"), out
        assert sibling.poll() is None
    finally:
        sibling.kill()
        sibling.wait()


def test_confine_refuses_with_threads_running(layout):
    code = ("import threading, time\nfrom harness import sandbox\n"
            "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
            "try:\n    sandbox.confine(['/usr'], [])\nexcept sandbox.SandboxUnavailable as e:\n    print('REFUSED', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "REFUSED 2 threads already run" in proc.stdout, proc.stdout + proc.stderr


def test_confine_reports_missing_landlock(monkeypatch):
    """A kernel without the syscalls: a clear SandboxUnavailable before anything is changed in this process."""
    calls = []

    def no_landlock(number, *args):
        calls.append(number)
        return -errno.ENOSYS

    monkeypatch.setattr(sandbox, "_syscall", no_landlock)
    with pytest.raises(sandbox.SandboxUnavailable, match="no Landlock syscalls"):
        sandbox.confine(["/usr"], [])
    assert calls == [444]
    monkeypatch.setattr(sandbox, "_syscall", lambda number, *args: -errno.EOPNOTSUPP)
    with pytest.raises(sandbox.SandboxUnavailable, match="disabled at boot"):
        sandbox.confine(["/usr"], [])


@pytest.mark.skipif(ABI < 3, reason="Landlock before ABI 3 cannot withhold truncation")
def test_shared_files_can_be_written_never_cut_short(layout):
    """A CPU run's shared files (map_paths): the child writes into them through its mapping, and can neither
    truncate one (the parent's mapping past the end would take SIGBUS) nor make or remove files there."""
    shared = layout / "shared"
    shared.mkdir()
    (shared / "buffer").write_bytes(b"\0" * 4096)
    out = run_confined(layout, """
        import torch
        name = str(Path(args["maps"][0]) / "buffer")
        mapped = torch.from_file(name, shared=True, size=1024, dtype=torch.float32)
        mapped.fill_(2.0)
        out["mapped"] = float(mapped.sum())
        attempt("ftruncate", lambda: os.ftruncate(os.open(name, os.O_RDWR), 0))
        attempt("truncate", lambda: os.truncate(name, 0))
        attempt("create", lambda: open(name + "2", "wb"))
        attempt("remove", lambda: os.remove(name))
        """, maps=[shared])
    assert out["mapped"] == 2048.0
    assert all(out[name] in ("EACCES", "EPERM") for name in ("ftruncate", "truncate", "create", "remove")), out
    assert (shared / "buffer").stat().st_size == 4096


def test_only_a_gpu_worker_may_open_the_gpu_nodes(monkeypatch):
    """A build that overlaps other candidates' timing runs with the GPUs hidden (CUDA_VISIBLE_DEVICES=""); its
    solution's import could set the variable back before CUDA starts, so its sandbox holds no GPU node."""
    monkeypatch.setattr(sandbox, "DEVICE_NODES", ("/dev/null",))
    monkeypatch.setattr(sandbox, "GPU_NODES", ("/dev/zero",))  # stands in for /dev/nvidia*, which this machine may lack
    assert "/dev/zero" in dict(sandbox._read_rules(["/dev"], gpu=True))
    assert "/dev/zero" not in dict(sandbox._read_rules(["/dev"], gpu=False))
    assert "/dev/null" in dict(sandbox._read_rules(["/dev"], gpu=False))


def test_child_read_paths_leave_out_the_repository(tmp_path):
    solution = sandbox.REPO_ROOT / "solutions" / "softmax" / "x.py"
    problem = sandbox.REPO_ROOT / "problems" / "softmax"
    extra = tmp_path / "extra"
    extra.mkdir()
    paths = sandbox.child_read_paths(solution if solution.exists() else Path(__file__), problem, extra=[extra])
    text = [str(p) for p in paths]
    repo = str(sandbox.REPO_ROOT)
    assert repo not in text and str(sandbox.REPO_ROOT / "results") not in text
    assert not any(t in ("/", "/tmp", "/root", "/work", "/home") for t in text)
    assert str(sandbox.REPO_ROOT / "harness") in text and str(extra) in text
    if problem.exists():
        assert str(problem) in text
    assert "/usr" in text and "/proc" in text and "/dev" in text
    for a in text:  # nothing nested under something else listed, and nothing that contains results/
        assert not any(a != b and a.startswith(b.rstrip("/") + "/") for b in text), a
        assert not (repo + "/results").startswith(a.rstrip("/") + "/")


def test_scratch_environment_points_into_scratch(tmp_path):
    env = sandbox.scratch_environment(tmp_path)
    for key in ("TMPDIR", "TEMP", "TMP", "XDG_CACHE_HOME", "CUDA_CACHE_PATH", "TRITON_CACHE_DIR",
                "TORCHINDUCTOR_CACHE_DIR"):
        assert Path(env[key]).is_relative_to(tmp_path) and Path(env[key]).is_dir(), key
    assert "HOME" not in env


def test_a_childs_environment_keeps_torch_compile_in_the_child(tmp_path):
    """torch.compile's pool of compile processes failed every shape compiled after it warmed up, inside the
    sandbox on the GPU machines (torch 2.11): the child compiles in its own process. And it imports torch from
    the bytecode beside it, whatever the parent's environment says."""
    from harness.problem import REPO_ROOT
    from harness.runner import child_environment

    env = child_environment(tmp_path, {"EXTRA": "1", "PYTHONPYCACHEPREFIX": "/somewhere/empty"})
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "1" and env["EXTRA"] == "1"
    assert "PYTHONPYCACHEPREFIX" not in env  # an empty cache would make the child compile torch from source
    assert Path(env["TMPDIR"]).is_relative_to(tmp_path) and env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO_ROOT)


def test_reap_strays_kills_double_forked_orphans():
    """A helper process acts as the parent: it becomes a subreaper, runs a child that leaves a setsid'd,
    double-forked `sleep`, and reap_strays finds and kills it, while a kept Popen keeps its exit status."""
    helper = textwrap.dedent("""
        import json, os, subprocess, sys, time
        from harness import sandbox
        out = {"subreaper": sandbox.become_subreaper()}
        kept = subprocess.Popen(["sleep", "30"])
        leaver = (
            "import os, sys, time\\n"
            "r, w = os.pipe()\\n"
            "if os.fork() == 0:\\n"
            "    os.setsid()\\n"
            "    pid = os.fork()\\n"
            "    if pid == 0:\\n"
            "        null = os.open(os.devnull, os.O_RDWR)\\n"
            "        for fd in (0, 1, 2):\\n"
            "            os.dup2(null, fd)\\n"
            "        os.execvp('sleep', ['sleep', '30'])\\n"
            "    os.write(w, str(pid).encode())\\n"
            "    os._exit(0)\\n"
            "os.close(w)\\n"
            "print(os.read(r, 100).decode())\\n"
        )
        orphan = int(subprocess.run([sys.executable, "-c", leaver], capture_output=True, text=True).stdout)
        for _ in range(200):  # the intermediate process exits; the orphan comes back to us
            with open(f"/proc/{orphan}/stat") as f:
                if int(f.read().rpartition(")")[2].split()[1]) == os.getpid():
                    break
            time.sleep(0.01)
        out["adopted"] = int(open(f"/proc/{orphan}/stat").read().rpartition(")")[2].split()[1]) == os.getpid()
        tree = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])  # a stray with children of its own
        for _ in range(200):
            leaves = [pid for pid, parent in sandbox._process_table().items() if parent == tree.pid]
            if len(leaves) == 2:
                break
            time.sleep(0.01)
        out["tree"] = [tree.pid] + leaves
        out["killed"] = sandbox.reap_strays(keep=[kept])
        out["tree_gone"] = not any(os.path.exists(f"/proc/{p}") for p in out["tree"])
        out["orphan"] = orphan
        out["orphan_gone"] = not os.path.exists(f"/proc/{orphan}")
        out["kept_alive"] = kept.poll() is None
        kept.kill()
        out["kept_status"] = kept.wait(timeout=10)
        out["again"] = sandbox.reap_strays()
        print(json.dumps(out))
        """)
    proc = subprocess.run([sys.executable, "-c", helper], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    if not out["subreaper"]:
        pytest.skip("PR_SET_CHILD_SUBREAPER is not supported here")
    assert out["adopted"]
    assert out["orphan"] in out["killed"] and out["orphan_gone"]
    assert len(out["tree"]) == 3 and set(out["tree"]) <= set(out["killed"]) and out["tree_gone"]
    assert out["kept_alive"] and out["kept_status"] == -signal.SIGKILL
    assert out["again"] == []


def test_kill_group():
    proc = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    sandbox.kill_group(proc.pid)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    sandbox.kill_group(proc.pid)  # gone: no error
    with pytest.raises(ValueError):
        sandbox.kill_group(os.getpgrp())


@pytest.mark.skipif(not os.environ.get("HARNESS_SANDBOX_BUILD"), reason="slow (~1 min): set HARNESS_SANDBOX_BUILD=1")
@needs_landlock
def test_load_inline_builds_inside_the_sandbox(layout):
    build = layout / "build"
    build.mkdir()
    out = run_confined(layout, """
        os.environ["TORCH_EXTENSIONS_DIR"] = args["writes"][1]
        import torch
        from torch.utils.cpp_extension import load_inline
        module = load_inline("sandbox_tiny", cpp_sources="torch::Tensor twice(torch::Tensor x) { return x * 2; }",
                             functions=["twice"])
        out["twice"] = module.twice(torch.ones(3)).tolist()
        """, writes=[layout / "scratch", build, "/dev/shm"], timeout=600)
    assert out["twice"] == [2.0, 2.0, 2.0]
