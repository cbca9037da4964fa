"""Problems: a folder with a KernelBench-style reference module and a problem.yaml that describes it.

The harness changes a shape by overriding the reference module's size constants (module_defaults: every
upper-case name, and lower-case integers, floats and tuples of integers such as KernelBench's `batch_size`),
draws inputs with `get_inputs()` on the target device under a seed (tensors it builds elsewhere, such as
KernelBench's CPU tensors, move to the device; integer inputs keep their dtype), casts floating inputs to the
shape's dtype, and rescales/shifts them per trial so that kernels which assume tame inputs fail.

A KernelBench file as it is (Model, constants, get_inputs, get_init_inputs, no yaml) is a problem too:
load_problem(path/to/file.py) describes it in memory (harness/kernelbench.py); its Problem's `directory` is
then the file itself, which load_problem accepts in the child's process as well.

Input families (problem.yaml `vary_inputs.families`) rotate with the trial seed: trial seed s draws family
`s % len(families)`, so any len(families) consecutive seeds meet every family. A family is a list of
transforms (FAMILY_TRANSFORMS) that reshape the seed's inputs so that shortcuts show: a direction shared by
every vector (dot products with a large common part), a few rows scaled up (a loss dominated by rows or
negatives a subsample misses), and "low bits" (every float32 element sits a fixed fraction of a unit in
the last place above a value with 7 and with 10 significant mantissa bits, so converting it to bf16, fp16
or tf32 rounds every element down in magnitude: the errors of reduced-precision products add up instead
of averaging out, while 3xFP16/3xTF32 hi/lo splits stay exact).
"""
from __future__ import annotations

import dataclasses
import fnmatch
import functools
import importlib.util
import math
import sys
import types
from pathlib import Path

import torch
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
PROBLEMS_DIR = REPO_ROOT / "problems"
SOLUTIONS_DIR = REPO_ROOT / "solutions"

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
# Dtypes an output may have (`output_dtype`): DTYPES and the integer ones KernelBench's argmax returns. An output is
# compared under the tolerance of its shape's dtype (a KernelBench file's generated one is exact for integers).
OUTPUT_DTYPES = {**DTYPES, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}
DEFAULT_TOLERANCE = {
    "float32": {"atol": 1e-4, "rtol": 1e-4, "rel_l2": 1e-4},
    "float16": {"atol": 1e-2, "rtol": 1e-2, "rel_l2": 1e-2},
    "bfloat16": {"atol": 1e-2, "rtol": 1e-2, "rel_l2": 1e-2},
}
USES = {"correctness", "timing"}
# custom: full (the default): forward may not dispatch the problem's core aten ops. partial (KernelBench's rule): it
# may call some of them beside kernels of its own; such a record is marked `uses_reference_ops`. Under both, a
# forward that launches no kernel of its own is rejected.
CUSTOM_POLICIES = ("full", "partial")
# aten ops that are no computation of the problem's: copies, casts, allocations, fills and shape bookkeeping
# (ops whose schema makes their output a view of an input count as well: is_trivial).
TRIVIAL_OPS = frozenset({
    "copy_", "_to_copy", "to", "clone", "contiguous", "detach", "detach_", "lift", "lift_fresh", "lift_fresh_copy", "alias",
    "_copy_from", "_copy_from_and_resize", "set_", "resize_", "empty", "empty_like", "empty_strided", "new_empty",
    "new_empty_strided", "empty_permuted", "as_strided_", "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones",
    "full", "full_like", "new_full",
    "fill_", "zero_", "scalar_tensor", "arange", "item", "_local_scalar_dense", "resolve_conj", "resolve_neg", "reshape",
    "_reshape_alias", "_unsafe_view", "view_as", "reshape_as", "expand_as", "type_as", "flatten", "unflatten", "split",
    "split_with_sizes", "chunk", "unbind", "tensor_split", "size", "stride", "numel", "dim", "is_contiguous",
})
SHAPE_COST_KEYS = ("bytes", "bytes_written", "flops")
# Transforms an input family may apply, in this order: "common" and "scale_rows" before the per-trial scale
# and offset ("scales" replaces vary_inputs.scales for the family), "low_bits" after them (float32 shapes only: a
# cast to bf16 rounds its pattern away).
FAMILY_TRANSFORMS = ("common", "scale_rows", "scales", "low_bits")
# low_bits: the mantissa keeps its 7 leading bits (rounded to nearest); below them go the bits 0110 1110 0000 0000:
# the part below 7 bits is 0.43 of a bf16 ulp and the part below 10 bits is 0.4375 of an fp16/tf32 ulp. Round to
# nearest, toward zero and half-up truncation all round such an element down in magnitude, by 1.7e-3 to 3.4e-3
# (bf16) or 2.1e-4 to 4.3e-4 (fp16, tf32) relative, so a product of two loses 4e-4 to 9e-4 at tf32. The element
# moves by at most 0.93 bf16 ulp (0.7%). A 3xTF32/3xFP16 split stays exact: lo = 0.4375 ulp has 3 bits.
LOW_BITS_KEEP = 0xFFFF0000
LOW_BITS_PATTERN = 0x6E00
# Elements kept from the previous trial in a cache-probe trial (start and end of each input).
PROBE_EDGE = 256


