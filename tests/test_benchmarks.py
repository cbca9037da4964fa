"""The benchmark scripts run only on a GPU machine, where a typo costs device time: each must at least
parse (Python) or pass `bash -n` (the GPU steps script) here, and the standalone nvcc bench must build."""
import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_benchmark_script_parses(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    assert ast.get_docstring(tree), f"{path.name} says what it measures in a module docstring"


def test_only_the_lab_module_imports_the_harness():
    """One lab API: when the harness changes, benchmarks/lab.py is the one file to follow it."""
    importers = [p.name for p in BENCH.glob("*.py") if p.name != "lab.py"
                 and any(isinstance(n, (ast.Import, ast.ImportFrom)) and "harness" in (getattr(n, "module", "") or "") + " ".join(a.name for a in n.names)
                         for n in ast.walk(ast.parse(p.read_text())))]
    assert importers == []


@pytest.mark.slow
def test_the_lab_check_runs_on_the_cpu():
    result = subprocess.run([sys.executable, str(BENCH / "check.py"), "softmax", "--device", "cpu", "--quick", "--shape", "tiny"],
                            capture_output=True, text=True, timeout=600, cwd=BENCH.parent)
    assert result.returncode == 0 and "ALL CORRECT" in result.stdout, (result.stdout + result.stderr)[-2000:]


def test_gpu_steps_script_is_valid_bash():
    result = subprocess.run(["bash", "-n", str(BENCH / "gpu_steps.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


STANDALONE = BENCH / "standalone"


def test_extract_src_writes_the_shipped_device_code(tmp_path):
    """The standalone benches compile a shipped solution's own kernel string: the extractor must hand over
    that string exactly (device code, no torch headers), or fail loudly on a file without one."""
    out = tmp_path / "ce.cuh"
    solution = BENCH.parent / "solutions" / "cross_entropy" / "tma_pieces.py"
    subprocess.run([sys.executable, str(STANDALONE / "extract_src.py"), str(solution), str(out)], check=True)
    text = out.read_text()
    assert "ce_v3_pieces_kernel" in text and "namespace ce_v3" in text
    assert "torch/extension.h" not in text
    # The shared PTX helpers the solution reads by path come first, as in its build.
    assert text.startswith((BENCH.parent / "solutions" / "_ptx.cuh").read_text())

    # Several strings, concatenated in the order named.
    two = tmp_path / "two.py"
    two.write_text('_first = "struct A {};\\n"\n_second = r"""__global__ void k() {}\n"""\n')
    out = tmp_path / "two.cuh"
    subprocess.run([sys.executable, str(STANDALONE / "extract_src.py"), str(two), str(out), "_first", "_second"], check=True)
    assert out.read_text() == "struct A {};\n__global__ void k() {}\n"
    out = tmp_path / "softmax.cuh"
    solution = BENCH.parent / "solutions" / "softmax" / "register_rows.py"
    subprocess.run([sys.executable, str(STANDALONE / "extract_src.py"), str(solution), str(out), "_device_src"], check=True)
    text = out.read_text()
    assert "softmax_seg_kernel" in text and "softmax_v4_kernel" in text and "torch/extension.h" not in text

    no_kernel = tmp_path / "plain.py"
    no_kernel.write_text("x = 1\n")
    result = subprocess.run([sys.executable, str(STANDALONE / "extract_src.py"), str(no_kernel), str(tmp_path / "o")],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "no _kernel_src" in result.stderr


def _spills_by_function(ptxas_report: str) -> dict:
    """ptxas -v output -> {entry-function line: True if it, or a device function listed under it, spilled}."""
    spilled, func = {}, "(before any entry function)"
    for line in ptxas_report.splitlines():
        if "Compiling entry function" in line:
            func = line
        elif "spill stores" in line:
            spilled[func] = spilled.get(func, False) or " 0 bytes spill stores" not in line
    return spilled


def _nvcc():
    return shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


@pytest.mark.compile
@pytest.mark.skipif(_nvcc() is None, reason="nvcc not installed")
def test_standalone_bench_builds_against_the_shipped_kernel(tmp_path):
    """Device time is scarce: the binaries carried to the GPU must build here, from today's shipped
    sources, with no register spills in the kernels the solutions choose."""
    result = subprocess.run(["bash", str(STANDALONE / "build.sh"), str(tmp_path)], capture_output=True, text=True,
                            env={**os.environ, "NVCC": _nvcc()})
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "ce_stream").stat().st_size > 0
    spilled = _spills_by_function((tmp_path / "ce_stream.ptxas.txt").read_text())
    assert any("ce_v3_pieces_kernel" in f for f in spilled)
    assert not any(spilled.values()), [f for f, s in spilled.items() if s]

    # softmax: register_rows's automatic choices must not spill (a spilled segment loses its loads in flight:
    # about 2x, docs/perf-notes/softmax.md). Older variants that the bench times beside them may.
    assert (tmp_path / "softmax_regs").stat().st_size > 0
    spilled = _spills_by_function((tmp_path / "softmax_regs.ptxas.txt").read_text())
    autos = ["softmax_seg_kernelIfLi128ELi36ELi3E",  # 37: fp32 rows > 64 KB
             "softmax_seg_kernelI13__nv_bfloat16Li128ELi12ELi4E",  # 43: bf16 rows > 64 KB
             "softmax_v4_kernelIfLi512ELi8ELi2ELb0E",  # fp32 16384
             "softmax_v4_kernelI13__nv_bfloat16Li1024ELi4ELi2ELb1E",  # bf16 32768
             "softmax_v4_kernelI13__nv_bfloat16Li32ELi16ELi24ELb1E"]  # bf16 4096
    for name in autos:
        found = [f for f in spilled if name in f]
        assert found, f"{name} is not in the softmax bench"
        assert not any(spilled[f] for f in found), f"{name} spills"

    # infonce: wgmma_fused's kernels (TMA-fed 128x40 and 128x128 tiles, the 3xFP16 K-split pairs of the seed
    # shape) must neither spill nor let ptxas serialise their
    # wgmma (it does so, with a "serialized" note, when registers feeding a wgmma are written in a divergent path or
    # the wgmma pipeline lacks registers: several times slower).
    text = (tmp_path / "infonce_bench.ptxas.txt").read_text()
    spilled = _spills_by_function(text)
    for name in ["infonce_wgmma_kernelILi40ELi4EE", "infonce_wgmma_kernelILi128ELi3EE", "infonce_wgmma_bres_kernelILi80ELi4ELi1ELi2EE"]:
        found = [f for f in spilled if name in f]
        assert found, f"{name} is not in the infonce bench"
        assert not any(spilled[f] for f in found), f"{name} spills"
    assert "serialized" not in text
