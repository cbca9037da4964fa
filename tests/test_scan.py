"""The static scan points at suspicious code, not at prose about it; its findings are warnings only."""
from pathlib import Path

import pytest

from harness.scan import needs_cuda, scan_source, scan_violations


def test_scan_flags_code_but_not_comments_or_docstrings(tmp_path):
    path = tmp_path / "s.py"
    path.write_text('"""Never uses torch.cuda.Stream or gc.get_objects."""\n'
                    "import torch  # threading is not used either\n"
                    "s = torch.cuda.Stream()\n"
                    "def f(x):\n    '''torch.softmax would be cheating.'''\n    return torch.softmax(x, -1)\n")
    warnings = scan_source(path, ["torch.softmax"])
    assert any(w.startswith("line 3: uses its own CUDA stream") for w in warnings)
    assert any(w.startswith("line 6: calls torch.softmax") for w in warnings)
    assert not any("gc" in w or "threads" in w for w in warnings)
    assert "builds no CUDA extension (no load_inline)" in warnings and not needs_cuda(path)


@pytest.mark.slow
def test_warnings_alone_never_reject(tmp_path):
    from conftest import evaluate, write_solution

    source = ('import gc, threading, torch\n'
              'class ModelNew(torch.nn.Module):\n    def forward(self, x):\n'
              '        gc.collect()\n        e = (x.float() - x.float().amax(-1, keepdim=True)).exp()\n'
              '        return (e / e.sum(-1, keepdim=True)).to(x.dtype)\n')
    record = evaluate("softmax", write_solution(tmp_path, source), tmp_path, device="cpu")
    assert record["status"] == "ok" and any("gc" in w for w in record["warnings"])


# ----- violations: code honest solutions never contain rejects the solution ----------------------------------

REPO = Path(__file__).resolve().parent.parent
HONEST = sorted(REPO.glob("solutions/*/*.py")) + sorted(REPO.glob("tests/adversarial/honest_*.py"))


@pytest.mark.parametrize("path", HONEST, ids=[str(p.relative_to(REPO)) for p in HONEST])
def test_honest_files_have_no_violations(path):
    assert scan_violations(path) == []


def _violations(tmp_path, source, name="candidate.py"):
    path = tmp_path / name
    path.write_text(source)
    return scan_violations(path)


