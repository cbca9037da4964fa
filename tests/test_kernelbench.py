"""KernelBench files as they are (issue 34): described in memory, loaded, overridden, imported and evaluated.

The files under tests/fixtures/kernelbench are written for these tests in KernelBench's format (Model, lower-case
module constants, get_inputs building CPU tensors, get_init_inputs): a reduction, a loss with integer targets, a
matmul, an element-wise op, a layer whose size comes from get_init_inputs, and a convolution.
"""
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from harness import cli, kernelbench
from harness.correctness import self_check
from harness.problem import DEFAULT_TOLERANCE, ProblemError, load_problem

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "kernelbench"
SOLUTIONS = REPO / "tests" / "fixtures" / "kernelbench_solutions"
FILES = {p.stem: p for p in sorted(FIXTURES.glob("*.py"))}
SUM, LOSS, MATMUL, ELEMENTWISE, LINEAR, CONV = ("1_Sum_over_dim", "2_Cross_entropy_loss", "3_Matmul", "4_LeakyReLU",
                                                 "5_Linear_GELU", "6_Conv2d")
# The aten ops each reference must be found to dispatch (the rule's core ops), at least.
CORE = {SUM: {"sum"}, LOSS: {"_log_softmax", "nll_loss_forward"}, MATMUL: {"mm"}, ELEMENTWISE: {"leaky_relu"},
        LINEAR: {"addmm", "gelu"}, CONV: {"convolution"}}
TRIVIAL = {"view", "t", "transpose", "reshape", "empty", "empty_like", "copy_", "_to_copy", "contiguous", "expand", "slice",
           "as_strided", "unsqueeze", "permute", "zeros", "fill_", "detach"}


@pytest.fixture(scope="module")
def problems():
    return {name: load_problem(path) for name, path in FILES.items()}


def test_the_six_fixtures_are_there():
    assert set(FILES) == set(CORE)


@pytest.mark.parametrize("name", sorted(CORE))
def test_each_file_is_a_problem_with_a_generated_description(problems, name):
    problem = problems[name]
    assert problem.name == name and problem.directory == FILES[name].resolve()
    assert problem.custom == "partial" and problem.init_seed == kernelbench.INIT_SEED and not problem.vary_args
    default = problem.default_shape
    assert default.name == "default" and default.constants == {} and default.uses == {"correctness", "timing"}
    assert problem.tolerance["float32"] == DEFAULT_TOLERANCE["float32"]
    assert problem.output_dtype(default) == torch.float32
    small = problem.shape("small")  # every fixture is larger than SMALL_BYTES: a scaled correctness shape exists
    assert small.uses == {"correctness"}
    assert problem.bytes_moved(small) <= kernelbench.SMALL_BYTES < problem.bytes_moved(default)
    ops = set(problem.core_aten_ops)
    assert CORE[name] <= ops and not ops & TRIVIAL
    for shape in (small, default):  # the reference runs on both, on the CPU, and its output's bytes are those measured
        out = problem.make_reference(shape, "cpu")(*problem.make_inputs(shape, 1, "cpu"))
        assert problem.bytes_written(shape) == out.numel() * out.element_size()


def test_bytes_and_flops_are_measured(problems):
    m = problems[MATMUL]
    for shape in m.shapes:
        c = m.constants(shape)
        assert m.flops(shape) == 2 * c["M"] * c["N"] * c["K"]
        assert m.bytes_moved(shape) == 4 * (c["M"] * c["K"] + c["K"] * c["N"] + c["M"] * c["N"])
    s = problems[SUM]
    c = s.constants(s.default_shape)
    assert s.bytes_moved(s.default_shape) == 4 * (c["batch_size"] * c["features"] + c["batch_size"]) and s.flops(s.default_shape) == 0
    lin = problems[LINEAR]  # the layer's parameters are read as well
    c = lin.constants(lin.default_shape)
    b, i, o = c["batch_size"], c["in_features"], c["out_features"]
    assert lin.bytes_moved(lin.default_shape) == 4 * (b * i + i * o + o + b * o) and lin.flops(lin.default_shape) == 2 * b * i * o
    conv = problems[CONV]
    for shape in conv.shapes:
        c = conv.constants(shape)
        k = c["kernel_size"]
        out_hw = (c["height"] - k + 1) * (c["width"] - k + 1)
        assert conv.flops(shape) == 2 * c["batch_size"] * c["out_channels"] * out_hw * c["in_channels"] * k * k


