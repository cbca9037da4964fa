"""Verdicts on one output: compared with a float64 reference, in the checker's process only.

An output passes when it is a plain tensor of the reference's shape, dtype and device, its NaN and
inf positions match, every element is within atol + rtol*|ref|, AND its relative L2 error is small:
the last rule is what makes all-zeros or a constant fail even where every element is below atol. For a
one-element output (a loss) the last rule is a relative error bound that an absolute error within atol
also meets.
"""
from __future__ import annotations

import dataclasses

import torch

from .problem import Problem, Shape

# Byte patterns the worker fills freed memory with; an output made of them was never written.
POISON_BYTE = 0xFF


@dataclasses.dataclass
class Verdict:
    ok: bool
    rule: str = ""
    reason: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0
    rel_l2: float = 0.0

    def summary(self) -> dict:
        return {"max_abs": self.max_abs, "max_rel": self.max_rel, "rel_l2": self.rel_l2}


def reference_output(problem: Problem, shape: Shape, inputs: list, device) -> torch.Tensor:
    """The reference model run on float64 copies of the inputs (the 'higher precision' truth)."""
    model = problem.make_reference(shape, device).to(torch.float64)
    upcast = [x.to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    with torch.no_grad():
        return model(*upcast)


def native_reference(problem: Problem, shape: Shape, inputs: list, device) -> torch.Tensor:
    """The reference model at the problem's dtype: what eager PyTorch returns."""
    with torch.no_grad():
        return problem.make_reference(shape, device)(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])


def _all_poison(values: torch.Tensor) -> torch.Tensor:
    if values.element_size() not in (1, 2, 4, 8):
        return torch.zeros_like(values, dtype=torch.bool)
    as_int = values.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[values.element_size()])
    pattern = 0xFF if values.element_size() == 1 else -1
    return as_int == pattern


# Elements compared per slice: the float64 temporaries of one slice take about 1 GB, whatever the output's size
# (a 4096 x 393216 softmax compared at once would need about 80 GB of them).
CHECK_CHUNK = 1 << 24


def check_output(output, expected: torch.Tensor, expected_dtype: torch.dtype, tolerance: dict) -> Verdict:
    """Compare one output with the float64 reference `expected` (whose dtype is float64). `expected_dtype` is
    the dtype a correct output has: `problem.output_dtype(shape)`."""
    if type(output) is not torch.Tensor:  # noqa: E721 - subclasses are exactly what we refuse
        return Verdict(False, "bad-output", f"returned {type(output).__module__}.{type(output).__qualname__}, not a plain torch.Tensor")
    if output.shape != expected.shape:
        return Verdict(False, "bad-output", f"shape {tuple(output.shape)}, expected {tuple(expected.shape)}")
    if output.dtype != expected_dtype:
        return Verdict(False, "bad-output", f"dtype {output.dtype}, expected {expected_dtype}")
    if output.device.type != expected.device.type:
        return Verdict(False, "bad-output", f"on {output.device}, expected {expected.device.type}")
    if output.numel() and 0 in output.stride():
        return Verdict(False, "bad-output", "output is a broadcast view (a stride is 0), not a materialised result")

    flat_out = output.detach().reshape(-1)
    flat_want = expected.reshape(-1)
    poison_extra = nan_extra = nan_got_count = nan_want_count = bad_count = 0
    nan_differ = inf_differ = False
    max_abs = max_rel = sum_sq_diff = sum_sq_want = 0.0
    for start in range(0, flat_out.numel(), CHECK_CHUNK):
        raw = flat_out[start:start + CHECK_CHUNK]
        got = raw.to(torch.float64)
        want = flat_want[start:start + CHECK_CHUNK].to(got.device, torch.float64)
        nan_got, nan_want, finite_want = torch.isnan(got), torch.isnan(want), torch.isfinite(want)
        diff = (got - want).abs().where(finite_want, 0.0)
        scale = want.abs().where(finite_want, 0.0)
        # Every figure of the chunk in one tensor, read with one synchronisation (a check of a 6 GB output is
        # ~100 chunks: a read per figure made the host wait ten times a chunk)
        figures = torch.stack([
            (nan_got & ~nan_want).sum(), nan_got.sum(), nan_want.sum(), (nan_got != nan_want).sum(),
            ((torch.isinf(got) | torch.isinf(want)) & (got != want)).sum(),  # an inf where none is due, or of the wrong sign
            diff.max(), (diff / scale.clamp_min(1e-30)).max(), scale.square().sum(), diff.square().sum(),
            (diff > tolerance["atol"] + tolerance["rtol"] * scale).sum(),
        ])
        extra, nan_got_n, nan_want_n, nan_mismatch, inf_mismatch, chunk_abs, chunk_rel, sq_want, sq_diff, bad = figures.tolist()
        if extra:
            nan_extra += 1
            poison_extra += int((_all_poison(raw) & ~nan_want).sum())
        del got, want, nan_got, nan_want, finite_want, diff, scale, figures
        nan_got_count += int(nan_got_n)
        nan_want_count += int(nan_want_n)
        nan_differ = nan_differ or nan_mismatch > 0
        inf_differ = inf_differ or inf_mismatch > 0
        max_abs, max_rel = max(max_abs, chunk_abs), max(max_rel, chunk_rel)
        sum_sq_want += sq_want
        sum_sq_diff += sq_diff
        bad_count += int(bad)

    if nan_extra and poison_extra:
        return Verdict(False, "uninitialised-output", f"{poison_extra} of {output.numel()} elements hold the poison pattern of freed memory (never written)")
    if nan_differ:
        return Verdict(False, "wrong-output", f"NaN positions differ ({nan_got_count} NaN in output, {nan_want_count} in reference)")
    if inf_differ:
        return Verdict(False, "wrong-output", "inf positions or signs differ from the reference")

    norm_want, norm_diff = sum_sq_want ** 0.5, sum_sq_diff ** 0.5
    rel_l2 = norm_diff / norm_want if norm_want > 0 else (0.0 if norm_diff <= tolerance["atol"] else float("inf"))
    verdict = Verdict(True, max_abs=max_abs, max_rel=max_rel, rel_l2=rel_l2)
    if bad_count:
        verdict.ok, verdict.rule = False, "wrong-output"
        verdict.reason = (f"{bad_count} of {output.numel()} elements outside atol={tolerance['atol']:g} rtol={tolerance['rtol']:g} "
                          f"(max abs err {max_abs:.3g}, max rel err {max_rel:.3g})")
    elif rel_l2 > tolerance["rel_l2"] and not (output.numel() == 1 and max_abs <= tolerance["atol"]):
        # (A single element within atol passes: a loss near zero, such as a cross-entropy whose target
        # dominates its row, keeps no relative accuracy in an honest fp32 computation.)
        verdict.ok, verdict.rule = False, "wrong-output"
        verdict.reason = f"relative L2 error {rel_l2:.3g} > {tolerance['rel_l2']:g} (max abs err {max_abs:.3g})"
    return verdict


