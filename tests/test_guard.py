"""The runtime guard (harness/guard.py): each attack below kills its process with a verdict it cannot
catch, and honest code (torch's own imports, a load_inline build, ordinary ops) is never flagged.

Every case runs in a fresh interpreter: a trusted driver installs the guard, imports the solution
(phase "load"), then calls it (phase "run"). Cases without torch skip importing it, to stay fast.
"""
from __future__ import annotations

import dis
import os
import subprocess
import sys
import sysconfig
import textwrap
import time
import types
from pathlib import Path

import pytest

from harness import guard, profiling, sandbox

REPO = Path(__file__).resolve().parent.parent

DRIVER = r'''
import importlib.util, os, sys, sysconfig
solution, scratch, report, use_torch = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
sys.path.insert(0, REPO)
fd = os.open(report, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
device = os.environ.get("GUARD_TEST_DEVICE", "cpu")
if use_torch:
    import torch, torch._dynamo, torch.utils.cpp_extension  # noqa: F401 - as the child does, before the snapshot
    if device == "cuda":
        torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
from harness import guard
sealed = guard.seal_frame_hooks() if use_torch else []
snapshot = guard.ModuleSnapshot() if use_torch else None
trusted = sorted({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
                 | {os.path.join(REPO, "harness"), os.path.dirname(os.path.abspath(__file__))})
readable = [solution] + [p for p in os.environ.get("GUARD_TEST_READABLE", "").split(os.pathsep) if p]  # a header beside it
set_phase = guard.install(fd, readable, [scratch], trusted)
spec = importlib.util.spec_from_file_location("solution_under_test", solution)
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
set_phase("run")
if hasattr(module, "ModelNew"):
    model = module.ModelNew()
    model = model.to(device)
    x = torch.randn(4, 16, device=device)
    with torch.no_grad():
        for _ in range(2):
            y = model(x)
        torch.softmax(x, -1); x @ x.T; x.sort(); x.sum(0)
        torch.nn.functional.cross_entropy(x, torch.tensor([0, 1, 2, 3], device=device))
        if device == "cuda":
            from harness import profiling
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(); model(x); end.record(); torch.cuda.synchronize(); start.elapsed_time(end)
            print("PROFILE", profiling.profile_kernels(model, [x])["kernel_count"])
    print("CHANGES", snapshot.changes(), guard.active_modes())
else:
    module.main()
print("FINISHED")
'''