class ProblemError(Exception):
    """A problem folder or its problem.yaml is malformed; the message says where and why."""


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    constants: dict
    dtype: str
    uses: frozenset
    default: bool = False
    output_dtype: str | None = None  # None: the problem's output_dtype, else the shape's dtype
    cost: dict | None = None  # measured {bytes, bytes_written, flops} of this shape, over the problem's expressions

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


@dataclasses.dataclass(frozen=True)
class External:
    """Another library's implementation, timed beside ours when its packages import."""
    name: str
    requires: tuple
    function: str


@dataclasses.dataclass
class Problem:
    name: str
    directory: Path
    description: str
    reference_path: Path
    tolerance: dict
    shapes: list
    vary_args: tuple
    vary_scales: tuple
    vary_offset: float
    cost_bytes: str
    cost_flops: str
    reference_ops: tuple
    core_aten_ops: tuple  # names, or fnmatch patterns ("*attention*")
    externals: list
    shared_constants: tuple = ()
    cost_bytes_written: str = ""
    families: tuple = ()  # of {"name": str, transform: parameters}; empty: one plain family
    default_output_dtype: str | None = None
    custom: str = "full"  # CUSTOM_POLICIES
    init_seed: int | None = None  # seeds torch before Model (parent) and ModelNew (child) are built: same parameters
    _module: object = None

    # --- shapes -------------------------------------------------------------------------
    def shape(self, name: str) -> Shape:
        for s in self.shapes:
            if s.name == name:
                return s
        raise ProblemError(f"{self.name}: no shape named {name!r}; shapes: {', '.join(s.name for s in self.shapes)}")

    def shapes_for(self, use: str, names=None) -> list:
        chosen = [s for s in self.shapes if use in s.uses]
        if names:
            chosen = [s for s in chosen if s.name in names]
        return chosen

    @property
    def default_shape(self) -> Shape:
        return next((s for s in self.shapes if s.default), self.shapes_for("timing")[0])

    def tolerance_for(self, dtype: str) -> dict:
        return self.tolerance[dtype]

    def output_dtype(self, shape: Shape) -> torch.dtype:
        """The dtype a correct output has: the shape's `output_dtype`, else the problem's, else the shape's
        dtype. (Cross-entropy at bf16 returns its loss in float32: a bf16 scalar keeps 8 bits.)"""
        return OUTPUT_DTYPES[shape.output_dtype or self.default_output_dtype or shape.dtype]

    # --- the reference's own ops ----------------------------------------------------------------
    def reference_ops_in(self, ops) -> list:
        """The ops among `ops` (aten's bare, others as namespace::op) that core_aten_ops names or matches: a
        pattern covers a family, such as every attention op, which computes a softmax inside. An op of torch's
        other namespaces is judged by its name (mkldnn::_linear_pointwise is a linear); a solution's own custom
        op (a namespace torch does not have) never is."""
        found = []
        for op in set(ops):
            namespace, _, name = op.rpartition("::")
            if namespace and namespace not in torch_namespaces():
                continue
            if any(fnmatch.fnmatchcase(name, entry) for entry in self.core_aten_ops):
                found.append(op)
        return sorted(found)

    def ops_beside_reference(self, ops) -> list:
        """The ops among `ops` that compute something and are not the reference's: the work a forward does itself
        (a solution's own custom ops included)."""
        used = set(self.reference_ops_in(ops))
        return sorted(op for op in set(ops) if op not in used and not is_trivial(op.rpartition("::")[2]))

    def core_op_names(self) -> list:
        """core_aten_ops with each pattern spelled out as the aten ops this torch has that match it."""
        known = [name.split("::", 1)[1].split(".", 1)[0] for name in _torch_op_names() if name.startswith("aten::")]
        return self.reference_ops_in(known + [entry for entry in self.core_aten_ops if not _is_pattern(entry)])

    # --- input families -------------------------------------------------------------------
    @property
    def family_names(self) -> list:
        return [f["name"] for f in self.families] or ["plain"]

    def family_index(self, seed: int) -> int:
        return seed % len(self.family_names)

    def family_of(self, seed: int) -> str:
        """The input family trial seed `seed` draws (families rotate with the seed)."""
        return self.family_names[self.family_index(seed)]

    def seed_for_trial(self, seed: int, trial: int) -> int:
        """`seed` moved up by less than the number of families so that it draws family `trial % n`: trials
        0..n-1 of a shape then meet every family although their seeds are unpredictable hashes."""
        n = len(self.family_names)
        return seed + (trial - seed) % n

    # --- cost -----------------------------------------------------------------------------
    def _evaluate(self, expression: str, shape: Shape) -> float:
        names = {**self.constants(shape), "elem": torch.empty((), dtype=shape.torch_dtype).element_size(), "math": math}
        return float(eval(expression, {"__builtins__": {}}, names))  # problem files are trusted

    def _cost(self, key: str, expression: str, shape: Shape) -> float:
        """A shape's own measured figure (its `cost` in problem.yaml) where it has one, else the expression."""
        if shape.cost and key in shape.cost:
            return float(shape.cost[key])
        return self._evaluate(expression, shape) if expression else 0.0

    def bytes_moved(self, shape: Shape) -> float:
        return self._cost("bytes", self.cost_bytes, shape)

    def flops(self, shape: Shape) -> float:
        return self._cost("flops", self.cost_flops, shape)

    def bytes_written(self, shape: Shape) -> float:
        """The written part of bytes_moved (the rest is read): the physics floor bounds reads by the read
        ceiling and writes by what they cost in a copy."""
        return self._cost("bytes_written", self.cost_bytes_written, shape)

    # --- the reference module -----------------------------------------------------------
    @property
    def module(self):
        if self._module is None:
            self._module = load_module(self.reference_path, f"harness_problem_{self.name}")
            sys.modules.pop(f"harness_problem_{self.name}", None)  # no solution finds the reference by name
            self._defaults = module_constants(self._module)
        return self._module

    def module_defaults(self) -> dict:
        """The reference module's constants as imported (module_constants)."""
        self.module  # noqa: B018 - importing records them
        return self._defaults

    def constants(self, shape: Shape) -> dict:
        return {**self.module_defaults(), **shape.constants}

    def apply_constants(self, shape: Shape, *modules) -> None:
        """Set the shape's constants on the reference module. A solution module gets only the
        `shared_constants` (what Model's constructor reads, like InfoNCE's TEMPERATURE), never the
        sizes: those it must take from its inputs."""
        values = self.constants(shape)
        defaults = self.module_defaults()
        for name, value in values.items():
            if isinstance(defaults.get(name), tuple) and isinstance(value, list):
                value = tuple(value)  # yaml has lists only: `input_shape: [512]` for KernelBench's (4096,)
            setattr(self.module, name, value)
        for module in modules:
            for name in self.shared_constants:
                if hasattr(module, name):
                    setattr(module, name, values[name])
        if self.init_seed is not None:
            # Model (in the parent) and ModelNew (in the child) are built right after this, each from a generator
            # seeded alike, so their parameters agree. The seed is public; the inputs' seeds never leave the parent.
            # Not torch.manual_seed: before CUDA is initialised it queues the CUDA seeding with a traceback of the
            # caller, a frame read that the child's guard rejects while a solution runs.
            torch.default_generator.manual_seed(self.init_seed)
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.manual_seed_all(self.init_seed)

    def make_reference(self, shape: Shape, device):
        self.apply_constants(shape)
        model = self.module.Model(*self.module.get_init_inputs())
        return model.to(device) if isinstance(model, torch.nn.Module) else model

    def make_inputs(self, shape: Shape, seed: int, device, probe_from: int | None = None) -> list:
        """Inputs for one trial. With probe_from, the start and end of each input (and all integer
        inputs) are those of trial `probe_from`: a cache keyed on a few elements would hit."""
        inputs = self._draw(shape, seed, device)
        if probe_from is not None:
            previous = self._draw(shape, probe_from, device)
            for new, old in zip(inputs, previous):
                if not isinstance(new, torch.Tensor):
                    continue
                if not new.is_floating_point():
                    new.copy_(old)
                    continue
                flat_new, flat_old = new.view(-1), old.view(-1)
                k = min(PROBE_EDGE, flat_new.numel() // 4)
                if k:
                    flat_new[:k] = flat_old[:k]
                    flat_new[-k:] = flat_old[-k:]
        return inputs

    def _draw(self, shape: Shape, seed: int, device) -> list:
        self.apply_constants(shape)
        torch.manual_seed(seed)
        with torch.device(device):
            raw = list(self.module.get_inputs())
        raw = [x.to(device) if isinstance(x, torch.Tensor) else x for x in raw]
        family = self.families[self.family_index(seed)] if self.families else {}
        # The family's own generator: the plain family's inputs are those of the harness before families.
        family_rng = torch.Generator().manual_seed(seed ^ 0xFA3117)
        if "common" in family:
            _add_common_direction(raw, family["common"], family_rng)
        if "scale_rows" in family:
            _scale_rows(raw, family["scale_rows"], family_rng)
        variation = torch.Generator().manual_seed(seed ^ 0x5EED)
        out = []
        for index, x in enumerate(raw):
            if isinstance(x, torch.Tensor):
                if x.is_floating_point():
                    if index in self.vary_args:
                        scales = family.get("scales", self.vary_scales)
                        stratum = (seed + index) % len(scales)
                        jitter = 0.9 + 0.2 * torch.rand((), generator=variation).item()
                        offset = (2 * torch.rand((), generator=variation).item() - 1) * self.vary_offset
                        x = x.float() * (scales[stratum] * jitter) + offset
                    if "low_bits" in family and index in family["low_bits"]["args"] and shape.torch_dtype == torch.float32:
                        x = low_bits(x.float())
                    x = x.to(shape.torch_dtype)
                x = x.contiguous()
            out.append(x)
        return out


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)


