"""Problems: a folder with a KernelBench-style reference module and a problem.yaml that describes it.

The harness changes a shape by overriding the reference module's size constants, draws inputs with
`get_inputs()` on the target device under a seed, casts floating inputs to the shape's dtype, and
rescales/shifts them per trial so that kernels which assume tame inputs fail.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

import torch
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
PROBLEMS_DIR = REPO_ROOT / "problems"
SOLUTIONS_DIR = REPO_ROOT / "solutions"

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
DEFAULT_TOLERANCE = {
    "float32": {"atol": 1e-4, "rtol": 1e-4, "rel_l2": 1e-4},
    "float16": {"atol": 1e-2, "rtol": 1e-2, "rel_l2": 1e-2},
    "bfloat16": {"atol": 1e-2, "rtol": 1e-2, "rel_l2": 1e-2},
}
USES = {"correctness", "timing"}
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
    core_aten_ops: tuple
    externals: list
    shared_constants: tuple = ()
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

    # --- cost -----------------------------------------------------------------------------
    def _evaluate(self, expression: str, shape: Shape) -> float:
        names = {**self.constants(shape), "elem": torch.empty((), dtype=shape.torch_dtype).element_size(), "math": math}
        return float(eval(expression, {"__builtins__": {}}, names))  # problem files are trusted

    def bytes_moved(self, shape: Shape) -> float:
        return self._evaluate(self.cost_bytes, shape)

    def flops(self, shape: Shape) -> float:
        return self._evaluate(self.cost_flops, shape) if self.cost_flops else 0.0

    # --- the reference module -----------------------------------------------------------
    @property
    def module(self):
        if self._module is None:
            self._module = load_module(self.reference_path, f"harness_problem_{self.name}")
            self._defaults = {k: v for k, v in vars(self._module).items() if k.isupper()}
        return self._module

    def module_defaults(self) -> dict:
        """The reference module's upper-case constants as imported."""
        self.module  # noqa: B018 - importing records them
        return self._defaults

    def constants(self, shape: Shape) -> dict:
        return {**self.module_defaults(), **shape.constants}

    def apply_constants(self, shape: Shape, *modules) -> None:
        """Set the shape's constants on the reference module. A solution module gets only the
        `shared_constants` (what Model's constructor reads, like InfoNCE's TEMPERATURE), never the
        sizes: those it must take from its inputs."""
        values = self.constants(shape)
        for name, value in values.items():
            setattr(self.module, name, value)
        for module in modules:
            for name in self.shared_constants:
                if hasattr(module, name):
                    setattr(module, name, values[name])

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
        variation = torch.Generator().manual_seed(seed ^ 0x5EED)
        out = []
        for index, x in enumerate(raw):
            if isinstance(x, torch.Tensor):
                x = x.to(device)
                if x.is_floating_point():
                    if index in self.vary_args:
                        stratum = (seed + index) % len(self.vary_scales)
                        jitter = 0.9 + 0.2 * torch.rand((), generator=variation).item()
                        offset = (2 * torch.rand((), generator=variation).item() - 1) * self.vary_offset
                        x = x.float() * (self.vary_scales[stratum] * jitter) + offset
                    x = x.to(shape.torch_dtype)
                x = x.contiguous()
            out.append(x)
        return out


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _require(mapping, key, kind, where):
    if key not in mapping:
        raise ProblemError(f"{where}: missing required key {key!r}")
    value = mapping[key]
    if not isinstance(value, kind):
        raise ProblemError(f"{where}: {key!r} must be {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
    return value


def load_problem(directory) -> Problem:
    directory = Path(directory)
    where = str(directory / "problem.yaml")
    if not (directory / "problem.yaml").is_file():
        raise ProblemError(f"{where}: not found")
    try:
        spec = yaml.safe_load((directory / "problem.yaml").read_text())
    except yaml.YAMLError as error:
        raise ProblemError(f"{where}: not valid YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(spec, dict):
        raise ProblemError(f"{where}: must be a mapping of keys to values")
    name = _require(spec, "name", str, where)
    reference = directory / _require(spec, "reference", str, where)
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
        shapes.append(Shape(shape_name, dict(constants), dtype, frozenset(uses), bool(entry.get("default", False))))
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
    cost = _require(spec, "cost", dict, where)
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
        cost_flops=str(cost.get("flops", "")), reference_ops=tuple(spec.get("reference_ops", [])),
        core_aten_ops=tuple(spec.get("core_aten_ops", [])), externals=externals,
        shared_constants=tuple(spec.get("shared_constants", [])),
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
        except Exception as error:  # noqa: BLE001 - any bad expression is the yaml's fault
            raise ProblemError(f"{where}: cost expression fails for shape {s.name}: {error}") from None
    unknown = set(problem.shared_constants) - set(problem.module_defaults())
    if unknown:
        raise ProblemError(f"{where}: shared_constants {sorted(unknown)} are not constants of {reference.name}")
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(problem.module, attr):
            raise ProblemError(f"{reference}: the reference module must define {attr}")
    return problem


def available_problems(root: Path = PROBLEMS_DIR) -> list:
    return sorted(p.name for p in root.iterdir() if (p / "problem.yaml").is_file()) if root.is_dir() else []


def find_problem(name: str, root: Path = PROBLEMS_DIR) -> Problem:
    if not (root / name / "problem.yaml").is_file():
        known = ", ".join(available_problems(root)) or "none"
        raise ProblemError(f"no problem named {name!r} in {root}; problems: {known}")
    return load_problem(root / name)


def discover_solutions(problem_name: str, root: Path = SOLUTIONS_DIR) -> list:
    """Every solutions/<problem>/*.py that is not private (_name.py)."""
    folder = root / problem_name
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_")) if folder.is_dir() else []
