"""Problems load and validate; inputs are reproducible, varied and probe-able; solutions are found."""
import pytest
import torch

from harness.problem import LOW_BITS_PATTERN, ProblemError, available_problems, discover_solutions, find_problem, load_problem


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
    ("name: x\nreference: [unclosed\n", r"problem.yaml:3:1: not valid YAML"),
    ("name: x\n  bad: indent\n", r"problem.yaml:2:6: not valid YAML: mapping values are not allowed here"),
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


# --- input families, timing shapes as correctness shapes, output dtypes ---------------------------------

@pytest.mark.parametrize("name", ["softmax", "cross_entropy", "infonce"])
def test_every_timing_shape_is_a_correctness_shape(name):
    problem = find_problem(name)
    assert all("correctness" in s.uses for s in problem.shapes_for("timing"))


@pytest.mark.parametrize("name, shape", [("infonce", "odd_sizes"), ("cross_entropy", "not_vector_multiple"), ("softmax", "not_vector_multiple")])
def test_families_are_deterministic_per_seed_and_rotate(name, shape):
    problem = find_problem(name)
    shape = problem.shape(shape)
    families = problem.family_names
    assert len(families) >= 2 and families[0] == "plain"
    for start in (0, 7, 2**61 + 5):
        window = [problem.family_of(start + k) for k in range(len(families))]
        assert sorted(window) == sorted(families)  # any len(families) consecutive seeds meet every family
    for seed in (40, 41, 42):
        a, b = problem.make_inputs(shape, seed, "cpu"), problem.make_inputs(shape, seed, "cpu")
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        for x in a:
            if x.is_floating_point():
                assert torch.isfinite(x).all() and x.abs().max() < 2048  # fp16's range, with room for hi/lo splits
    # Each of a shape's trials meets every family although its seeds are hashes: the runner moves trial t's seed
    # with seed_for_trial(seed, t).
    for t in range(6):
        moved = problem.seed_for_trial(123456789 + 1000 * t, t)
        assert 0 <= moved - (123456789 + 1000 * t) < len(families)
        assert problem.family_of(moved) == families[t % len(families)]


def _low_bits_set(x):
    bits = x.view(torch.int32)
    normal = ((bits >> 23) & 0xFF) > 0
    return bool(((bits & 0xFFFF) == LOW_BITS_PATTERN)[normal].all())


def test_infonce_families_expose_reduced_precision_and_subsampling():
    problem = find_problem("infonce")
    shape = problem.shape("odd_sizes")
    by_family = {}
    for seed in range(30, 33):
        by_family[problem.family_of(seed)] = problem.make_inputs(shape, seed, "cpu")
    q, p, n = by_family["plain"]
    assert not _low_bits_set(q)
    cos = torch.nn.functional.normalize(q, dim=1) @ torch.nn.functional.normalize(n, dim=1).t()
    assert cos.mean().abs() < 0.05  # the seed's independent directions
    for family in ("common_mode", "hard_negatives"):
        q, p, n = by_family[family]
        assert all(_low_bits_set(x) for x in (q, p, n))
        # every dot product shares a large common part: the cosines all sit near 0.9
        cos = torch.nn.functional.normalize(q, dim=1) @ torch.nn.functional.normalize(n, dim=1).t()
        assert cos.min() > 0.6 and cos.mean() > 0.8
        # converting to tf32/fp16 rounds every element down in magnitude (systematic, not averaging out)
        assert bool((q.half().float().abs() < q.abs())[q.abs() > 2**-14].all())
    norms = by_family["hard_negatives"][2].norm(dim=1)
    assert int((norms > 1.5 * norms.median()).sum()) == 8


def test_cross_entropy_spread_rows_family():
    problem = find_problem("cross_entropy")
    shape = problem.shape("not_vector_multiple")
    seeds = {problem.family_of(s): s for s in (50, 51)}
    plain = problem.make_inputs(shape, seeds["plain"], "cpu")[0]
    spread = problem.make_inputs(shape, seeds["spread_rows"], "cpu")[0]
    std = spread.std(dim=1)
    assert int((std > 6 * std.median()).sum()) == 6  # ceil(333 / 64) rows of 12x the spread
    assert plain.std(dim=1).max() < 1.5 * plain.std(dim=1).median()
    assert _low_bits_set(spread) and not _low_bits_set(plain)