def _add_common_direction(inputs: list, spec: dict, rng: torch.Generator) -> None:
    """One random unit vector c (over the last dimension) shared by the listed inputs: every row x becomes
    x + weight*|x|*c, rescaled to |x|. Dot products between rows then share a large common part (weight 3:
    about 0.9 of |x||y|) while their differences stay small."""
    dims = {inputs[i].shape[-1] for i in spec["args"]}
    if len(dims) != 1:
        raise ProblemError(f"common: inputs {spec['args']} must share their last dimension")
    c = torch.randn(dims.pop(), generator=rng, dtype=torch.float64)
    c = c / c.norm().clamp_min(1e-30)
    for i in spec["args"]:
        x = inputs[i]
        rows = _rows(x).float()
        norms = rows.norm(dim=1, keepdim=True)
        y = rows + spec["weight"] * norms * c.to(rows.device, torch.float32)
        y = y * (norms / y.norm(dim=1, keepdim=True).clamp_min(1e-30))
        inputs[i] = y.reshape(x.shape).to(x.dtype)


def _scale_rows(inputs: list, spec: dict, rng: torch.Generator) -> None:
    """A few rows (at random positions) of one input multiplied by `gain`: with a common direction these
    are hard negatives every query ranks first; for logits, rows of wide spread whose losses dominate the
    mean. Either way a kernel that skips rows or subsamples them misses them."""
    x = inputs[spec["arg"]]
    rows = _rows(x)
    count = min(rows.shape[0], max(int(spec.get("count", 0)), math.ceil(spec.get("fraction", 0.0) * rows.shape[0])))
    chosen = torch.randperm(rows.shape[0], generator=rng)[:count].to(rows.device)
    rows = rows.contiguous()  # a fresh draw: scaled in place (a copy only if get_inputs gave a strided view)
    rows[chosen] = rows[chosen] * spec["gain"]
    inputs[spec["arg"]] = rows.reshape(x.shape)


