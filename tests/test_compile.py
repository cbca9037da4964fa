"""Every shipped solution imports the way the harness imports it, on a machine without a GPU: one that
builds an extension builds it (nvcc for sm_90, cached under .build/); a pure-PyTorch one builds nothing
and is held to nothing more than importing and defining ModelNew."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.problem import discover_solutions

REPO = Path(__file__).resolve().parents[1]
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
SHIPPED = [(p, path) for p in ("softmax", "cross_entropy", "infonce") for path in discover_solutions(p)]

pytestmark = [pytest.mark.compile,
              pytest.mark.skipif(not Path(CUDA_HOME, "bin", "nvcc").exists() and not shutil.which("nvcc"), reason="needs nvcc")]


def _bundled_cuda_includes() -> str:
    """torch's pip wheels carry CUDA headers (cusparse.h, ...) that a bare toolkit may lack."""
    found = []
    for entry in sys.path:
        candidate = Path(entry, "nvidia")
        if candidate.is_dir():
            found += [str(p) for p in sorted(candidate.glob("*/include")) if p.is_dir()]
    return os.pathsep.join(found)


@pytest.mark.parametrize("problem, path", SHIPPED, ids=[f"{p}/{path.name}" for p, path in SHIPPED])
def test_solution_compiles_for_sm90(problem, path):
    env = dict(os.environ, CUDA_HOME=CUDA_HOME, TORCH_CUDA_ARCH_LIST="9.0", MAX_JOBS="2")
    env["CPATH"] = os.pathsep.join(filter(None, [env.get("CPATH", ""), _bundled_cuda_includes()]))
    code = ("import sys, torch\nsys.path.insert(0, %r)\nfrom harness import build\nfrom harness.problem import load_module\n"
            "from pathlib import Path\np = Path(%r)\nbuild.prepare_build_env(p, %r)\nm = load_module(p, 'solution_under_test')\n"
            "assert isinstance(m.ModelNew, type)\nprint('built', build.built_libraries(build.extension_dir(p, %r)))\n") % (str(REPO), str(path), problem, problem)
    env["TORCH_CUDA_ARCH_LIST"] = "9.0"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    if "load_inline" in path.read_text() or "cpp_extension" in path.read_text():
        assert ".so" in result.stdout, result.stdout[-2000:]