FORBIDDEN = {
    "getframe": ("import sys\nf = sys._getframe(1)\n", "introspection", 2),
    "getframe_from_import": ("from sys import _getframe\n", "introspection", 1),
    "getframe_by_name": ("import sys\nf = getattr(sys, '_getframe')(1)\n", "introspection", 2),
    "current_frames": ("import sys\nx = sys._current_frames()\n", "introspection", 2),
    "settrace": ("import threading\nthreading.settrace(print)\n", "introspection", 2),
    "setprofile": ("import sys\nsys.setprofile(print)\n", "introspection", 2),
    "import_inspect": ("import torch\nimport inspect\n", "introspection", 2),
    "from_inspect": ("from inspect import stack\n", "introspection", 1),
    "f_back": ("def f(frame):\n    return frame.f_back\n", "introspection", 2),
    "f_locals": ("def f(frame):\n    return frame.f_locals\n", "introspection", 2),
    "tb_frame": ("try:\n    1 / 0\nexcept Exception as e:\n    f = e.__traceback__.tb_frame\n", "introspection", 4),
    "gi_frame": ("g = (i for i in [])\nf = g.gi_frame\n", "introspection", 2),
    "closure": ("def f(g):\n    return g.__closure__[0].cell_contents\n", "introspection", 2),
    "code": ("def f(g):\n    return g.__code__\n", "introspection", 2),
    "globals_attr": ("def f(g):\n    return g.__globals__\n", "introspection", 2),
    "gc_get_objects": ("import gc\nobjs = gc.get_objects()\n", "introspection", 2),
    "gc_get_referrers": ("import gc\nx = gc.get_referrers(1)\n", "introspection", 2),
    "gc_callbacks": ("import gc\ngc.callbacks.append(print)\n", "introspection", 2),
    "ctypes": ("import ctypes\n", "introspection", 1),
    "cffi": ("from cffi import FFI\n", "introspection", 1),
    "proc_string": ("data = open('/proc/self/maps').read()\n", "introspection", 1),
    "proc_double_slash": ("path = '/proc//self/mem'\n", "introspection", 1),
    "exec": ("exec('x = 1')\n", "introspection", 1),
    "eval": ("y = eval('1 + 1')\n", "introspection", 1),
    "compile_builtin": ("code = compile('1', '<s>', 'eval')\n", "introspection", 1),
    "exec_alias": ("run = exec\n", "introspection", 1),
    "dunder_import": ("m = __import__('os')\n", "introspection", 1),
    "import_harness": ("import harness.timing\n", "introspection", 1),
    "from_harness": ("from harness import timing\n", "introspection", 1),
    "import_module_harness": ("import importlib\nm = importlib.import_module('harness.timing')\n", "introspection", 2),
    "patch_torch": ("import torch\ntorch.allclose = lambda *a, **k: True\n", "introspection", 2),
    "patch_torch_class": ("import torch\ntorch.cuda.Event.elapsed_time = lambda s, e: 1e-3\n", "introspection", 2),
    "patch_alias": ("import torch.nn.functional as F\nF.softmax = None\n", "introspection", 2),
    "patch_imported_class": ("from torch.cuda import Event\nEvent.elapsed_time = None\n", "introspection", 2),
    "patch_through_variable": ("import torch\nE = torch.cuda.Event\nE.elapsed_time = None\n", "introspection", 3),
    "patch_time": ("import time\ntime.perf_counter = lambda: 0.0\n", "introspection", 2),
    "setattr_torch": ("import torch\nsetattr(torch.cuda, 'synchronize', print)\n", "introspection", 2),
    "delattr_torch": ("import torch\ndelattr(torch, 'allclose')\n", "introspection", 2),
    "module_dict": ("import torch.cuda.streams as s\ns.__dict__['super'] = None\n", "introspection", 2),
    "vars_module": ("import torch.cuda.streams as s\nvars(s)['super'] = None\n", "introspection", 2),
    "sys_modules_write": ("import sys\nsys.modules['torch'] = None\n", "introspection", 2),
    "builtins_write": ("import builtins\nbuiltins.print = None\n", "introspection", 2),
    "rewrite_class": ("class A: pass\na = A()\na.__class__ = int\n", "introspection", 3),
    "tf32_on": ("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n", "introspection", 2),
    "torch_compile": ("import torch\nf = torch.compile(lambda x: x)\n", "introspection", 2),
    "matmul_precision_high": ("import torch\ntorch.set_float32_matmul_precision('high')\n", "introspection", 2),
    "system_in_code": ('src = """\nvoid go() {\n    int r = std::system("ls");\n}\n"""\n', "sandbox-violation", 1),
    "cudnn_flag_variable": ("import torch\nflag = True\ntorch.backends.cudnn.benchmark = flag\n", "introspection", 3),
    "disable_modes": ("from torch.utils._python_dispatch import _disable_current_modes\n", "introspection", 1),
    "disable_dispatch": ("import torch\nwith torch._C._DisableTorchDispatch():\n    pass\n", "introspection", 2),
    "disable_function": ("import torch\nwith torch._C.DisableTorchFunction():\n    pass\n", "introspection", 2),
    "pop_mode": ("from torch.utils._python_dispatch import _pop_mode\n", "introspection", 1),
    "dispatch_mode_subclass": ("from torch.utils._python_dispatch import TorchDispatchMode\nclass M(TorchDispatchMode): pass\n",
                               "introspection", 1),
    "function_mode_subclass": ("import torch.overrides\nclass M(torch.overrides.TorchFunctionMode): pass\n", "introspection", 2),
    "meta_path": ("import sys\nsys.meta_path.insert(0, object())\n", "introspection", 2),
    "from_file": ("import torch\nt = torch.from_file('/etc/passwd', size=4)\n", "introspection", 2),
    "native_frame": ('src = """\n#include <torch/extension.h>\nvoid f() { auto *fr = PyEval_GetFrame(); }\n"""\n', "introspection", 1),
    "native_import": ('src = "auto gc = py::module_::import(\\"gc\\");"\n', "introspection", 1),
    "native_thread": ('src = "void go() { std::thread t([]{}); t.detach(); }"\n', "background-thread", 1),
    "native_system": ('src = "void go() { system(\\"ls\\"); }"\n', "sandbox-violation", 1),
    "native_proc": ('src = "FILE* f = fopen(\\"/proc/self/mem\\", \\"r\\");"\n', "introspection", 1),
}