def test_the_small_shape_scales_sizes_and_keeps_axes_and_kernels(problems):
    assert problems[SUM].shape("small").constants == {"batch_size": 32, "features": 4096}  # reduce_dim stays 1
    conv = problems[CONV].shape("small").constants
    assert "kernel_size" not in conv and "in_channels" not in conv and conv["height"] < 64
    loss = problems[LOSS]
    small = loss.shape("small")
    assert small.constants["input_shape"] == [small.constants["num_classes"]]  # a tuple constant scales with the rest
    logits, labels = loss.make_inputs(small, 5, "cpu")
    assert logits.shape == (small.constants["batch_size"], small.constants["num_classes"])
    assert labels.dtype == torch.int64 and int(labels.max()) < small.constants["num_classes"]


def _hand_written(folder: Path, name: str, text: str) -> Path:
    """A problem folder with a problem.yaml written by hand beside a copy of fixture `name`."""
    folder.mkdir()
    shutil.copyfile(FILES[name], folder / "reference.py")
    (folder / "problem.yaml").write_text(text)
    return folder


def test_lower_case_constants_are_overridden_per_shape(tmp_path):
    folder = _hand_written(tmp_path / "sum", SUM, "name: sum\nreference: reference.py\ncost: {bytes: 'batch_size * features * elem'}\n"
                                          "shapes:\n  - {name: odd, set: {batch_size: 3, features: 1001}}\n")
    problem = load_problem(folder)
    shape = problem.shape("odd")
    assert problem.bytes_moved(shape) == 3 * 1001 * 4
    (x,) = problem.make_inputs(shape, 7, "cpu")
    assert x.shape == (3, 1001)
    assert problem.make_reference(shape, "cpu")(x).shape == (3, 1)
    bad = _hand_written(tmp_path / "typo", SUM, "name: sum\nreference: reference.py\ncost: {bytes: '1'}\n"
                                                "shapes:\n  - {name: a, set: {batch_sise: 3}}\n")
    with pytest.raises(ProblemError, match="batch_sise.*does not define"):
        load_problem(bad)


def test_inputs_move_to_the_device_and_integers_keep_their_dtype(problems, tmp_path):
    elementwise = problems[ELEMENTWISE]  # its get_inputs builds on the CPU explicitly
    (x,) = elementwise.make_inputs(elementwise.shape("small"), 3, torch.device("meta"))
    assert x.device.type == "meta"
    folder = _hand_written(tmp_path / "loss", LOSS, "name: loss\nreference: reference.py\ncost: {bytes: '1'}\nshapes:\n"
                                                    "  - {name: bf16, set: {batch_size: 8, num_classes: 10, input_shape: [10]}, "
                                                    "dtype: bfloat16}\n")
    loss = load_problem(folder)
    logits, labels = loss.make_inputs(loss.shape("bf16"), 3, "cpu")
    assert logits.dtype == torch.bfloat16 and logits.shape == (8, 10)
    assert labels.dtype == torch.int64 and int(labels.max()) < 10


def test_inputs_follow_the_trial_seed_and_parameters_do_not(problems):
    problem = problems[LINEAR]
    shape = problem.shape("small")
    a, b, c = (problem.make_inputs(shape, s, "cpu")[0] for s in (11, 11, 12))
    assert torch.equal(a, b) and not torch.equal(a, c)
    first = problem.make_reference(shape, "cpu").linear.weight.detach().clone()
    problem.make_inputs(shape, 99, "cpu")
    torch.rand(1000)
    # What the child does before ModelNew: apply the shape's constants (which seeds the init generator), build.
    problem.apply_constants(shape)
    child_side = problem.module.Model(*problem.module.get_init_inputs()).linear.weight
    assert torch.equal(first, problem.make_reference(shape, "cpu").linear.weight) and torch.equal(first, child_side)


