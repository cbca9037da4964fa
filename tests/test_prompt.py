"""The LLM prompt (harness/prompt.py) and its example (harness/templates/prompt_example.py): the prompt holds the
task, the reference, every rule, the example, the shapes and the tolerances; the example is a solution file the
harness accepts (it parses, defines ModelNew, the static scan finds nothing) and builds with nvcc for sm_90."""
import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import scan
from harness.problem import find_problem, load_problem
from harness.prompt import EXAMPLE_PATH, build_prompt, example_source
from harness.rules import ALL

REPO = Path(__file__).resolve().parents[1]
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
FIXTURES = sorted((REPO / "tests" / "fixtures" / "kernelbench").glob("*.py"))
CASES = ["softmax", "cross_entropy", "infonce", *(str(p) for p in FIXTURES)]


def _problem(case: str):
    return load_problem(Path(case)) if case.endswith(".py") else find_problem(case)


def _id(case: str) -> str:
    return Path(case).stem


@pytest.fixture(scope="module")
def prompts() -> dict:
    return {case: (_problem(case), build_prompt(_problem(case))) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_prompt_holds_task_reference_rules_and_example(prompts, case):
    problem, text = prompts[case]
    assert problem.reference_path.read_text().strip() in text  # the reference, verbatim
    assert example_source().strip() in text  # the example, whole
    for rule in ALL:
        assert f"`{rule}`" in text, rule
    assert "ModelNew" in text and "load_inline" in text and "-arch" in text
    assert f"custom: {problem.custom}" in text
    for op in problem.core_aten_ops:
        assert f"aten::{op}" in text
    for module in scan.BANNED_MODULES:
        assert f"`{module}`" in text
    # the closing instruction comes last
    assert text.rstrip().endswith("no second block.")
    assert "one Python code block" in text.split("## Your answer")[-1]


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_prompt_holds_every_shape_and_tolerance(prompts, case):
    problem, text = prompts[case]
    for shape in problem.shapes:
        line = next((ln for ln in text.splitlines() if ln.startswith(f"- `{shape.name}` (")), None)
        assert line is not None, shape.name
        assert f"dtype {shape.dtype}" in line
        assert ("timing" in line) == ("timing" in shape.uses)
        for name, value in problem.constants(shape).items():
            assert f"{name}={value}" in line, (shape.name, name)
    for dtype in {s.dtype for s in problem.shapes}:
        match = re.search(rf"^- {dtype}: atol (\S+), rtol (\S+), rel_l2 (\S+)$", text, re.M)
        assert match, dtype
        expected = problem.tolerance_for(dtype)
        assert [float(v) for v in match.groups()] == pytest.approx([expected["atol"], expected["rtol"], expected["rel_l2"]])


def test_prompt_gives_tensor_sizes_and_leaves_the_module_as_it_was():
    problem = find_problem("infonce")
    before = dict(problem.module_defaults())
    text = build_prompt(problem)
    assert "query = float32[4096, 1024], positive = float32[4096, 1024], negatives = float32[65536, 1024]" in text
    assert "`TEMPERATURE = 0.1`" in text  # a shared constant the solution defines
    assert "common_mode" in text and "hard_negatives" in text and "low bits" in text
    assert {name: getattr(problem.module, name) for name in before} == before


def test_prompt_for_kernelbench_file_names_constructor_and_partial_policy():
    problem = load_problem(REPO / "tests" / "fixtures" / "kernelbench" / "5_Linear_GELU.py")
    text = build_prompt(problem)
    assert "`ModelNew(in_features, out_features)`" in text
    assert "`Model(1024, 512)`" in text and "x = float32[256, 1024]" in text and "output: float32[256, 512]" in text
    assert "custom: partial" in text and "marked partial" in text
    assert "seeded with 0" in text


def test_prompt_for_bf16_problem_gives_output_dtype():
    text = build_prompt(find_problem("cross_entropy"))
    assert "bfloat16 -> float32" in text
    assert "logits = bfloat16[4096, 128256], targets = int64[4096]" in text  # floats cast to the shape's dtype only
    assert "output: float32[] (a 0-d scalar tensor)" in text


def test_example_is_an_accepted_solution_file():
    source = example_source()
    tree = ast.parse(source)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    assert "ModelNew" in classes
    forward = next(n for n in classes["ModelNew"].body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    assert [a.arg for a in forward.args.args] == ["self", "a", "b"]
    assert ast.get_docstring(tree)
    assert scan.scan_violations(EXAMPLE_PATH) == []
    assert scan.scan_source(EXAMPLE_PATH) == []
    assert "-arch" not in source and "gencode" not in source
    # every function load_inline exports is declared in _cpp_src, and launched on the current stream
    names = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    call = names["_ext"]
    keywords = {k.arg: k.value for k in call.keywords}
    functions = [e.value for e in keywords["functions"].elts]
    cpp = names["_cpp_src"].value
    assert functions and all(f"torch::Tensor {f}(" in cpp for f in functions)
    cuda = names["_cuda_src"].value
    assert "getCurrentCUDAStream()" in cuda and "C10_CUDA_KERNEL_LAUNCH_CHECK" in cuda and "i < n" in cuda


@pytest.mark.compile
@pytest.mark.skipif(not Path(CUDA_HOME, "bin", "nvcc").exists() and not shutil.which("nvcc"), reason="needs nvcc")
def test_example_builds_for_sm90(tmp_path):
    """The example builds with load_inline for sm_90 (nothing runs it here: that needs a GPU)."""
    includes = [str(p) for entry in sys.path if Path(entry, "nvidia").is_dir() for p in sorted(Path(entry, "nvidia").glob("*/include"))]
    env = dict(os.environ, CUDA_HOME=CUDA_HOME, TORCH_CUDA_ARCH_LIST="9.0", MAX_JOBS="2", TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"),
               CPATH=os.pathsep.join(filter(None, [os.environ.get("CPATH", ""), *includes])))
    code = ("import importlib.util\n"
            f"spec = importlib.util.spec_from_file_location('prompt_example_under_test', {str(EXAMPLE_PATH)!r})\n"
            "module = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(module)\n"
            "assert isinstance(module.ModelNew, type)\nprint('built', module._ext.__file__)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "built" in result.stdout and ".so" in result.stdout