def run_case(tmp_path: Path, source: str, use_torch: bool = False, timeout: float = 300, env=None) -> tuple:
    """(exit status, the guard's report line, stdout+stderr) of one driver run."""
    (tmp_path / "driver").mkdir(exist_ok=True)
    (tmp_path / "solution").mkdir(exist_ok=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    driver = tmp_path / "driver" / "driver.py"
    driver.write_text(f"REPO = {str(REPO)!r}\n" + DRIVER)
    solution = tmp_path / "solution" / "candidate.py"
    solution.write_text(textwrap.dedent(source))
    report = tmp_path / "report.txt"
    # as the child's: temporary and cache files go to scratch (TMPDIR...), which the guard lets it write
    environment = {**os.environ, **sandbox.scratch_environment(scratch), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    result = subprocess.run([sys.executable, str(driver), str(solution), str(scratch), str(report), "1" if use_torch else "0"],
                            capture_output=True, text=True, timeout=timeout, cwd=str(scratch), env=environment)
    text = report.read_text() if report.exists() else ""
    return result.returncode, text.strip(), result.stdout + result.stderr


def expect_kill(tmp_path, source, rule, fragment="", use_torch=False):
    code, report, output = run_case(tmp_path, source, use_torch)
    assert code == guard.GUARD_EXIT, f"not killed (status {code}): {output[-2000:]}"
    assert report.startswith(rule + "\t"), report
    assert fragment in report, report
    assert "FINISHED" not in output
    return report


def expect_pass(tmp_path, source, use_torch=False, timeout=300, env=None):
    code, report, output = run_case(tmp_path, source, use_torch, timeout, env)
    assert code == 0 and not report, f"status {code}, report {report!r}: {output[-3000:]}"
    assert "FINISHED" in output
    return output


# ----- introspection, in the load phase (module level) and in the run phase (main / forward) ----------
ATTACKS = {
    "getframe_in_run": ("import sys\ndef main():\n    f = sys._getframe(1)\n    print(f.f_locals)\n", "introspection", "sys._getframe"),
    "getframe_at_import": ("import sys\nf = sys._getframe(1)\ndef main(): pass\n", "introspection", "sys._getframe"),
    "inspect_stack": ("import inspect\ndef main():\n    return [f.frame.f_locals for f in inspect.stack()]\n", "introspection", "candidate.py"),
    "inspect_currentframe": ("import inspect\ndef main():\n    return inspect.currentframe().f_back.f_locals\n", "introspection", ""),
    "traceback_walk_stack": ("import traceback\ndef main():\n    return [f.f_locals for f, _ in traceback.walk_stack(None)]\n", "introspection", ""),
    "tb_frame": ("def main():\n    try:\n        raise ValueError\n    except ValueError as e:\n        return e.__traceback__.tb_frame.f_back\n",
                 "introspection", "tb_frame"),
    "gi_frame": ("def main():\n    g = (i for i in range(3))\n    return g.gi_frame\n", "introspection", "gi_frame"),
    "gc_get_objects": ("import gc\ndef main():\n    return [o for o in gc.get_objects() if isinstance(o, dict)]\n", "introspection", "gc.get_objects"),
    "gc_get_referrers": ("import gc\ndef main():\n    return gc.get_referrers(main)\n", "introspection", "gc.get_referrers"),
    "gc_get_referents": ("import gc\ndef main():\n    return gc.get_referents(main)\n", "introspection", "gc.get_referents"),
    "settrace": ("import sys\ndef main():\n    sys.settrace(lambda *a: None)\n", "introspection", "sys.settrace"),
    "setprofile": ("import sys\ndef main():\n    sys.setprofile(lambda *a: None)\n", "introspection", "sys.setprofile"),
    "current_frames": ("import sys\ndef main():\n    return sys._current_frames()\n", "introspection", "_current_frames"),
    "read_code": ("import os\ndef main():\n    return os.getcwd.__class__, main.__code__\n", "introspection", "__code__"),
    "set_defaults": ("def f(a=1):\n    return a\ndef main():\n    f.__defaults__ = (2,)\n", "introspection", "__defaults__"),
    "set_class": ("import json, sys, types\nclass M(types.ModuleType): pass\ndef main():\n    sys.modules['json'].__class__ = M\n",
                  "introspection", "__class__"),
    "code_replace": ("def main():\n    return (lambda: 1).__code__.replace(co_filename='/x.py')\n", "introspection", ""),
    "function_new": ("import types\ndef g(): pass\nc = None\ndef main():\n    types.FunctionType(type(g.__code__)(0, 0, 0, 0, 0, 0, b'', (), (), (), '', '', '', 0, b'', b''), {})\n",
                     "introspection", ""),
    "exec_string": ("def main():\n    exec('x = 1')\n", "introspection", "code at run time"),
    "eval_string": ("def main():\n    return eval('1 + 1')\n", "introspection", "code at run time"),
    "compile_call": ("def main():\n    return compile('1', '<s>', 'eval')\n", "introspection", "code at run time"),
    "exec_at_import": ("exec('import sys')\ndef main(): pass\n", "introspection", "code at run time"),
    "compile_fake_trusted_name": (
        "import importlib.abc, importlib.util, os\n"
        "FAKE = os.path.join(os.path.dirname(os.__file__), 'json', 'tool.py')\n"
        "class L(importlib.abc.SourceLoader):\n"
        "    def get_filename(self, name): return FAKE\n"
        "    def get_data(self, path): return b'import sys\\nframe = sys._getframe(3)\\n'\n"
        "spec = importlib.util.spec_from_loader('fake_json_tool', L(), origin=FAKE)\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "def main(): pass\n", "introspection", "trusted file name"),
    "marshal": ("import marshal\ndef main():\n    return marshal.loads(marshal.dumps(1))\n", "introspection", "marshal.loads"),
    "addaudithook": ("import sys\ndef main():\n    sys.addaudithook(lambda *a: None)\n", "introspection", "audit hook"),
    "ctypes_string_at": ("import ctypes\ndef main():\n    return ctypes.string_at(id(main), 16)\n", "introspection", "ctypes"),
    "ctypes_dlopen": ("import ctypes\ndef main():\n    return ctypes.CDLL(None).getpid()\n", "introspection", "ctypes"),
    "proc_self_mem": ("def main():\n    open('/proc/self/mem', 'rb')\n", "introspection", "/mem"),
    "proc_parent": ("import os\ndef main():\n    open(f'/proc/{os.getppid()}/cmdline', 'rb').read()\n", "introspection", "another process"),
    "proc_parent_listdir": ("import os\ndef main():\n    os.listdir(f'/proc/{os.getppid()}/fd')\n", "introspection", "another process"),
    "symlink_to_proc": ("import os\ndef main():\n    os.symlink(f'/proc/{os.getppid()}', 'parent')\n", "introspection", "symlink"),
    "getattr_indirection": ("import functools, gc\ndef main():\n    return list(map(functools.partial(gc.get_referrers), [main]))\n",
                            "introspection", "gc.get_referrers"),
    "breakpoint": ("def main():\n    breakpoint()\n", "introspection", "breakpoint"),
    # ----- sandbox ------------------------------------------------------------------------------------
    "write_outside": ("def main():\n    open('/tmp/guard-test-outside.txt', 'w').write('x')\n", "sandbox-violation", "for writing"),
    "os_open_outside": ("import os\ndef main():\n    os.open('/tmp/guard-test-outside.txt', os.O_WRONLY | os.O_CREAT)\n", "sandbox-violation", "for writing"),
    "remove_outside": ("import os\ndef main():\n    os.remove('/tmp/guard-test-does-not-exist')\n", "sandbox-violation", "os.remove"),
    "rename_out": ("import os\ndef main():\n    open('a', 'w').close()\n    os.rename('a', '/tmp/guard-test-moved')\n", "sandbox-violation", "os.rename"),
    "mkdir_outside": ("import os\ndef main():\n    os.makedirs('/tmp/guard-test-dir/x', exist_ok=True)\n", "sandbox-violation", "os.mkdir"),
    "system_in_run": ("import os\ndef main():\n    os.system('true')\n", "sandbox-violation", "os.system"),
    "popen_in_run": ("import subprocess\ndef main():\n    subprocess.run(['true'])\n", "sandbox-violation", "subprocess.Popen"),
    "fork_in_run": ("import os\ndef main():\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n", "sandbox-violation", "os.fork"),
    "kill_parent": ("import os\ndef main():\n    os.kill(os.getppid(), 0)\n", "sandbox-violation", "signals another process"),
    "socket": ("import socket\ndef main():\n    socket.socket()\n", "sandbox-violation", "network"),
    "crafted_bytecode": ("import marshal as m\ndef main():\n    open('x.cpython-311.pyc', 'wb').write(b'')\n", "introspection", "bytecode"),
    "symlink_out_of_scratch": ("import os\ndef main():\n    os.symlink('/tmp', 'out')\n", "sandbox-violation", "outside its own folders"),
    "write_open_shm": ("import os\ndef main():\n    os.open('/dev/shm/guard-test-shm', os.O_RDWR | os.O_CREAT)\n",
                       "sandbox-violation", "shared memory"),
    "ftruncate_shm": ("import os\ndef main():\n    fd = os.open('/dev/shm', os.O_RDONLY)\n    os.ftruncate(fd, 0)\n",
                      "sandbox-violation", "shared memory"),
    # a descriptor stands for the path it holds: fchmod then a listing of a folder its mode kept closed
    "fchmod_outside": ("import os\ndef main():\n    fd = os.open('/tmp', os.O_RDONLY)\n    os.chmod(fd, 0o777)\n",
                       "sandbox-violation", "os.chmod /tmp"),
    "listdir_shm_by_fd": ("import os\ndef main():\n    fd = os.open('/dev/shm', os.O_RDONLY)\n    os.listdir(fd)\n",
                          "sandbox-violation", "shared memory"),
    # the open event names no dir_fd: a relative name opened under /proc/self through a descriptor
    "proc_mem_by_dir_fd": ("import os\ndef main():\n    d = os.open('/proc/self', os.O_PATH)\n    os.open('mem', os.O_RDONLY, dir_fd=d)\n",
                           "introspection", "mem"),
    "proc_map_files_dot_by_dir_fd": ("import os\ndef main():\n    d = os.open('/proc/self', os.O_PATH)\n"
                                     "    os.open('map_files/.', os.O_RDONLY, dir_fd=d)\n", "introspection", "map_files"),
    "rename_to_dst_dir_fd": ("import os\ndef main():\n    out = os.open('/tmp', os.O_RDONLY)\n    open('a', 'w').close()\n"
                             "    os.rename('a', 'guard-test-moved-fd', dst_dir_fd=out)\n", "sandbox-violation", "os.rename"),
    "mmap_writable_shm": ("import mmap, os\ndef main():\n    fd = os.open('/dev/shm', os.O_RDONLY)\n    mmap.mmap(fd, 0)\n",
                          "sandbox-violation", "shared memory"),
    "custom_pathlike": ("class P:\n    def __fspath__(self): return '/tmp/guard-test-outside.txt'\ndef main():\n    open(P(), 'w')\n",
                        "sandbox-violation", "for writing"),
    # ----- threads ------------------------------------------------------------------------------------
    "thread_acts": ("import threading, time\ndef work():\n    open(__file__).read()\n"
                    "def main():\n    t = threading.Thread(target=work)\n    t.start()\n    t.join()\n    time.sleep(0.5)\n",
                    "background-thread", ""),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_is_killed(tmp_path, name):
    source, rule, fragment = ATTACKS[name]
    expect_kill(tmp_path, source, rule, fragment)


def test_load_phase_may_run_processes_and_write_scratch(tmp_path):
    """What load_inline needs: subprocesses at import, writes and renames inside scratch."""
    expect_pass(tmp_path, """
        import os, subprocess, tempfile
        subprocess.run(["true"], check=True)
        os.makedirs("build/sub", exist_ok=True)
        with open("build/sub/a.txt", "w") as f:
            f.write("x")
        os.replace("build/sub/a.txt", "build/sub/b.txt")
        os.remove("build/sub/b.txt")
        def main():
            with open(os.path.join(os.getcwd(), "out.txt"), "w") as f:
                f.write("ok")
            open(__file__).read()
            open("/proc/self/status").read()
            os.listdir("/proc/self/fd")
            os.kill(os.getpid(), 0)
    """)


def test_honest_python_idioms_pass(tmp_path):
    """Stdlib helpers that look at their caller's frame for a module name, and ordinary library use."""
    expect_pass(tmp_path, """
        import collections, dataclasses, enum, functools, gc, logging, traceback, typing, warnings
        Pair = collections.namedtuple("Pair", "a b")
        T = typing.TypeVar("T")
        class NT(typing.NamedTuple):
            a: int
        Color = enum.Enum("Color", "RED GREEN")
        @dataclasses.dataclass
        class Config:
            block: int = 128
        log = logging.getLogger("candidate")
        def main():
            gc.collect()
            log.warning("a warning from the solution")
            warnings.warn("careful")
            Pair(1, 2), NT(1), Config(), Color.RED
            functools.lru_cache(maxsize=None)(lambda x: x)(3)
            try:
                raise ValueError("x")
            except ValueError:
                pass
        # tracebacks turned into text, at import and during a call: frames never reach the solution
        try:
            import not_installed_fast_path  # noqa: F401
        except ImportError:
            traceback.print_exc()
            log.exception("fast path unavailable")
        def fallback():
            try:
                raise RuntimeError("no kernel for this device")
            except RuntimeError:
                return traceback.format_exc() + "".join(traceback.format_stack())
        fallback()
        log.error("where", stack_info=True)
        _main = main
        def main():
            _main()
            fallback()
            log.error("where", stack_info=True)
    """)


def test_honest_pure_torch_solution_passes(tmp_path):
    source = (REPO / "tests" / "adversarial" / "honest_softmax_torch.py").read_text()
    output = expect_pass(tmp_path, source, use_torch=True)
    assert "CHANGES [] []" in output


@pytest.mark.slow
def test_forward_pre_hook_indirection_is_killed(tmp_path):
    """A C callable as a forward pre-hook runs from torch's frame, not the solution's: still caught."""
    expect_kill(tmp_path, """
        import gc, torch
        class ModelNew(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_forward_pre_hook(gc.get_referrers)
            def forward(self, found):
                return torch.zeros(4, 16)
    """, "introspection", "gc.get_referrers", use_torch=True)


@pytest.mark.slow
def test_snapshot_sees_super_shadowing(tmp_path):
    """Writes into a module dict raise no audit event: the snapshot finds them at the checkpoint."""
    code, report, output = run_case(tmp_path, """
        import torch, torch.cuda.streams as streams
        streams.super = lambda *a: None
        class ModelNew(torch.nn.Module):
            def forward(self, x):
                return x * 1
    """, use_torch=True)
    assert code == 0 and not report, output[-2000:]
    assert "torch.cuda.streams.super was added" in output


def test_active_modes_sees_a_mode_left_on(tmp_path):
    code, report, output = run_case(tmp_path, """
        import torch
        from torch.overrides import TorchFunctionMode
        class Spy(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))
        class ModelNew(torch.nn.Module):
            def forward(self, x):
                Spy().__enter__()
                return x * 1
    """, use_torch=True)
    assert code == 0 and not report, output[-2000:]
    assert "function mode candidate.Spy" in output or "function mode solution_under_test.Spy" in output


@pytest.mark.slow
def test_load_inline_build_and_run_pass(tmp_path):
    """torch's own build path (cpp_extension, setuptools, ninja and c++ subprocesses, importlib loading
    the built .so, logging, warnings) under the guard: nothing flagged, nothing in the snapshot."""
    ext = tmp_path / "scratch" / "extensions"
    output = expect_pass(tmp_path, """
        import torch
        import torch.nn as nn
        from torch.utils.cpp_extension import load_inline

        _src = r'''
        #include <torch/extension.h>
        torch::Tensor twice(torch::Tensor x) { return x * 2; }
        '''
        _ext = load_inline(name="guard_test_twice", cpp_sources=_src, functions=["twice"], verbose=False)

        class ModelNew(nn.Module):
            def forward(self, x):
                return _ext.twice(x)
    """, use_torch=True, timeout=600, env={"TORCH_EXTENSIONS_DIR": str(ext), "MAX_JOBS": "2"})
    assert "CHANGES [] []" in output
    assert list(ext.rglob("*.so"))


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["softmax/simple.py", "softmax/register_rows.py"])
def test_cuda_solution_build_run_and_profile_pass(tmp_path, name):
    """A shipped CUDA solution: nvcc build at import, forward on the GPU, CUDA events, the profiler. The
    solutions' shared header goes where a solution looks for it (the folder above its own), readable as the
    harness makes it."""
    ext = tmp_path / "scratch" / "extensions"
    header = tmp_path / "_ptx.cuh"
    header.write_text((REPO / "solutions" / "_ptx.cuh").read_text())
    output = expect_pass(tmp_path, (REPO / "solutions" / name).read_text(), use_torch=True, timeout=900,
                         env={"TORCH_EXTENSIONS_DIR": str(ext), "GUARD_TEST_DEVICE": "cuda", "TORCH_CUDA_ARCH_LIST": "9.0",
                              "GUARD_TEST_READABLE": str(header)})
    assert "CHANGES [] []" in output and "PROFILE" in output


# ----- the guard's own hygiene ----------------------------------------------------------------------------
def _nested_codes(code):
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield const
            yield from _nested_codes(const)


@pytest.mark.parametrize("function", [guard.install, guard._checker, guard.DispatchTables.__init__, guard.AtenKernels.__init__,
                                      guard.ThreadDispatchKeys.__init__, guard.seal_torch_library,
                                      guard.seal_profiler, guard.seal_direct_calls, guard.seal_fusers, guard._refusal,
                                      profiling._make_trace, profiling.make_op_trace,
                                      profiling.traced_ops])
def test_closures_look_up_no_global_or_builtin(function):
    """A solution can rewrite any module dict (builtins included); the hook and the snapshot check must
    not look anything up there at run time."""
    bad = []
    for code in _nested_codes(function.__code__):
        for instruction in dis.get_instructions(code):
            if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                bad.append(f"{code.co_name}: {instruction.argval}")
    assert not bad, bad


def test_dispatch_checks_see_kernels_fallbacks_and_switched_keys():
    """What a solution can do to the dispatcher from Python, each seen by one check: a kernel for an aten op the
    harness never runs (AtenKernels), a backend fallback that the harness's own ops would reach once its key is
    switched on (DispatchTables' computed tables), and that key left on in the thread (ThreadDispatchKeys). In a
    subprocess: a registration outlives the test."""
    code = textwrap.dedent("""
        import torch
        from harness import guard
        aten, tables, keys = guard.AtenKernels(), guard.DispatchTables(), guard.ThreadDispatchKeys()
        assert aten.changes() == tables.changes() == keys.changes() == []
        kernels = torch.library.Library("aten", "IMPL")
        kernels.impl("erfinv", lambda x: x, "AutogradCPU")
        print("ATEN", aten.changes())
        fallbacks = torch.library.Library("_", "IMPL")
        fallbacks.fallback(lambda op, keys, *a, **k: op.redispatch(keys, *a, **k), dispatch_key="PrivateUse3", with_keyset=True)
        print("TABLES", tables.changes())
        torch._C._dispatch_tls_set_dispatch_key_included(torch._C.DispatchKey.PrivateUse3, True)
        print("KEYS", keys.changes())
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if line.split(" ", 1)[0] in ("ATEN", "TABLES", "KEYS"))
    assert "aten::erfinv (AutogradCPU)" in lines["ATEN"]
    assert "aten::set_.source_Storage_storage_offset" in lines["TABLES"]
    assert "PrivateUse3" in lines["KEYS"]


def test_snapshot_changes_and_cost():
    import torch  # noqa: F401
    import torch.cuda.streams as streams
    import harness.timing as timing

    snapshot = guard.ModuleSnapshot()
    start = time.perf_counter()
    for _ in range(5):
        assert snapshot.changes() == []
    per_check = (time.perf_counter() - start) / 5
    assert per_check < 0.1, per_check
    streams.super = lambda *a: None
    original = timing.make_timer if hasattr(timing, "make_timer") else timing.time_calls
    name = original.__name__
    setattr(timing, name, lambda *a: None)
    original_elapsed = torch.cuda.Event.elapsed_time
    torch.cuda.Event.elapsed_time = lambda self, end: 1e-3
    hook = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: None)
    try:
        found = snapshot.changes()
    finally:
        del streams.super
        setattr(timing, name, original)
        torch.cuda.Event.elapsed_time = original_elapsed
        hook.remove()
    assert "torch.cuda.streams.super was added" in found
    assert f"harness.timing.{name} was replaced" in found
    assert any("Event.elapsed_time was replaced" in f for f in found), found
    assert "torch.nn.modules.module._global_forward_pre_hooks was changed" in found
    assert snapshot.changes() == []


def test_snapshot_ignores_submodule_imports_and_warning_registries():
    import importlib
    import warnings

    import torch

    snapshot = guard.ModuleSnapshot()
    for candidate in ("torch.utils.bottleneck", "torch.utils.show_pickle", "torch.utils.jit.log_extract", "torch.utils.bundled_inputs"):
        if candidate not in sys.modules:
            try:
                importlib.import_module(candidate)
            except Exception:  # noqa: BLE001
                continue
            break
    functional = vars(torch.nn.functional)
    had = "__warningregistry__" in functional
    functional.setdefault("__warningregistry__", {"version": 0})  # what a warning attributed to torch leaves
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            torch.ones(2).softmax(0)
        assert snapshot.changes() == []
    finally:
        if not had:
            del functional["__warningregistry__"]
    assert guard.active_modes() == []


def test_lazy_import_of_a_trusted_module_during_a_call_passes(tmp_path):
    """torch imports modules lazily inside calls (the profiler, on torch 2.11); their top-level code may
    look at frames (typing_extensions' TypeVar) while the solution runs. The module's own top level owns
    the event; the same call from the solution's code is still the solution's."""
    (tmp_path / "driver").mkdir(exist_ok=True)
    (tmp_path / "driver" / "trusted_helper.py").write_text("import sys\nCALLER = sys._getframe(0).f_code.co_name\n")
    expect_pass(tmp_path, f"""
        import importlib, sys
        def main():
            sys.path.insert(0, {str(tmp_path / "driver")!r})
            import trusted_helper
            for name in ("xml.dom.minidom", "email.message"):  # not typing_extensions: a consumer's module counts
                sys.modules.pop(name, None)                      # as imported when the guard was installed
                importlib.import_module(name)
            import typing_extensions
            T = typing_extensions.TypeVar("T")
            sys.modules.pop("email.message", None)
            importlib.import_module("email.message")  # again (the child writes no bytecode: from source again)
    """)


@pytest.mark.slow
def test_frame_evaluation_hook_is_out_of_reach(tmp_path):
    """torch's PEP 523 hook would hand the solution every frame (the guard's closure cells included) with
    no audit event: sealed before the solution exists, every copy of the setter refuses."""
    code, report, output = run_case(tmp_path, """
        import sys, torch
        names = ("torch._C._dynamo.eval_frame", "torch._dynamo.eval_frame", "torch._dynamo.decorators")
        refused = []
        for name in names:
            module = sys.modules.get(name)
            setter = getattr(module, "set_" + "eval_frame", None)
            if setter is None:
                continue
            try:
                setter(lambda *a: None)
            except Exception as error:  # the harness's own Failure, rule "introspection"
                refused.append(name)
        print("REFUSED", refused)
        class ModelNew(torch.nn.Module):
            def forward(self, x):
                return x * 1
    """, use_torch=True)
    assert code == 0 and not report, output[-2000:]
    assert "REFUSED ['torch._C._dynamo.eval_frame', 'torch._dynamo.eval_frame'" in output
    assert "CHANGES [] []" in output


def test_finalizer_during_the_guards_own_frame_walk_is_judged(tmp_path):
    """Cyclic garbage whose __del__ reads frames, collected as often as possible while the guard walks
    frames: the walk runs with the cyclic GC off, so __del__ never runs unjudged inside it."""
    expect_kill(tmp_path, """
        import gc, sys
        class Bomb:
            def __init__(self):
                self.me = self
            def __del__(self):
                sys._getframe(1)
        def main():
            gc.set_threshold(1, 1, 1)
            for _ in range(2000):
                Bomb()
                open("/proc/self/status").close()
    """, "introspection", "sys._getframe")


def test_own_kernels_are_those_the_solution_declares():
    """Which GPU kernels are the solution's: a deny-list of library names let cub's, cuFFT's and jiterator's
    kernels (no at:: in their names) count as its own. Where the sources declare kernels, only those count."""
    source = textwrap.dedent('''
        cuda_src = r"""
        template <int N> __global__ void __launch_bounds__(256) rows_kernel(const float* x) {}
        __global__ void
        finish(float* y, int n) {}
        """
        @triton.jit
        def tri_kernel(x_ptr):
            pass
    ''')
    assert profiling.declared_kernels(source) == {"rows_kernel", "finish", "tri_kernel"}
    assert profiling.declared_kernels("import torch\n") == frozenset()
    assert profiling.declared_kernels("@triton.autotune(configs=[])\n@triton.jit\n\ndef tuned(x):\n    pass\n") == {"tuned"}
    rows = [("void rows_kernel<4>(float const*)", True, 3000), ("void at_cuda_detail::cub::DeviceScanKernel<int>(int*)", True, 5000),
            ("void at::native::vectorized_elementwise_kernel<4, rows_kernel>(int)", True, 1000), ("aten::cumsum", False, 9000)]
    mine = profiling.kernel_summary(rows, own_names=frozenset({"rows_kernel", "finish"}))
    assert mine["own_kernels"] == 1 and abs(mine["own_share"] - 3 / 9) < 1e-9
    anyone = profiling.kernel_summary(rows)  # no declared kernels (macros, CUTLASS): the library's names decide
    assert anyone["own_kernels"] == 2


def test_finding_declared_kernels_takes_linear_time():
    """The parent reads a solution's declared kernels while the target before it runs (Run.start_ahead builds the
    next target's spec): 200,000 decorator lines with no def after them held the parent for minutes (a red-team
    find), and as many `__global__` with no body would each have been searched 2,000 characters on."""
    import time

    for source in ("@triton.jit\n" * 200_000, "x = '" + "__global__ " * 200_000 + "'\n"):
        start = time.perf_counter()
        profiling.declared_kernels(source)
        assert time.perf_counter() - start < 2.0