def test_an_integer_output_is_compared_exactly(tmp_path):
    path = tmp_path / "7_Argmax.py"
    path.write_text("import torch\n\nclass Model(torch.nn.Module):\n    def __init__(self, dim):\n        super().__init__()\n"
                    "        self.dim = dim\n\n    def forward(self, x):\n        return torch.argmax(x, dim=self.dim)\n\n"
                    "batch_size = 128\ndim1 = 4096\ndim = 1\n\ndef get_inputs():\n    return [torch.randn(batch_size, dim1)]\n\n"
                    "def get_init_inputs():\n    return [dim]\n")
    problem = load_problem(path)
    assert problem.output_dtype(problem.default_shape) == torch.int64
    assert problem.tolerance["float32"] == {"atol": 0.0, "rtol": 0.0, "rel_l2": 0.0}
    assert all(line.ok for line in self_check(problem, "cpu"))


def _sha(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_import_suite_round_trips_and_leaves_the_originals(problems, tmp_path, capsys):
    before = _sha(FIXTURES)
    into = tmp_path / "kb"
    assert cli.main(["import-suite", str(FIXTURES), "--into", str(into)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [l.split(":")[0] for l in lines[:-1]] == [f"imported {name}.py" for name in sorted(FILES)]
    assert lines[-1].startswith("6 of 6 files imported")
    assert _sha(FIXTURES) == before
    for name, path in FILES.items():
        assert (into / name / "reference.py").read_bytes() == path.read_bytes()
        spec = yaml.safe_load((into / name / "problem.yaml").read_text())
        assert spec["custom"] == "partial" and spec["reference"] == "reference.py"
        loaded, memory = load_problem(into / name), problems[name]
        for field in ("name", "shapes", "core_aten_ops", "tolerance", "custom", "init_seed", "default_output_dtype"):
            assert getattr(loaded, field) == getattr(memory, field), (name, field)
    # again: nothing is replaced without --force
    assert cli.main(["import-suite", str(FIXTURES), "--into", str(into)]) == 1
    assert all("exists already" in l for l in capsys.readouterr().out.splitlines()[:-1])


def test_import_suite_says_why_it_skips_a_file(tmp_path, capsys):
    source = tmp_path / "src"
    source.mkdir()
    shutil.copyfile(FILES[MATMUL], source / FILES[MATMUL].name)
    (source / "no_inputs.py").write_text("import torch\nclass Model(torch.nn.Module):\n    pass\n")
    (source / "pair.py").write_text("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x, x\n\n"
                                    "def get_inputs():\n    return [torch.randn(4)]\n\ndef get_init_inputs():\n    return []\n")
    (source / "broken.py").write_text("import torch\nraise RuntimeError('no')\n")
    assert cli.main(["import-suite", str(source), "--into", str(tmp_path / "kb")]) == 1
    out = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines()[:-1])
    assert out["imported 3_Matmul.py"].startswith(str(tmp_path / "kb" / "3_Matmul"))
    assert "defines no get_inputs, get_init_inputs" in out["skipped no_inputs.py"]
    assert "returns tuple, not one tensor" in out["skipped pair.py"]
    assert "does not import (RuntimeError: no)" in out["skipped broken.py"]
    assert sorted(p.name for p in (tmp_path / "kb").iterdir()) == ["3_Matmul"]


def test_eval_of_a_file_that_is_no_problem_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["eval", str(tmp_path / "missing.py"), "--device", "cpu"]) == 2
    assert "no KernelBench file" in capsys.readouterr().err
    (tmp_path / "plain.py").write_text("x = 1\n")
    assert cli.main(["eval", str(tmp_path / "plain.py"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "defines no Model, get_inputs, get_init_inputs" in err[0]


def _harness(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


FAST = ["--device", "cpu", "--trials", "2", "--budget", "0.05", "--host-bound-processes", "1", "--no-baselines", "--json"]


def test_eval_a_kernelbench_file_as_it_is(tmp_path):
    """`eval FILE.py`: no yaml, both generated shapes checked, an honest pure-PyTorch solution passes unmarked."""
    out = _harness("eval", str(FILES[SUM].relative_to(REPO)), "--solution", str(SOLUTIONS / "sum_pairwise.py"),
                   "--results", str(tmp_path), *FAST)
    assert out.returncode == 0, out.stderr[-2000:]
    (record,) = json.loads(out.stdout)
    assert record["status"] == "ok" and record["problem"] == SUM and "uses_reference_ops" not in record
    assert {c["shape"] for c in record["checks"]} == {"default", "small"}
    assert "with reference ops" not in (tmp_path / "leaderboard.md").read_text()


@pytest.mark.slow
def test_an_extension_built_in_init_passes(tmp_path):
    """load_inline in ModelNew.__init__ (compilers started, frames read by filelock) is judged as the import is."""
    out = _harness("eval", str(FILES[SUM].relative_to(REPO)), "--solution", str(SOLUTIONS / "sum_built_in_init.py"),
                   "--results", str(tmp_path), *FAST)
    assert out.returncode == 0, out.stderr[-2000:]
    (record,) = json.loads(out.stdout)
    assert record["status"] == "ok", record["reason"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_kernelbench_file_as_it_is_with_a_cuda_solution_on_the_gpu(tmp_path):
    """The KernelBench-format file, unchanged, against a solution with a CUDA kernel of its own: correct, timed
    at the file's own shape beside eager, and not marked as using the reference's ops."""
    out = _harness("eval", str(FILES[SUM].relative_to(REPO)), "--solution", str(SOLUTIONS / "sum_cuda.py"),
                   "--results", str(tmp_path), "--trials", "2", "--budget", "0.2", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    record = next(r for r in json.loads(out.stdout) if r["kind"] == "solution")
    assert record["status"] == "ok" and "uses_reference_ops" not in record, record["reason"]
    assert [t["shape"] for t in record["timings"]] == ["default"] and record["timings"][0]["median_ms"] > 0


@pytest.mark.slow
def test_partial_accepts_the_reference_op_beside_work_of_its_own_and_marks_it(tmp_path):
    """custom: partial (a KernelBench file's default): a forward calling aten::sum for half the work passes and is
    marked; one calling aten::sum alone is the reference and is rejected, as under full."""
    out = _harness("eval", str(FILES[SUM].relative_to(REPO)), "--solution", str(SOLUTIONS / "sum_partial.py"),
                   "--solution", str(SOLUTIONS / "sum_reference_op.py"), "--results", str(tmp_path), *FAST)
    assert out.returncode == 1, out.stderr[-2000:]
    partial, reference = json.loads(out.stdout)
    assert partial["status"] == "ok" and partial["uses_reference_ops"] is True, partial
    assert reference["rule"] == "not-custom-kernel" and "nothing of its own" in reference["reason"], reference
    row = next(line for line in (tmp_path / "leaderboard.md").read_text().splitlines() if "sum_partial.py**" in line)
    assert "with reference ops" in row


@pytest.mark.parametrize("custom, ops, verdict", [
    ("full", ["sum", "empty"], "not-custom-kernel"),
    # the reference's op and data movement only. An extension's loops dispatch nothing the CPU can see, and neither
    # its use nor a library in its folder proves they ran (a planted library, or a comment naming cpp_extension,
    # got torch.sum accepted: red team), so nothing beside the op records counts
    ("partial", ["sum", "empty", "view"], "not-custom-kernel"),
    ("partial", ["sum", "cumsum", "add"], "marked"),  # work of its own beside it
    ("partial", ["cumsum", "add"], "clean"),
])
def test_the_cpu_op_rule_under_each_policy(tmp_path, custom, ops, verdict):
    from harness.records import Record
    from harness.runner import Config, Failure, Run

    problem = load_problem(FILES[SUM])
    problem.custom = custom
    run = Run(torch.device("cpu"), tmp_path / "runs.jsonl", Config())
    record = Record.__new__(Record)
    record.uses_reference_ops = False
    try:
        run._judge_ops(problem, record, ops)
    except Failure as failure:
        assert verdict == failure.rule
        return
    assert verdict == ("marked" if record.uses_reference_ops else "clean")


def test_an_attention_reference_names_its_fused_cpu_op(tmp_path):
    """With no constant to scale and a default over 1 MB there is no small shape: the meta run alone saw SDPA's
    decomposition (_safe_softmax, bmm), and the CPU's fused op went unnamed. The default runs for real, and a
    softmax or attention op brings its family of patterns."""
    spec = kernelbench.describe(REPO / "tests" / "fixtures" / "kernelbench_extra" / "Attention_fixed.py")
    problem = kernelbench.problem_from_file(REPO / "tests" / "fixtures" / "kernelbench_extra" / "Attention_fixed.py")
    assert "_scaled_dot_product_flash_attention_for_cpu" in problem.reference_ops_in(["_scaled_dot_product_flash_attention_for_cpu"])
    assert problem.reference_ops_in(["_scaled_dot_product_efficient_attention", "_softmax"]) and spec["custom"] == "partial"


def test_the_leaderboard_marks_reference_ops():
    from harness import leaderboard

    env = {"date": "2026-01-01T00:00:00+00:00", "torch": "2"}
    base = {"run_id": "abc123", "problem": "p", "kind": "solution", "device": "cpu", "env": env, "status": "ok",
            "timings": [{"shape": "default", "median_ms": 1.0}]}
    records = [{**base, "name": "a", "path": "/x/a.py", "uses_reference_ops": True}, {**base, "name": "b", "path": "/x/b.py"}]
    board = leaderboard.render_markdown(leaderboard.build(records))
    rows = [line for line in board.splitlines() if line.startswith("| **")]
    assert any("a.py** · with reference ops" in r for r in rows) and not any("b.py** · with" in r for r in rows)
    assert "Rows marked \"with reference ops\"" in board


def test_custom_full_rejects_the_reference_op(tmp_path, capsys):
    into = tmp_path / "kb"
    assert cli.main(["import-suite", str(FIXTURES), "--into", str(into)]) == 0
    yaml_path = into / SUM / "problem.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("custom: partial", "custom: full"))
    out = _harness("eval", SUM, "--problems-dir", str(into), "--solution", str(SOLUTIONS / "sum_reference_op.py"),
                   "--shape", "small", "--results", str(tmp_path / "results"), *FAST)
    assert out.returncode == 1, out.stderr[-2000:]
    (record,) = json.loads(out.stdout)
    assert record["rule"] == "not-custom-kernel" and "aten::sum" in record["reason"]


class _Profiled:
    """A worker whose profile reply is given (the GPU's profiler, on the CPU)."""

    def __init__(self, **reply):
        self.reply = reply

    def request(self, msg, timeout, phase, reply_type):
        return reply_type(**self.reply)


@pytest.mark.parametrize("custom, own_kernels, own_share, verdict", [
    ("full", 1, 0.2, "not-custom-kernel"),
    ("partial", 1, 0.2, "marked"),
    ("partial", 1, 0.9, "clean"),
    ("partial", 0, 0.0, "not-custom-kernel"),  # none of its own: rejected under both policies
    ("full", 0, 0.0, "not-custom-kernel"),
])
def test_the_profile_rule_under_each_policy(tmp_path, monkeypatch, custom, own_kernels, own_share, verdict):
    from harness import runner
    from harness.records import Record
    from harness.rules import Failure
    from harness.runner import Config, Run

    class Pool:  # the parent's inputs as they are (a GPU run shares them with the child)
        def __init__(self, *args):
            pass

        def share(self, inputs):
            return inputs, []

        def tensor(self, shape, dtype):
            return torch.empty(shape, dtype=dtype)

    monkeypatch.setattr(runner, "SharedPool", Pool)
    for name in ("describe", "describe_shared"):
        monkeypatch.setattr(runner, name, lambda x: None)
    monkeypatch.setattr(Run, "_verify", lambda self, *args: {})  # the profiled output's check: tested on the GPU
    problem = load_problem(FILES[SUM])
    problem.custom = custom
    run = Run(torch.device("cpu"), tmp_path / "runs.jsonl", Config())
    record = Record(run_id="r", problem=problem.name, kind="solution", name="x", path=None, device="cpu", env={})
    worker = _Profiled(ops=[], kernel_count=2, own_kernels=own_kernels, own_share=own_share,
                       kernels=[{"name": "lib_kernel", "own": False}, {"name": "mine", "own": True}])
    if verdict == "not-custom-kernel":
        with pytest.raises(Failure) as failure:
            run._profile(problem, worker, record, problem.default_shape)
        assert failure.value.rule == "not-custom-kernel"
    else:
        run._profile(problem, worker, record, problem.default_shape)
        assert bool(record.uses_reference_ops) is (verdict == "marked")


def test_the_reference_module_is_not_left_where_a_solution_could_find_it(problems):
    """A solution found Model in sys.modules["harness_problem_*"] and ran the reference as its own (the meta
    run had missed the op it dispatched); `F` for torch.nn.functional was taken for a shape constant."""
    import sys

    problem = problems[SUM]
    assert problem.module.Model is not None and not [n for n in sys.modules if n.startswith("harness_problem_")]
    module = kernelbench._import(REPO / "tests" / "fixtures" / "kernelbench_extra" / "Attention_fixed.py")
    assert "F" not in kernelbench.module_constants(module)
