"""The checker's verdicts, true and false, and the self-check of every shipped problem."""
import math

import pytest
import torch
import torch.nn.functional as F

from harness import correctness
from harness.correctness import CPU_SELF_CHECK_BYTES, check_output, inputs_unchanged, native_reference, reference_output, self_check
from harness.problem import find_problem

FP32 = {"atol": 1e-4, "rtol": 1e-4, "rel_l2": 1e-4}


def _softmax_case(n=1000, rows=4):
    x = torch.randn(rows, n, dtype=torch.float64) * 4
    return torch.softmax(x, -1)


def test_exact_result_passes_and_reports_errors():
    ref = _softmax_case()
    verdict = check_output(ref.float(), ref, torch.float32, FP32)
    assert verdict.ok and verdict.max_abs < 1e-6 and verdict.rel_l2 < 1e-6


@pytest.mark.parametrize("make, rule", [
    (lambda r: torch.zeros_like(r, dtype=torch.float32), "wrong-output"),
    (lambda r: torch.full_like(r, 1e-3, dtype=torch.float32), "wrong-output"),
    (lambda r: (r * 1.01).float(), "wrong-output"),
    (lambda r: r.float()[:, :-1], "bad-output"),
    (lambda r: r.double(), "bad-output"),
    (lambda r: torch.tensor(0.001).expand(r.shape), "bad-output"),
    (lambda r: torch.full(r.shape, float("nan")), "wrong-output"),
    (lambda r: torch.full(r.shape, -1, dtype=torch.int32).view(torch.float32), "uninitialised-output"),
])
def test_wrong_outputs_fail_with_their_rule(make, rule):
    ref = _softmax_case()
    verdict = check_output(make(ref), ref, torch.float32, FP32)
    assert not verdict.ok and verdict.rule == rule and verdict.reason


def test_tiny_values_below_atol_still_fail_through_relative_l2():
    ref = _softmax_case(n=65537, rows=2) * 0 + 1 / 65537  # every element far below atol
    ref = ref + torch.randn_like(ref) * 1e-6
    verdict = check_output(torch.zeros_like(ref, dtype=torch.float32), ref, torch.float32, FP32)
    assert not verdict.ok and "relative L2" in verdict.reason


def test_tensor_subclass_is_refused():
    class Lazy(torch.Tensor):
        pass

    ref = _softmax_case()
    verdict = check_output(ref.float().as_subclass(Lazy), ref, torch.float32, FP32)
    assert not verdict.ok and verdict.rule == "bad-output"


def test_nan_and_inf_must_match():
    ref = torch.tensor([1.0, float("inf"), float("nan")], dtype=torch.float64)
    assert check_output(ref.float(), ref, torch.float32, FP32).ok
    assert not check_output(torch.tensor([1.0, float("-inf"), float("nan")]), ref, torch.float32, FP32).ok
    assert not check_output(torch.tensor([1.0, float("inf"), 0.0]), ref, torch.float32, FP32).ok


def test_inputs_unchanged_detects_mutation():
    x = torch.randn(8, 8)
    assert inputs_unchanged([x, torch.arange(3)], [x.clone(), torch.arange(3)]) == ""
    mutated = x.clone()
    mutated[3, 3] = 0
    assert "differs in 1 of 64" in inputs_unchanged([x], [mutated])
    assert inputs_unchanged([x], [x.clone(), x]) != ""


@pytest.mark.parametrize("name", ["softmax", "cross_entropy", "infonce"])
def test_self_check_rejects_zeros_constants_and_other_inputs(name):
    """On the CPU, every correctness shape of at most 64 MB of inputs, in every input family."""
    problem = find_problem(name)
    lines = self_check(problem, "cpu")
    assert lines and all(line.ok for line in lines), [l for l in lines if not l.ok]
    cases = {line.case for line in lines}
    assert {"eager reference", "zeros", "constant (mean of other output)", "reference output for other inputs"} <= cases
    assert {line.family for line in lines} == set(problem.family_names)
    checked = {line.shape for line in lines}
    assert checked == {s.name for s in problem.shapes_for("correctness") if problem.bytes_moved(s) <= CPU_SELF_CHECK_BYTES}


# --- scalar losses: precision and subsampling shortcuts against the calibrated tolerances -------------------