def low_bits(x: torch.Tensor) -> torch.Tensor:
    """float32 x with every normal element's mantissa set to LOW_BITS_PATTERN below its 7 leading bits (see
    LOW_BITS_PATTERN). Zeros, subnormals, infinities and NaN stay as they are."""
    bits = x.contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    magnitude = bits & 0x7FFFFFFF
    moved = ((magnitude + 0x8000) & _as_int32(LOW_BITS_KEEP)) | LOW_BITS_PATTERN
    changed = (exponent > 0) & (exponent < 254)
    return torch.where(changed, (bits & _as_int32(0x80000000)) | moved, bits).view(torch.float32)


def _as_int32(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


def module_constants(module) -> dict:
    """What a shape may override: every upper-case module-level name (this harness's convention), and the
    lower-case ones holding an integer, a float or a tuple/list of integers (KernelBench's `batch_size`, `dim`,
    `input_shape`). Private names (_x), classes, functions and modules are not constants."""
    found = {}
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, (type, types.ModuleType)) or callable(value):
            continue  # `import torch.nn.functional as F` is no constant
        if name.isupper() or _is_number(value) or (isinstance(value, (tuple, list)) and value and all(_is_int(v) for v in value)):
            found[name] = value
    return found


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return _is_int(value) or isinstance(value, float)


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=1)
def _torch_op_names() -> tuple:
    """Every op torch itself registers (namespace::name), read once, before any solution loads in this process."""
    return tuple(torch._C._dispatch_get_all_op_names())