@pytest.mark.parametrize("name", sorted(FORBIDDEN))
def test_forbidden_code_is_a_violation(tmp_path, name):
    source, rule, line = FORBIDDEN[name]
    found = _violations(tmp_path, source)
    assert found, name
    assert found[0][0] == rule and found[0][1].startswith(f"line {line}: "), found


def test_honest_idioms_are_no_violation(tmp_path):
    source = '''"""A solution whose docstring names sys._getframe, gc.get_objects, exec and /proc/self/mem."""
import gc
import os
from pathlib import Path
from re import compile as re_compile

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# comments may name inspect.stack(), ctypes and torch.allclose = ... too
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.deterministic = False
torch.backends.cudnn.allow_tf32 = True  # cuDNN's default: changes nothing
torch.set_float32_matmul_precision("highest")
os.environ["TORCH_CUDA_ARCH_LIST"] = os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0")
os.environ.setdefault("MAX_JOBS", "4")
HERE = os.path.dirname(os.path.abspath(__file__))
_device_code = (Path(__file__).parent / "kernel.cuh").read_text() if (Path(__file__).parent / "kernel.cuh").exists() else ""
_cuda_src = r"""
// we never call PyEval_GetFrame or system() or std::thread here, and never open /proc/
#include <torch/extension.h>
/* a block comment naming dlopen and fork() */
torch::Tensor f(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "no fallback on this system (sm_90 only)");
    printf("threads: %d\\n", (int)std::thread::hardware_concurrency());
    return x;
}
"""
_NAME = re_compile(r"[a-z]+")
_HELP = "the fast path could not be built on this system (see the log)"


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 1.0
        self.eval()

    def forward(self, x):
        gc.collect()
        out = torch.empty_like(x)
        out.copy_(x)
        return out


if __name__ == "__main__":  # a self-test block: never run when the harness imports the file
    print(torch.compile(ModelNew())(torch.ones(2)))
'''
    assert _violations(tmp_path, source) == []


def test_aliased_modules_get_the_same_exemptions(tmp_path):
    source = "import torch.backends.cudnn as cudnn\nfrom os import environ as ENV\ncudnn.benchmark = True\nENV['MAX_JOBS'] = '2'\n"
    assert _violations(tmp_path, source) == []
    assert _violations(tmp_path, "import torch.cuda as cu\ncu.synchronize = print\n")


def test_device_code_beside_the_solution_is_scanned(tmp_path):
    (tmp_path / "kernel.cuh").write_text('// header\nvoid f() { PyObject* g = PyImport_ImportModule("gc"); }\n')
    source = 'from pathlib import Path\nsrc = (Path(__file__).parent / "kernel.cuh").read_text()\n'
    found = _violations(tmp_path, source)
    assert found and "in kernel.cuh" in found[0][1] and found[0][0] == "introspection"


