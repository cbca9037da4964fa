"""Problems load and validate; inputs are reproducible, varied and probe-able; solutions are found."""
import pytest
import torch

from harness.problem import ProblemError, available_problems, discover_solutions, find_problem, load_problem


def test_shipped_problems_load():
    assert {"softmax", "cross_entropy", "infonce"} <= set(available_problems())
    for name in ("softmax", "cross_entropy", "infonce"):
        problem = find_problem(name)
        assert problem.shapes_for("timing") and problem.shapes_for("correctness")
        assert problem.bytes_moved(problem.default_shape) > 0


def test_issue_timing_shapes_are_present():
    softmax = {(s.constants["BATCH"], s.constants["DIM"], s.dtype) for s in find_problem("softmax").shapes_for("timing")}
    assert softmax == {(8192, 16384, "float32"), (4096, 393216, "float32"), (32768, 4096, "bfloat16"), (16384, 32768, "bfloat16")}
    ce = {(s.constants["BATCH"], s.constants["NUM_CLASSES"], s.dtype) for s in find_problem("cross_entropy").shapes_for("timing")}
    assert ce == {(8192, 32000, "float32"), (32768, 4096, "float32"), (4096, 128256, "bfloat16"), (32768, 32000, "bfloat16")}
    infonce = find_problem("infonce")
    assert infonce.default_shape.constants == {"BATCH_SIZE": 256, "FEATURE_DIM": 512, "N_NEGATIVES": 2560}


def test_infonce_reference_is_the_seed_unchanged():
    from pathlib import Path

    seed = Path(__file__).resolve().parents[2] / "shared" / "seeds" / "infonce_reference.py"
    if not seed.is_file():
        pytest.skip("../shared is not beside this checkout")
    assert find_problem("infonce").reference_path.read_text() == seed.read_text()


def test_inputs_are_reproducible_and_vary_between_trials():
    problem = find_problem("softmax")
    shape = problem.shape("not_vector_multiple")
    a = problem.make_inputs(shape, 11, "cpu")[0]
    b = problem.make_inputs(shape, 11, "cpu")[0]
    c = problem.make_inputs(shape, 12, "cpu")[0]
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert a.abs().max() > 5  # offsets and scales: a kernel that skips the max-subtraction must fail
    assert (a.mean() - c.mean()).abs() > 1e-3 or (a.std() / c.std() - 1).abs() > 0.05


def test_shape_dtype_is_applied():
    problem = find_problem("cross_entropy")
    logits, targets = problem.make_inputs(problem.shape("mid_bf16"), 3, "cpu")
    assert logits.dtype == torch.bfloat16 and logits.shape == (129, 4099)
    assert targets.dtype == torch.int64 and int(targets.max()) < 4099


def test_cache_probe_keeps_edges_and_changes_the_middle():
    problem = find_problem("cross_entropy")
    shape = problem.shape("not_vector_multiple")
    before = problem.make_inputs(shape, 5, "cpu")
    probe = problem.make_inputs(shape, 6, "cpu", probe_from=5)
    assert torch.equal(probe[0].view(-1)[:256], before[0].view(-1)[:256])
    assert torch.equal(probe[0].view(-1)[-256:], before[0].view(-1)[-256:])
    assert torch.equal(probe[1], before[1])
    assert not torch.equal(probe[0], before[0])


def test_solutions_are_discovered():
    found = {p.name for p in discover_solutions("softmax")}
    assert "simple.py" in found
    assert all(not name.startswith("_") for name in found)


@pytest.mark.parametrize("yaml_text, message", [
    ("name: x\nreference: [unclosed\n", "not valid YAML"),
    ("- just\n- a list\n", "must be a mapping"),
    ("reference: reference.py\ncost: {bytes: '1'}\nshapes: []\n", "missing required key 'name'"),
    ("name: x\nreference: reference.py\ncost: {bytes: '1'}\nshapes:\n  - {name: a, set: {N: 4}, dtype: float8, use: [timing]}\n", "unknown dtype"),
    ("name: x\nreference: reference.py\ncost: {bytes: '1'}\nshapes:\n  - {name: a, set: {NOPE: 4}, use: [timing, correctness]}\n", "does not define"),
    ("name: x\nreference: reference.py\ncost: {bytes: 'N * undefined'}\nshapes:\n  - {name: a, set: {N: 4}, use: [timing, correctness]}\n", "cost expression fails"),
    ("name: x\nreference: reference.py\ncost: {bytes: '1'}\nshapes:\n  - {name: a, set: {N: 4}, use: [timing]}\n", "at least one correctness shape"),
    ("name: x\nreference: missing.py\ncost: {bytes: '1'}\nshapes: []\n", "not found"),
])
def test_malformed_problem_yaml_is_a_clear_error(tmp_path, yaml_text, message):
    (tmp_path / "reference.py").write_text(
        "import torch\nN = 8\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
        "def get_inputs():\n    return [torch.randn(N)]\ndef get_init_inputs():\n    return []\n")
    (tmp_path / "problem.yaml").write_text(yaml_text)
    with pytest.raises(ProblemError, match=message) as info:
        load_problem(tmp_path)
    assert "problem.yaml" in str(info.value) or "reference" in str(info.value)


def test_unknown_problem_lists_the_known_ones():
    with pytest.raises(ProblemError, match="softmax"):
        find_problem("softmaxx")
