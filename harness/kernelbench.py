"""KernelBench problem files as they are: the one module that knows their format.

A KernelBench file is a module with `Model`, module-level size constants (`batch_size = 16`, `dim = 16384`),
`get_inputs()` (tensors, usually built on the CPU) and `get_init_inputs()` (Model's constructor arguments). No
problem.yaml goes with it: `describe` measures the file and returns the mapping a problem.yaml would hold:

- one shape, `default`: the module's constants as they are, used for correctness and timing;
- one smaller correctness shape, `small`, where one exists: every integer constant of at least SCALE_FROM (inside
  tuples too) divided by the least power of two that brings the bytes moved under SMALL_BYTES, kept only if the
  reference runs on it for real; kernel sizes, strides and axes (small integers) stay;
- per shape, its measured cost: bytes of the inputs, parameters and output (the output's are the bytes written)
  and flops from torch's FlopCounterMode (matrix products and convolutions; element-wise work counts none),
  measured on the meta device (nothing is allocated), or for real on the CPU where meta cannot run the module;
- tolerances by output dtype (problem.DEFAULT_TOLERANCE; integer outputs compare exactly);
- core_aten_ops: the aten ops the reference dispatches (its forward under AtenOpRecorder and the profiler, on
  the meta device and for real on the CPU at the small shape, or at the default where there is none), less
  views, copies, casts and allocations (problem.TRIVIAL_OPS), plus the patterns of each OP_FAMILIES family
  they touch (a fused attention op for a softmax, a conv or mkldnn linear for a matrix product);
- custom: partial (KernelBench lets a solution keep some of the reference's ops) and init_seed, so that Model in
  the parent and ModelNew in the child draw the same parameters.

`problem_from_file` is that description as a Problem, in memory (`eval path/to/23_Softmax.py`); `import_suite`
writes it as DST/<stem>/problem.yaml beside a copy of the file (reference.py), leaving the file untouched.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import os
import shutil
import sys
import uuid
from pathlib import Path

import torch
import yaml

from .problem import (DEFAULT_TOLERANCE, DTYPES, OUTPUT_DTYPES, ProblemError, is_trivial, load_module, load_problem,
                      module_constants, problem_from_spec)

# A derived correctness shape moves at most this many bytes (inputs, parameters and output).
SMALL_BYTES = 1 << 20
# Integer constants at least this large are sizes a derived shape scales down, and never below this.
SCALE_FROM = 16
# Largest power of two a derived shape divides the sizes by.
MAX_FACTOR_LOG2 = 20
# torch's generators are seeded with this before Model and ModelNew are built (their parameters then agree).
INIT_SEED = 0
# The default shape runs for real on the CPU, for the ops the CPU dispatches (a fused attention op, where the meta
# device sees a decomposition), when it moves at most this many bytes and has no small shape that would show them.
REAL_RUN_BYTES = 256 << 20
# A reference op of one of these families brings the family's patterns into core_aten_ops: the same computation
# under the names other backends and fused kernels give it (attention computes a softmax inside; a 1x1 conv or a
# linear layer is a matrix product).
OP_FAMILIES = (
    (("*softmax*", "*attention*", "*logsumexp*"), ("*softmax*", "*logsumexp*", "*logcumsumexp*", "*attention*")),
    (("mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "einsum", "mv", "addmv", "dot", "tensordot"),
     ("mm", "bmm", "addmm", "baddbmm", "addbmm", "*matmul*", "*linear*", "einsum", "mv", "addmv", "dot", "vdot", "tensordot",
      "_addmm_activation", "mkldnn_*", "*_mm", "*_bmm")),
    (("*conv*",), ("*conv*", "mkldnn_*")),
    (("sum", "mean", "nansum", "nanmean"), ("sum", "nansum", "mean", "nanmean")),
)


class KernelBenchError(ProblemError):
    """A file that is not a usable KernelBench problem; the message says why."""


@dataclasses.dataclass
class Measurement:
    bytes_read: int  # inputs and parameters
    bytes_written: int  # the output
    flops: int
    output_dtype: str
    output_numel: int
    input_dtype: str  # the floating inputs' dtype (float32 where there is none)
    ops: frozenset  # aten op names the forward dispatched

    @property
    def cost(self) -> dict:
        return {"bytes": self.bytes_read + self.bytes_written, "bytes_written": self.bytes_written, "flops": self.flops}


def is_kernelbench_file(path) -> bool:
    return Path(path).suffix == ".py" and Path(path).is_file()


def _import(path: Path):
    name = f"harness_kernelbench_{uuid.uuid4().hex[:12]}"
    try:
        return load_module(path, name)
    except Exception as error:  # noqa: BLE001 - any failure to import is the file's
        raise KernelBenchError(f"{path.name}: does not import ({_first_line(error)})") from None
    finally:
        sys.modules.pop(name, None)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:200]}" if text else type(error).__name__


def _nbytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def _dtype_name(dtype: torch.dtype, table: dict) -> str | None:
    return next((name for name, d in table.items() if d == dtype), None)


def measure(module, overrides: dict, device: str) -> Measurement:
    """Build Model and its inputs with `overrides` set on the module, run forward once on `device` (meta: shapes
    only) and measure it. The module's constants and torch's generators are left as they were."""
    saved = {name: getattr(module, name) for name in overrides}
    try:
        for name, value in overrides.items():
            setattr(module, name, tuple(value) if isinstance(saved[name], tuple) and isinstance(value, list) else value)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(INIT_SEED)
            with torch.device(device):
                model = module.Model(*module.get_init_inputs())
                inputs = list(module.get_inputs())
            inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
            parameters = []
            if isinstance(model, torch.nn.Module):
                model = model.to(device).eval()
                parameters = list(model.parameters()) + list(model.buffers())
            return _run(model, inputs, parameters, device)
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def _run(model, inputs: list, parameters: list, device: str) -> Measurement:
    """One forward, measured: bytes, flops, the output's and inputs' dtypes, and the aten ops: those it dispatches
    (AtenOpRecorder) and, on a real device, those the profiler sees (composite ones too: aten::linear beside
    aten::addmm). On meta the profiler would see the Python decompositions of the meta kernels (exp, sum, where:
    no op of the problem's), so it is not used there."""
    import contextlib

    from torch.utils.flop_counter import FlopCounterMode

    from .integrity import AtenOpRecorder

    recorder = AtenOpRecorder()
    if device == "meta":
        trace = contextlib.nullcontext()
    else:
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # the profiler would print its start and stop
        from torch.profiler import ProfilerActivity, profile

        trace = profile(activities=[ProfilerActivity.CPU])
    with torch.no_grad(), trace as traced, FlopCounterMode(display=False) as counter, recorder:
        out = model(*inputs)
    if not isinstance(out, torch.Tensor):
        raise KernelBenchError(f"forward returns {type(out).__name__}, not one tensor: the harness checks a single output")
    out_dtype = _dtype_name(out.dtype, OUTPUT_DTYPES)
    if out_dtype is None:
        raise KernelBenchError(f"forward returns {out.dtype}, which the harness does not compare ({', '.join(OUTPUT_DTYPES)})")
    floating = {x.dtype for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()}
    if len(floating) > 1:
        raise KernelBenchError(f"get_inputs gives floating tensors of several dtypes ({', '.join(sorted(map(str, floating)))}): "
                               "a shape has one dtype")
    dtype = floating.pop() if floating else torch.float32
    in_dtype = _dtype_name(dtype, DTYPES)
    if in_dtype is None:
        raise KernelBenchError(f"get_inputs gives {dtype} tensors; the harness draws {', '.join(DTYPES)}")
    ops = set(recorder.ops)
    if traced is not None:
        ops |= {e.name[len("aten::"):] for e in traced.events() if e.name.startswith("aten::")}
    return Measurement(_nbytes(inputs) + _nbytes(parameters), _nbytes([out]), int(counter.get_total_flops()), out_dtype,
                       out.numel(), in_dtype, frozenset(ops))


def _measure_anywhere(module, overrides: dict) -> Measurement:
    """On the meta device (no memory, no time), or for real on the CPU where meta cannot run the module."""
    try:
        return measure(module, overrides, "meta")
    except KernelBenchError:
        raise
    except Exception:  # noqa: BLE001 - data-dependent ops and the like: run it for real
        return measure(module, overrides, "cpu")


def core_ops(ops) -> list:
    """The non-trivial ops, and the patterns of each OP_FAMILIES family one of them belongs to."""
    core = {op for op in set(ops) if not is_trivial(op)}
    for members, patterns in OP_FAMILIES:
        if any(fnmatch.fnmatchcase(op, member) for op in core for member in members):
            core |= set(patterns)
    return sorted(core)


def scaled(constants: dict, factor: int) -> dict:
    """The constants that change when every integer of at least SCALE_FROM (in tuples too) is divided by `factor`."""
    def one(value):
        if isinstance(value, int) and not isinstance(value, bool) and value >= SCALE_FROM:
            return max(SCALE_FROM, value // factor)
        return value

    changed = {}
    for name, value in constants.items():
        if isinstance(value, (tuple, list)):
            new = [one(v) for v in value]
            if new != list(value):
                changed[name] = new
        elif one(value) != value:
            changed[name] = one(value)
    return changed


def _small_shape(module, constants: dict, default: Measurement) -> tuple | None:
    """(overrides, measurement) of the least reduction under SMALL_BYTES on which the reference runs for real on the
    CPU with a non-empty output of the default's dtype; None where none does or the default is small already."""
    if default.cost["bytes"] <= SMALL_BYTES:
        return None  # (describe runs the default for real instead)
    previous = None
    for log2 in range(1, MAX_FACTOR_LOG2 + 1):
        overrides = scaled(constants, 1 << log2)
        if not overrides or overrides == previous:  # nothing to scale, or every size is at SCALE_FROM already
            return None
        previous = overrides
        try:
            estimate = _measure_anywhere(module, overrides)
        except Exception:  # noqa: BLE001 - not a valid shape of the module: reduce further or give up
            continue
        if estimate.cost["bytes"] > SMALL_BYTES:
            continue
        try:
            real = measure(module, overrides, "cpu")
        except Exception:  # noqa: BLE001
            continue
        if real.output_numel and real.output_dtype == default.output_dtype and real.input_dtype == default.input_dtype:
            return overrides, real
    return None


def _tolerance(output_dtype: str) -> dict:
    if output_dtype in DEFAULT_TOLERANCE:
        return dict(DEFAULT_TOLERANCE[output_dtype])
    if output_dtype in DTYPES:  # float64: float32's bounds
        return dict(DEFAULT_TOLERANCE["float32"])
    return {"atol": 0.0, "rtol": 0.0, "rel_l2": 0.0}  # integers and booleans: exactly


def _description(module, stem: str) -> str:
    doc = (getattr(module.Model, "__doc__", None) or "").strip()
    first = doc.splitlines()[0].strip() if doc else ""
    return f"{first} (KernelBench file {stem}.py)" if first else f"KernelBench file {stem}.py"


def describe(path) -> dict:
    """The problem.yaml mapping of a KernelBench file (see the module's docstring). KernelBenchError says why a
    file cannot be one."""
    path = Path(path)
    module = _import(path)
    missing = [name for name in ("Model", "get_inputs", "get_init_inputs") if not callable(getattr(module, name, None))]
    if missing:
        raise KernelBenchError(f"{path.name}: defines no {', '.join(missing)}: not a KernelBench problem file")
    constants = module_constants(module)
    try:
        default = _measure_anywhere(module, {})
    except KernelBenchError as error:
        raise KernelBenchError(f"{path.name}: {error}") from None
    except Exception as error:  # noqa: BLE001 - the reference itself fails
        raise KernelBenchError(f"{path.name}: the reference does not run ({_first_line(error)})") from None
    shapes = [{"name": "default", "set": {}, "dtype": default.input_dtype, "use": ["correctness", "timing"], "default": True,
               "cost": default.cost}]
    ops = set(default.ops)
    small = _small_shape(module, constants, default)
    if small is not None:
        overrides, measured = small
        shapes.append({"name": "small", "set": overrides, "dtype": measured.input_dtype, "use": ["correctness"], "cost": measured.cost})
        ops |= measured.ops
    elif default.cost["bytes"] <= REAL_RUN_BYTES:  # run it for real on the CPU, for the ops the CPU dispatches
        try:
            ops |= measure(module, {}, "cpu").ops
        except Exception:  # noqa: BLE001 - runs on meta only (it calls .cuda()?): the dispatched ops must do
            pass
    return {
        "name": path.stem,
        "description": _description(module, path.stem),
        "reference": "reference.py",
        "custom": "partial",
        "init_seed": INIT_SEED,
        "core_aten_ops": core_ops(ops),
        "output_dtype": default.output_dtype,
        "tolerance": {default.input_dtype: _tolerance(default.output_dtype)},
        "shapes": shapes,
    }


_described: dict = {}


def problem_from_file(path):
    """The Problem of a KernelBench file, described in memory (once per process and version of the file). Its
    `directory` is the file itself: load_problem(directory) describes it again in the child's process."""
    path = Path(path).resolve()
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _described:
        _described[key] = describe(path)
    return problem_from_spec(_described[key], path, str(path), reference=path)


HEADER = """\
# Generated by `python -m harness import-suite` from the KernelBench-format file {source} (reference.py is a copy).
# The default shape is the file's constants as they are (correctness and timing); `small`, where present, scales its
# integer sizes down for a cheaper correctness check. Costs were measured by running the reference once; core_aten_ops
# are the aten ops its forward dispatched. custom: partial lets a solution keep some of them (its record is marked);
# set custom: full to require every op of the problem in kernels of its own.
"""


def problem_yaml(spec: dict, source: str) -> str:
    return HEADER.format(source=source) + yaml.safe_dump(spec, sort_keys=False, default_flow_style=None, width=120)


def import_file(source: Path, into: Path, force: bool = False) -> tuple:
    """Make into/<stem>/ of one KernelBench file: (True, what was made) or (False, why not)."""
    source = Path(source)
    target = Path(into) / source.stem
    if (target / "problem.yaml").exists() and not force:
        return False, f"{target} exists already (--force replaces it)"
    try:
        spec = describe(source)
    except KernelBenchError as error:
        return False, str(error).removeprefix(f"{source.name}: ")
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target / "reference.py")
    (target / "problem.yaml").write_text(problem_yaml(spec, source.name))
    try:
        problem = load_problem(target)
    except ProblemError as error:  # the description does not load back: never leave it behind
        shutil.rmtree(target, ignore_errors=True)
        return False, f"its generated problem.yaml does not load ({error})"
    shapes = "; ".join(f"{s.name}" + (f" ({', '.join(f'{k}={v}' for k, v in s.constants.items())})" if s.constants else "")
                       for s in problem.shapes)
    return True, f"{target}: shapes {shapes}; output {spec['output_dtype']}; core ops {', '.join(problem.core_aten_ops) or 'none'}"


def import_suite(source_dir, into, force: bool = False) -> list:
    """import_file for every *.py in source_dir (sorted, private _*.py aside): [(file name, ok, line)]."""
    source_dir = Path(source_dir)
    if not source_dir.is_dir():
        raise ProblemError(f"import-suite: {source_dir} is not a folder")
    files = sorted(p for p in source_dir.glob("*.py") if not p.name.startswith("_"))
    if not files:
        raise ProblemError(f"import-suite: {source_dir} holds no .py file")
    results = []
    for path in files:
        ok, line = import_file(path, Path(into), force)
        results.append((path.name, ok, line))
    return results