def inputs_unchanged(originals: list, after: list) -> str:
    """'' when every input after the call equals (bit for bit) the input the checker drew."""
    if len(originals) != len(after):
        return f"{len(after)} inputs came back, {len(originals)} were drawn"
    for i, (a, b) in enumerate(zip(originals, after)):
        if isinstance(a, torch.Tensor):
            if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
                return f"input {i} changed shape or dtype"
            if not torch.equal(a, b.to(a.device)):
                if a.is_floating_point():
                    changed = int((a != b.to(a.device)).sum() - (a.isnan() & b.to(a.device).isnan()).sum())
                    if changed == 0:
                        continue
                else:
                    changed = int((a != b.to(a.device)).sum())
                return f"input {i} differs in {changed} of {a.numel()} elements from what the checker drew"
    return ""


@dataclasses.dataclass
class SelfCheckLine:
    shape: str
    case: str
    expected: str
    got: str
    family: str = ""

    @property
    def ok(self) -> bool:
        return self.expected == self.got


# Inputs larger than this are left out of a self-check on the CPU (a float64 reference of them is slow there).
CPU_SELF_CHECK_BYTES = 64e6


def self_check(problem: Problem, device, seed: int = 1234, max_bytes: float | None = None) -> list:
    """Prove the tolerances discriminate: on every correctness shape and in every input family the eager
    reference at the problem's dtype passes, while zeros, a constant and the reference's output for other
    inputs fail. Where the output does not depend on the input at all (softmax of width 1), only zeros can
    be told apart. Shapes whose inputs exceed `max_bytes` are left out (default: none on a GPU,
    CPU_SELF_CHECK_BYTES elsewhere)."""
    if max_bytes is None:
        max_bytes = float("inf") if torch.device(device).type == "cuda" else CPU_SELF_CHECK_BYTES
    lines = []
    for shape in problem.shapes_for("correctness"):
        if problem.bytes_moved(shape) > max_bytes:
            continue
        tolerance = problem.tolerance_for(shape.dtype)
        out_dtype = problem.output_dtype(shape)
        for index, family in enumerate(problem.family_names):
            trial_seed = problem.seed_for_trial(seed, index)
            lines += _self_check_one(problem, shape, device, trial_seed, tolerance, out_dtype, family)
    return lines


def _self_check_one(problem, shape, device, seed, tolerance, out_dtype, family) -> list:
    inputs = problem.make_inputs(shape, seed, device)
    truth = reference_output(problem, shape, inputs, device)
    native = native_reference(problem, shape, inputs, device)
    del inputs
    other = problem.make_inputs(shape, seed + len(problem.family_names), device)  # same family, other values
    other_truth = native_reference(problem, shape, other, device)
    del other
    cases = {
        "eager reference": (lambda: native, "pass"),
        "zeros": (lambda: torch.zeros_like(native), "fail"),
        "constant (mean of other output)": (lambda: torch.full_like(native, float(other_truth.double().mean())), "fail"),
        "reference output for other inputs": (lambda: other_truth, "fail"),
    }
    if torch.equal(native, other_truth):
        del cases["constant (mean of other output)"], cases["reference output for other inputs"]
    lines = []
    for case, (make, expected) in cases.items():
        verdict = check_output(make(), truth, out_dtype, tolerance)
        lines.append(SelfCheckLine(shape.name, case, expected, "pass" if verdict.ok else "fail", family))
    return lines
