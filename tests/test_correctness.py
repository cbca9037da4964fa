"""The checker's verdicts, true and false, and the self-check of every shipped problem."""
import pytest
import torch

from harness.correctness import check_output, inputs_unchanged, self_check
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
    lines = self_check(find_problem(name), "cpu")
    assert lines and all(line.ok for line in lines), [l for l in lines if not l.ok]
    cases = {line.case for line in lines}
    assert {"eager reference", "zeros", "constant (mean of other output)", "reference output for other inputs"} <= cases
