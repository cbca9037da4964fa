"""harness/scaffold.py: `make new PROBLEM=p NAME=n` writes a solution file that parses, defines ModelNew,
builds under an extension name of its own, and says what it must compute. Everything but the compile test
runs on the CPU without building anything."""
import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.problem import ProblemError, find_problem
from harness.scaffold import new_solution
from harness.scan import scan_source, scan_violations

REPO = Path(__file__).resolve().parents[1]
PROBLEMS = ("softmax", "cross_entropy", "infonce")
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")


def _solutions_with_simple(tmp_path: Path, problem: str) -> Path:
    """A solutions folder holding only the problem's shipped simple.py."""
    folder = tmp_path / "solutions" / problem
    folder.mkdir(parents=True)
    shutil.copy(REPO / "solutions" / problem / "simple.py", folder / "simple.py")
    return tmp_path / "solutions"


def _extension_names(path: Path) -> list:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "load_inline":
            names += [kw.value.value for kw in node.keywords if kw.arg == "name"]
    return names


def _below_docstring(path: Path) -> str:
    text = path.read_text()
    first = ast.parse(text).body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    return "".join(text.splitlines(keepends=True)[first.end_lineno:]) if docstring else text


def _classes(path: Path) -> set:
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)}


@pytest.mark.parametrize("problem_name", PROBLEMS)
def test_started_from_simple(tmp_path, problem_name):
    problem = find_problem(problem_name)
    root = _solutions_with_simple(tmp_path, problem_name)
    path = new_solution(problem, "mine", root)
    assert path == root / problem_name / "mine.py" and path.is_file()
    assert "ModelNew" in _classes(path)
    ours, theirs = _extension_names(path), _extension_names(root / problem_name / "simple.py")
    assert ours == [f"{problem_name}_mine"] and not set(ours) & set(theirs)
    header = " ".join(ast.get_docstring(ast.parse(path.read_text())).split())
    assert "started from simple.py" in header
    assert problem.description in header
    assert f"make eval PROBLEM={problem_name} SOLUTION=" in header and "mine.py" in header
    assert "rel_l2" in header and "_cuda_src" in header
    # The code below the header is simple.py's, but for the extension's name.
    simple = _below_docstring(root / problem_name / "simple.py")
    assert _below_docstring(path).strip() == simple.replace(f'"{theirs[0]}"', f'"{ours[0]}"').strip()
    assert scan_violations(path) == [] and scan_source(path, problem.reference_ops) == []


@pytest.mark.parametrize("problem_name", PROBLEMS)
def test_generic_template_without_simple(tmp_path, problem_name):
    problem = find_problem(problem_name)
    path = new_solution(problem, "fresh", tmp_path)
    tree = ast.parse(path.read_text())
    assert "ModelNew" in _classes(path) and _extension_names(path) == [f"{problem_name}_fresh"]
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew")
    forward = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    assert isinstance(forward.body[-1], ast.Raise) and "NotImplementedError" in ast.unparse(forward.body[-1])
    header = " ".join(ast.get_docstring(tree).split())
    assert "NotImplementedError" in header and "no simple.py" in header and "TODO" in path.read_text()
    for constant in problem.shared_constants:  # InfoNCE's TEMPERATURE: the harness sets it on the module
        assert any(isinstance(n, ast.Assign) and n.targets[0].id == constant for n in tree.body if isinstance(n, ast.Assign))
    assert scan_violations(path) == []


def test_existing_file_refused(tmp_path):
    problem = find_problem("softmax")
    root = _solutions_with_simple(tmp_path, "softmax")
    first = new_solution(problem, "mine", root)
    before = first.read_text()
    with pytest.raises(ProblemError, match="exists"):
        new_solution(problem, "mine", root)
    with pytest.raises(ProblemError, match="exists"):
        new_solution(problem, "simple", root)
    assert first.read_text() == before


@pytest.mark.parametrize("name", ["", "_private", "mine.py", "1st", "my-kernel", "with space", "a/b", "../up", "class",
                                  "é", "x" * 65])
def test_bad_names_refused(tmp_path, name):
    with pytest.raises(ProblemError) as error:
        new_solution(find_problem("softmax"), name, tmp_path)
    assert "\n" not in str(error.value)
    assert not list(tmp_path.rglob("*.py"))


def test_extension_name_never_collides(tmp_path):
    """A name whose extension another file of the problem already builds gets a suffix."""
    problem = find_problem("softmax")
    root = _solutions_with_simple(tmp_path, "softmax")
    taken = new_solution(problem, "mine", root)
    (root / "softmax" / "other.py").write_text(taken.read_text().replace('"softmax_mine"', '"softmax_again"'))
    again = new_solution(problem, "again", root)
    assert _extension_names(again) == ["softmax_again_2"]


def test_every_extension_of_the_starter_is_renamed(tmp_path):
    """A simple.py that builds two extensions: both get names of the new file's own, in source order."""
    folder = tmp_path / "softmax"
    folder.mkdir()
    (folder / "simple.py").write_text(
        '"""Two extensions."""\nfrom torch.utils.cpp_extension import load_inline\n'
        'a = load_inline(name="first_ext", cpp_sources="", functions=[])\n'
        'b = load_inline(cpp_sources="", name="second_ext", functions=[])\n'
        'class ModelNew:\n    pass\n')
    path = new_solution(find_problem("softmax"), "mine", tmp_path)
    assert _extension_names(path) == ["softmax_mine", "softmax_mine_2"]


@pytest.mark.compile
@pytest.mark.skipif(not Path(CUDA_HOME, "bin", "nvcc").exists() and not shutil.which("nvcc"), reason="needs nvcc")
def test_softmax_scaffold_builds(tmp_path):
    """The scaffold builds with load_inline for sm_90, in its own folder, as the harness imports it."""
    path = new_solution(find_problem("softmax"), "mine", _solutions_with_simple(tmp_path, "softmax"))
    includes = [str(p) for entry in sys.path if Path(entry, "nvidia").is_dir() for p in sorted(Path(entry, "nvidia").glob("*/include"))]
    env = dict(os.environ, CUDA_HOME=CUDA_HOME, TORCH_CUDA_ARCH_LIST="9.0", MAX_JOBS="2", HARNESS_BUILD_DIR=str(tmp_path / "build"),
               CPATH=os.pathsep.join(filter(None, [os.environ.get("CPATH", ""), *includes])))
    code = ("import sys\nfrom pathlib import Path\nfrom harness import build\nfrom harness.problem import load_module\n"
            f"p = Path({str(path)!r})\nbuild.prepare_build_env(p, 'softmax')\nm = load_module(p, 'scaffold_under_test')\n"
            "assert isinstance(m.ModelNew, type)\nprint('built', list(build.built_libraries(build.extension_dir(p, 'softmax'))))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "softmax_mine" in result.stdout and ".so" in result.stdout