@functools.lru_cache(maxsize=1)
def torch_namespaces() -> frozenset:
    """The op namespaces torch itself registers (aten, prims, mkldnn, quantized...); the child's seals read them
    first, before the solution loads, so a namespace of the solution's own is never among them."""
    return frozenset(name.split("::", 1)[0] for name in _torch_op_names())


def is_trivial(op: str) -> bool:
    """True for an aten op that computes nothing of the problem: TRIVIAL_OPS, or one whose output is a view."""
    if op in TRIVIAL_OPS:
        return True
    try:
        packet = getattr(torch.ops.aten, op)
        return any(getattr(packet, overload).is_view for overload in packet.overloads())
    except Exception:  # noqa: BLE001 - a profiler name that is no aten op of this build
        return False


def _is_pattern(entry: str) -> bool:
    return any(c in entry for c in "*?[")


def _require(mapping, key, kind, where):
    if key not in mapping:
        raise ProblemError(f"{where}: missing required key {key!r}")
    value = mapping[key]
    if not isinstance(value, kind):
        raise ProblemError(f"{where}: {key!r} must be {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
    return value


def load_problem(directory) -> Problem:
    """The problem in a folder holding problem.yaml, or a KernelBench-format .py file described in memory."""
    directory = Path(directory)
    if directory.suffix == ".py" and directory.is_file():
        from .kernelbench import problem_from_file

        return problem_from_file(directory)
    where = str(directory / "problem.yaml")
    if not (directory / "problem.yaml").is_file():
        raise ProblemError(f"{where}: not found")
    try:
        spec = yaml.safe_load((directory / "problem.yaml").read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        what = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ProblemError(f"{where}{at}: not valid YAML: {what}") from None
    return problem_from_spec(spec, directory, where)


def problem_from_spec(spec, directory: Path, where: str, reference: Path | None = None) -> Problem:
    """The Problem a problem.yaml's mapping describes; `where` names it in errors. `reference`, when given,
    is the reference module (a KernelBench file described in memory), whatever spec's `reference` says."""
    if not isinstance(spec, dict):
        raise ProblemError(f"{where}: must be a mapping of keys to values")
    name = _require(spec, "name", str, where)
    reference = reference or directory / _require(spec, "reference", str, where)
    if not reference.is_file():
        raise ProblemError(f"{where}: reference module {reference.name} not found")

    tolerance = {k: dict(v) for k, v in DEFAULT_TOLERANCE.items()}
    for dtype, values in (spec.get("tolerance") or {}).items():
        if dtype not in DTYPES or not isinstance(values, dict):
            raise ProblemError(f"{where}: tolerance for {dtype!r} must be a mapping under a known dtype ({', '.join(DTYPES)})")
        unknown = set(values) - {"atol", "rtol", "rel_l2"}
        if unknown:
            raise ProblemError(f"{where}: tolerance {dtype}: unknown keys {sorted(unknown)}")
        tolerance.setdefault(dtype, {}).update({k: float(v) for k, v in values.items()})

    shapes = []
    for i, entry in enumerate(_require(spec, "shapes", list, where)):
        at = f"{where}: shapes[{i}]"
        if not isinstance(entry, dict):
            raise ProblemError(f"{at}: must be a mapping")
        shape_name = _require(entry, "name", str, at)
        dtype = entry.get("dtype", "float32")
        if dtype not in DTYPES:
            raise ProblemError(f"{at} ({shape_name}): unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
        uses = entry.get("use", ["correctness", "timing"])
        if not isinstance(uses, list) or not uses or not set(uses) <= USES:
            raise ProblemError(f"{at} ({shape_name}): 'use' must list some of {sorted(USES)}")
        constants = entry.get("set", {})
        if not isinstance(constants, dict):
            raise ProblemError(f"{at} ({shape_name}): 'set' must map module constants to values")
        output_dtype = entry.get("output_dtype")
        if output_dtype is not None and output_dtype not in OUTPUT_DTYPES:
            raise ProblemError(f"{at} ({shape_name}): unknown output_dtype {output_dtype!r}; known: {', '.join(OUTPUT_DTYPES)}")
        shape_cost = entry.get("cost")
        if shape_cost is not None:
            if not isinstance(shape_cost, dict) or not set(shape_cost) <= set(SHAPE_COST_KEYS) or not all(
                    _is_number(v) and v >= 0 for v in shape_cost.values()):
                raise ProblemError(f"{at} ({shape_name}): 'cost' must map some of {', '.join(SHAPE_COST_KEYS)} to numbers >= 0")
            shape_cost = {k: float(v) for k, v in shape_cost.items()}
        shapes.append(Shape(shape_name, dict(constants), dtype, frozenset(uses), bool(entry.get("default", False)), output_dtype,
                            shape_cost))
    if not shapes:
        raise ProblemError(f"{where}: needs at least one shape")
    names = [s.name for s in shapes]
    if len(set(names)) != len(names):
        raise ProblemError(f"{where}: shape names must be unique")
    if not any("timing" in s.uses for s in shapes) or not any("correctness" in s.uses for s in shapes):
        raise ProblemError(f"{where}: needs at least one correctness shape and one timing shape")

    vary = spec.get("vary_inputs") or {}
    scales = tuple(float(s) for s in vary.get("scales", [1.0]))
    if not scales or min(scales) <= 0:
        raise ProblemError(f"{where}: vary_inputs.scales must be positive numbers")
    families = _parse_families(vary.get("families") or [], where)
    default_output_dtype = spec.get("output_dtype")
    if default_output_dtype is not None and default_output_dtype not in OUTPUT_DTYPES:
        raise ProblemError(f"{where}: unknown output_dtype {default_output_dtype!r}; known: {', '.join(OUTPUT_DTYPES)}")
    custom = spec.get("custom", "full")
    if custom not in CUSTOM_POLICIES:
        raise ProblemError(f"{where}: custom must be one of {', '.join(CUSTOM_POLICIES)}, got {custom!r}")
    init_seed = spec.get("init_seed")
    if init_seed is not None and not _is_int(init_seed):
        raise ProblemError(f"{where}: init_seed must be an integer")
    # Every shape with its own measured bytes needs no expression (a KernelBench file's generated description).
    measured = all(s.cost and "bytes" in s.cost for s in shapes)
    cost = _require(spec, "cost", dict, where) if not measured or "cost" in spec else {"bytes": "0"}
    externals = []
    for i, entry in enumerate(spec.get("externals") or []):
        at = f"{where}: externals[{i}]"
        if not isinstance(entry, dict):
            raise ProblemError(f"{at}: must be a mapping")
        externals.append(External(_require(entry, "name", str, at), tuple(entry.get("requires", [])), _require(entry, "function", str, at)))

    problem = Problem(
        name=name, directory=directory, description=str(spec.get("description", "")), reference_path=reference,
        tolerance=tolerance, shapes=shapes, vary_args=tuple(vary.get("args", [])), vary_scales=scales,
        vary_offset=float(vary.get("offset", 0.0)), cost_bytes=str(_require(cost, "bytes", str, where)),
        cost_flops=str(cost.get("flops", "")), cost_bytes_written=str(cost.get("bytes_written", "")), reference_ops=tuple(spec.get("reference_ops", [])),
        core_aten_ops=tuple(spec.get("core_aten_ops", [])), externals=externals,
        shared_constants=tuple(spec.get("shared_constants", [])), families=families,
        default_output_dtype=default_output_dtype, custom=custom, init_seed=init_seed,
    )
    for s in shapes:
        if s.dtype not in problem.tolerance:
            raise ProblemError(f"{where}: shape {s.name} uses dtype {s.dtype} with no tolerance")
        for constant in s.constants:
            if constant not in problem.module_defaults():
                raise ProblemError(f"{where}: shape {s.name} sets {constant!r}, which {reference.name} does not define")
        try:
            problem.bytes_moved(s)
            problem.flops(s)
            problem.bytes_written(s)
        except Exception as error:  # noqa: BLE001 - any bad expression is the yaml's fault
            raise ProblemError(f"{where}: cost expression fails for shape {s.name}: {error}") from None
    unknown = set(problem.shared_constants) - set(problem.module_defaults())
    if unknown:
        raise ProblemError(f"{where}: shared_constants {sorted(unknown)} are not constants of {reference.name}")
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(problem.module, attr):
            raise ProblemError(f"{reference}: the reference module must define {attr}")
    return problem


def _parse_families(entries, where: str) -> tuple:
    """vary_inputs.families: a list of {name, transform: parameters}; see FAMILY_TRANSFORMS."""
    if not isinstance(entries, list):
        raise ProblemError(f"{where}: vary_inputs.families must be a list")
    families = []
    for i, entry in enumerate(entries):
        at = f"{where}: vary_inputs.families[{i}]"
        if not isinstance(entry, dict):
            raise ProblemError(f"{at}: must be a mapping")
        name = _require(entry, "name", str, at)
        unknown = set(entry) - {"name", *FAMILY_TRANSFORMS}
        if unknown:
            raise ProblemError(f"{at} ({name}): unknown transforms {sorted(unknown)}; known: {', '.join(FAMILY_TRANSFORMS)}")
        family = {"name": name}
        if "common" in entry:
            spec = _require(entry, "common", dict, at)
            args = _require(spec, "args", list, f"{at}.common")
            weight = float(_require(spec, "weight", (int, float), f"{at}.common"))
            if not args or weight <= 0:
                raise ProblemError(f"{at}.common: needs args and a positive weight")
            family["common"] = {"args": [int(a) for a in args], "weight": weight}
        if "scale_rows" in entry:
            spec = _require(entry, "scale_rows", dict, at)
            gain = float(_require(spec, "gain", (int, float), f"{at}.scale_rows"))
            count, fraction = int(spec.get("count", 0)), float(spec.get("fraction", 0.0))
            if gain <= 0 or (count <= 0 and fraction <= 0):
                raise ProblemError(f"{at}.scale_rows: needs a positive gain and a count or fraction of rows")
            family["scale_rows"] = {"arg": int(_require(spec, "arg", int, f"{at}.scale_rows")), "gain": gain,
                                    "count": count, "fraction": fraction}
        if "scales" in entry:
            scales = tuple(float(v) for v in _require(entry, "scales", list, at))
            if not scales or min(scales) <= 0:
                raise ProblemError(f"{at}.scales: must be positive numbers")
            family["scales"] = scales
        if "low_bits" in entry:
            spec = _require(entry, "low_bits", dict, at)
            family["low_bits"] = {"args": [int(a) for a in _require(spec, "args", list, f"{at}.low_bits")]}
        families.append(family)
    names = [f["name"] for f in families]
    if len(set(names)) != len(names):
        raise ProblemError(f"{where}: vary_inputs.families: names must be unique")
    return tuple(families)


def available_problems(root: Path = PROBLEMS_DIR) -> list:
    return sorted(p.name for p in root.iterdir() if (p / "problem.yaml").is_file()) if root.is_dir() else []


def find_problem(name: str, root: Path = PROBLEMS_DIR) -> Problem:
    if not (root / name / "problem.yaml").is_file():
        known = ", ".join(available_problems(root)) or "none"
        raise ProblemError(f"no problem named {name!r} in {root}; problems: {known}")
    return load_problem(root / name)


def private_files(solution: Path) -> list:
    """The private files (`_name`) a solution may read: those beside it, and, for a solution in
    solutions/<problem>/, those at the root of solutions/ (device code that solutions of several problems
    share). The sandbox lets the child read these, the scan reads the ones the source names, and the code
    hash covers them: a header's change is a change of every solution that uses it."""
    folder = Path(solution).resolve().parent
    folders = [folder] + ([folder.parent] if folder.parent == SOLUTIONS_DIR.resolve() else [])
    # Regular files only: a link (to /proc/self/mem, say) would fail every solution beside it
    return sorted(p for f in folders for p in f.glob("_*") if p.is_file() and not p.is_symlink())


def discover_solutions(problem_name: str, root: Path = SOLUTIONS_DIR) -> list:
    """Every solutions/<problem>/*.py that is not private (_name.py)."""
    folder = root / problem_name
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_")) if folder.is_dir() else []
