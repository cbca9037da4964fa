"""The benchmark scripts run only on a GPU machine, where a typo costs device time: each must at least
parse (Python) or pass `bash -n` (the session script) here."""
import ast
import subprocess
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_benchmark_script_parses(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    assert ast.get_docstring(tree), f"{path.name} says what it measures in a module docstring"


def test_device_session_script_is_valid_bash():
    result = subprocess.run(["bash", "-n", str(BENCH / "device_session.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