def test_output_dtype_is_float32_for_bf16_cross_entropy():
    ce = find_problem("cross_entropy")
    assert ce.output_dtype(ce.shape("mid_bf16")) == torch.float32
    assert ce.output_dtype(ce.shape("4096x128256_bf16")) == torch.float32
    assert ce.output_dtype(ce.shape("one_row")) == torch.float32
    softmax = find_problem("softmax")
    assert softmax.output_dtype(softmax.shape("mid_bf16")) == torch.bfloat16
    shape = ce.shape("mid_bf16")
    logits, targets = ce.make_inputs(shape, 3, "cpu")
    model = ce.make_reference(shape, "cpu")
    assert model(logits, targets).dtype == torch.float32
    assert model(logits.double(), targets).dtype == torch.float64  # the float64 reference stays float64


@pytest.mark.parametrize("yaml_text, message", [
    ("name: x\nreference: reference.py\ncost: {bytes: '1'}\nvary_inputs: {families: [{name: a, sparkle: {}}]}\n"
     "shapes:\n  - {name: a, set: {N: 4}}\n", "unknown transforms"),
    ("name: x\nreference: reference.py\ncost: {bytes: '1'}\nvary_inputs: {families: [{name: a}, {name: a}]}\n"
     "shapes:\n  - {name: a, set: {N: 4}}\n", "names must be unique"),
    ("name: x\nreference: reference.py\ncost: {bytes: '1'}\noutput_dtype: float8\nshapes:\n  - {name: a, set: {N: 4}}\n", "unknown output_dtype"),
    ("name: x\nreference: reference.py\ncost: {bytes: '1'}\nshapes:\n  - {name: a, set: {N: 4}, output_dtype: int3}\n", "unknown output_dtype"),
])
def test_malformed_families_and_output_dtype_are_clear_errors(tmp_path, yaml_text, message):
    (tmp_path / "reference.py").write_text(
        "import torch\nN = 8\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
        "def get_inputs():\n    return [torch.randn(N)]\ndef get_init_inputs():\n    return []\n")
    (tmp_path / "problem.yaml").write_text(yaml_text)
    with pytest.raises(ProblemError, match=message):
        load_problem(tmp_path)


def test_core_ops_match_by_pattern_and_only_in_torchs_namespaces():
    """A pattern covers an op family; an op of torch's other namespaces is judged by its name, a solution's
    own custom op (a namespace torch does not have) never is."""
    softmax = find_problem("softmax")
    ops = ["_softmax", "exp", "_scaled_dot_product_flash_attention_for_cpu", "quantized::softmax", "mylib::fused_softmax"]
    assert softmax.reference_ops_in(ops) == ["_scaled_dot_product_flash_attention_for_cpu", "_softmax", "quantized::softmax"]
    infonce = find_problem("infonce")
    assert infonce.reference_ops_in(["mkldnn::_linear_pointwise", "conv2d", "_convert_indices_from_coo_to_csr",
                                     "resolve_conj", "div", "sum"]) == ["conv2d", "mkldnn::_linear_pointwise"]
    assert "_softmax" in softmax.core_op_names() and "scaled_dot_product_attention" in softmax.core_op_names()


def test_private_files_are_regular_files_never_links(tmp_path):
    """A `_x` linked to /proc/self/mem beside the candidates failed every one of them when the parent read it for
    their code hash and own kernels, and a read outside the try ended the eval (red team): links are not private files."""
    from harness.problem import private_files

    (tmp_path / "cand.py").write_text("x = 1\n")
    (tmp_path / "_shared.cuh").write_text("// device code\n")
    (tmp_path / "_x").symlink_to("/proc/self/mem")
    assert private_files(tmp_path / "cand.py") == [tmp_path / "_shared.cuh"]