def test_shared_device_code_at_the_solutions_root_is_the_solutions_own(tmp_path, monkeypatch):
    """A `_*.cuh` at the root of solutions/ is private code every problem's solutions may read: the sandbox
    lets them (private_files), and a solution naming it answers for it in the scan and in its code hash."""
    from harness import problem
    from harness.records import code_hash

    monkeypatch.setattr(problem, "SOLUTIONS_DIR", tmp_path / "solutions")
    folder = tmp_path / "solutions" / "softmax"
    folder.mkdir(parents=True)
    shared, beside = tmp_path / "solutions" / "_ptx.cuh", folder / "_rows.cuh"
    shared.write_text("__device__ float ex2(float x) { return x; }\n")
    beside.write_text("// rows\n")
    source = 'from pathlib import Path\nsrc = (Path(__file__).resolve().parents[1] / "_ptx.cuh").read_text()\n'
    solution = folder / "mine.py"
    solution.write_text(source)
    assert problem.private_files(solution) == sorted([shared.resolve(), beside.resolve()])
    elsewhere = tmp_path / "candidates" / "softmax" / "mine.py"  # not under solutions/: only what lies beside it
    elsewhere.parent.mkdir(parents=True)
    elsewhere.write_text(source)
    (tmp_path / "candidates" / "_secret.cuh").write_text("")
    assert problem.private_files(elsewhere) == []

    assert scan_violations(solution) == []
    before = code_hash(solution)
    solution.write_text("# a comment\n" + source)
    assert code_hash(solution) == before
    shared.write_text('void f() { PyObject* g = PyImport_ImportModule("gc"); }\n')
    assert code_hash(solution) != before
    found = scan_violations(solution)
    assert found and "in _ptx.cuh" in found[0][1] and found[0][0] == "introspection"


def test_exploits_of_the_adversarial_suite_are_violations():
    for name in ("e08_patch_elapsed_time_softmax.py", "e08_patch_perf_counter_softmax.py", "e11_frame_snoop_softmax.py",
                 "e11_gc_snoop_softmax.py", "e12_stack_sniff_softmax.py", "e08_patch_harness_softmax.py"):
        found = scan_violations(REPO / "tests" / "adversarial" / name)
        assert found and all(rule == "introspection" for rule, _ in found), name


def test_gc_collect_and_threading_import_are_warnings_only(tmp_path):
    """The meaning of test_warnings_alone_never_reject, for the static part: warnings, no violation."""
    path = tmp_path / "s.py"
    path.write_text('import gc, threading, torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n'
                    '        gc.collect()\n        return x\n')
    assert scan_violations(path) == []
    assert any("gc" in w for w in scan_source(path))


def test_the_scan_takes_linear_time_on_unclosed_comments(tmp_path):
    """A string of 400,000 unclosed "/*" made the device-code comment stripper (a regex) take quadratic time: an
    hour and more, in the parent, before any worker or timeout existed, and the whole batch stalled (red team)."""
    import time

    path = tmp_path / "bomb.py"
    path.write_text("import torch  # cuda_sources\n_blob = " + repr(" /*" * 400_000) + "\n")
    start = time.monotonic()
    scan_violations(path)
    scan_source(path, [])
    assert time.monotonic() - start < 10


def test_the_scan_and_the_code_hash_take_linear_time_on_crafted_sources(tmp_path):
    """The parent scans the next target while another runs (Run.start_ahead), and hashes every target's code: an
    unclosed C string of quotes (the literal regex went quadratic), 20,000 repeated findings (each looked up in a
    list) and 16,000 comment lines (each split the whole file twice) each held it for minutes to hours (red team)."""
    import time

    from harness.records import code_text

    sources = {"quotes.py": "import torch  # cuda_sources\n_blob = " + repr('"' + '\\"' * 100_000) + "\n",
               "findings.py": "import sys\n" + "sys._getframe()\n" * 20_000,
               "comments.py": "x = 1\n" + "# a comment\n" * 16_000}
    for name, source in sources.items():
        path = tmp_path / name
        path.write_text(source)
        start = time.monotonic()
        scan_violations(path)
        scan_source(path, [])
        code_text(source)
        assert time.monotonic() - start < 10, name