def _tf32(x):
    """Round to 10 explicit mantissa bits, to nearest (what a TF32 tensor core product sees)."""
    return ((x.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


def _infonce(q, p, n, temperature, mm):
    pos = F.cosine_similarity(q, p, dim=1) / temperature
    neg = mm(q, n) / temperature
    return (torch.logaddexp(pos, torch.logsumexp(neg, dim=1)) - pos).mean()


def test_tf32_infonce_is_rejected_on_the_common_mode_family_while_fp32_passes():
    problem = find_problem("infonce")
    shape = problem.shape("odd_sizes")
    tolerance = problem.tolerance_for(shape.dtype)
    seed = problem.seed_for_trial(5000, problem.family_names.index("common_mode"))
    q, p, n = problem.make_inputs(shape, seed, "cpu")
    truth = reference_output(problem, shape, [q, p, n], "cpu")
    temperature = problem.constants(shape)["TEMPERATURE"]
    honest = _infonce(q, p, n, temperature, lambda a, b: a @ b.t())
    cheat = _infonce(q, p, n, temperature, lambda a, b: _tf32(a) @ _tf32(b).t())
    fp16 = _infonce(q, p, n, temperature, lambda a, b: a.half().float() @ b.half().float().t())
    assert check_output(honest, truth, torch.float32, tolerance).ok
    assert check_output(native_reference(problem, shape, [q, p, n], "cpu"), truth, torch.float32, tolerance).ok
    for wrong in (cheat, fp16):
        verdict = check_output(wrong, truth, torch.float32, tolerance)
        assert not verdict.ok and verdict.rule == "wrong-output"


def test_subsampled_negatives_are_rejected_on_the_hard_negatives_family():
    problem = find_problem("infonce")
    shape = problem.shape("cold_temperature")
    seed = problem.seed_for_trial(6000, problem.family_names.index("hard_negatives"))
    q, p, n = problem.make_inputs(shape, seed, "cpu")
    truth = reference_output(problem, shape, [q, p, n], "cpu")
    temperature = problem.constants(shape)["TEMPERATURE"]
    every16 = _infonce(q, p, n[::16], temperature, lambda a, b: a @ b.t() + math.log(n.shape[0] / n[::16].shape[0]) * temperature)
    assert not check_output(every16, truth, torch.float32, problem.tolerance_for(shape.dtype)).ok


def _ce_rows(x, targets):
    x = x.float()
    return torch.logsumexp(x, dim=1) - x.gather(1, targets.view(-1, 1)).squeeze(1)


@pytest.mark.parametrize("family", ["plain", "spread_rows"])
def test_cross_entropy_row_subsample_is_rejected_at_bf16_with_a_float32_output(family):
    problem = find_problem("cross_entropy")
    shape = problem.shape("mid_bf16")
    out_dtype = problem.output_dtype(shape)
    assert out_dtype == torch.float32
    tolerance = problem.tolerance_for(shape.dtype)
    seed = problem.seed_for_trial(7000, problem.family_names.index(family))
    logits, targets = problem.make_inputs(shape, seed, "cpu")
    truth = reference_output(problem, shape, [logits, targets], "cpu")
    honest = _ce_rows(logits, targets).mean()
    sixteenth = _ce_rows(logits[::16], targets[::16]).mean()
    assert check_output(honest, truth, out_dtype, tolerance).ok
    assert check_output(native_reference(problem, shape, [logits, targets], "cpu"), truth, out_dtype, tolerance).ok
    assert not check_output(sixteenth, truth, out_dtype, tolerance).ok
    # the honest loss in bf16 is now the wrong dtype, and its 8 bits miss the tolerance anyway
    assert check_output(honest.bfloat16(), truth, out_dtype, tolerance).rule == "bad-output"
    assert not check_output(honest.bfloat16().float(), truth, out_dtype, tolerance).ok


def test_scalar_within_atol_passes_relative_rule():
    """A loss near zero keeps no relative accuracy in fp32: an absolute error within atol passes, zeros for a
    loss of ordinary size do not."""
    tolerance = {"atol": 1e-6, "rtol": 2e-5, "rel_l2": 2e-5}
    assert check_output(torch.tensor(0.0), torch.tensor(3e-30, dtype=torch.float64), torch.float32, tolerance).ok
    assert not check_output(torch.tensor(0.0), torch.tensor(0.25, dtype=torch.float64), torch.float32, tolerance).ok
    assert not check_output(torch.tensor(1.0001), torch.tensor(1.0, dtype=torch.float64), torch.float32, tolerance).ok


def test_check_output_in_slices_gives_the_same_verdict(monkeypatch):
    ref = _softmax_case(n=5000, rows=7)
    noisy = (ref * (1 + 3e-4 * torch.randn_like(ref))).float()
    nan = ref.float().clone()
    nan[3, 17] = float("nan")
    poison = ref.float().clone()
    poison.view(-1)[100:200].view(torch.int32).fill_(-1)
    cases = [ref.float(), noisy, nan, poison, torch.zeros_like(ref, dtype=torch.float32)]
    whole = [check_output(c, ref, torch.float32, FP32) for c in cases]
    monkeypatch.setattr(correctness, "CHECK_CHUNK", 999)
    sliced = [check_output(c, ref, torch.float32, FP32) for c in cases]
    for a, b in zip(whole, sliced):
        assert (a.ok, a.rule) == (b.ok, b.rule)
        assert a.max_abs == pytest.approx(b.max_abs) and a.rel_l2 == pytest.approx(b.rel_l2, rel=1e-9)
    assert [v.rule for v in whole] == ["", "wrong-output", "wrong-output", "uninitialised-output", "wrong-output"]
