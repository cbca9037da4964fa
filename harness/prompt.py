"""A prompt that asks a language model for a solution file of one problem: `python -m harness prompt PROBLEM`.

build_prompt(problem) writes, from what the harness itself holds (nothing here restates a rule by hand):
- the task: a `ModelNew` with CUDA kernels of its own, built by `load_inline`, that replaces the reference `Model`
  (same constructor arguments, same inputs, same output);
- the file format `solutions/` accepts (docs/writing-a-solution.md);
- the problem: its shapes (timing and correctness, with their constants and tensor sizes), dtypes, tolerances,
  input families and its `custom` policy with the reference's core aten ops;
- the rules: every rule of harness.rules.RULES with its evidence, and the static scan's bans (harness/scan.py)
  in words;
- one complete example on a tiny problem (harness/templates/prompt_example.py);
- the reference source (the problem's reference file, or the KernelBench file itself);
- a closing instruction: one Python code block holding the complete file, nothing else.

Tensor sizes and the output's shape are worked out on the meta device (nothing is allocated); where a reference
cannot run there, the shape's constants alone are given.
"""
from __future__ import annotations

import ast
from pathlib import Path

import torch

from . import scan
from .problem import Problem
from .rules import RULES

EXAMPLE_PATH = Path(__file__).resolve().parent / "templates" / "prompt_example.py"

# The tiny problem the example solves, as a reference file would state it.
EXAMPLE_REFERENCE = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


def get_inputs():
    return [torch.randn(4096, 1000), torch.randn(4096, 1000)]


def get_init_inputs():
    return []
'''


def example_source() -> str:
    return EXAMPLE_PATH.read_text()


def build_prompt(problem: Problem) -> str:
    """The whole prompt for `problem` (as find_problem or load_problem returns it), as one Markdown text."""
    init_args, forward_args = _signature(problem)
    sections = [
        _task(problem, init_args, forward_args),
        _file_format(problem),
        _shapes(problem, forward_args),
        _correctness(problem, forward_args),
        _custom_policy(problem),
        _rules(),
        _scan_bans(),
        _example(),
        _reference(problem),
        _closing(problem),
    ]
    return "\n\n".join(section.strip("\n") for section in sections) + "\n"


# ----- the task and the format ----------------------------------------------------------------------------------
def _signature(problem: Problem) -> tuple:
    """(Model.__init__'s parameters after self, Model.forward's parameters after self), as the source writes them."""
    tree = ast.parse(problem.reference_path.read_text())
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    methods = {n.name: n for n in (model.body if model else []) if isinstance(n, ast.FunctionDef)}

    def parameters(name):
        method = methods.get(name)
        if method is None:
            return []
        args = method.args
        named = [a.arg for a in args.posonlyargs + args.args][1:]
        if args.vararg:
            named.append("*" + args.vararg.arg)
        named += [a.arg for a in args.kwonlyargs]
        if args.kwarg:
            named.append("**" + args.kwarg.arg)
        return named

    return parameters("__init__"), parameters("forward")


def _task(problem: Problem, init_args: list, forward_args: list) -> str:
    kernelbench = problem.reference_path == problem.directory
    kind = "KernelBench file" if kernelbench else "problem"
    text = problem.description.removesuffix(f" (KernelBench file {problem.reference_path.name})")
    description = f" ({text})" if text and text != f"KernelBench file {problem.reference_path.name}" else ""
    lines = [
        f"# Task: write `ModelNew` for the {kind} `{problem.name}`{description}",
        "",
        "You are given a PyTorch reference module `Model` (its full source is below). Write a Python file that defines "
        "`ModelNew`, a drop-in replacement for `Model` whose `forward` computes the same result with custom CUDA kernels "
        "of your own, compiled at import with `torch.utils.cpp_extension.load_inline`. The goal is a correct kernel that "
        "is as fast as possible on an NVIDIA H200 (sm_90); it is timed against PyTorch eager and torch.compile.",
        "",
        f"- Constructor: `ModelNew({', '.join(init_args)})` takes the same arguments as `Model`: the harness builds it "
        "as `ModelNew(*get_init_inputs())`." if init_args else
        "- Constructor: `ModelNew()` takes no arguments, as `Model` does (`get_init_inputs()` is empty).",
        f"- Forward: `forward(self, {', '.join(forward_args)})` takes exactly the reference's inputs, in the same order, "
        "nothing more (no options, no extra arguments), and returns what `Model.forward` returns.",
    ]
    if problem.init_seed is not None:
        lines.append(f"- Parameters (where `Model` has any): torch's generator is seeded with {problem.init_seed} right "
                     "before `Model` and right before `ModelNew` are built, so parameters `ModelNew` creates the way "
                     "`Model` does (the same layers, in the same order, e.g. the same `nn.Linear`) hold the same values. "
                     "Use them; do not load weights.")
    return "\n".join(lines)


def _file_format(problem: Problem) -> str:
    lines = [
        "## The file format",
        "",
        "- One Python file, complete and self-contained: no other files, no relative imports. It defines a class named "
        "`ModelNew` (an `nn.Module`).",
        "- Kernels are built when the file is imported: module-level `_cpp_src` (the C++ declarations of the host "
        "functions), `_cuda_src` (the kernels and the host functions that launch them) and "
        "`_ext = load_inline(name=..., cpp_sources=_cpp_src, cuda_sources=_cuda_src, functions=[...])`, where "
        "`functions` names every host function `_cpp_src` declares. `forward` calls `_ext.<function>(...)`.",
        "- Do not pass `-arch` or `-gencode` flags: the harness sets `TORCH_CUDA_ARCH_LIST` to the GPU's (9.0 on the "
        "H200). `extra_cuda_cflags=[\"-O3\"]` and similar optimisation flags are fine.",
        "- Launch every kernel on `c10::cuda::getCurrentCUDAStream()` (the stream that is timed) and check launches with "
        "`C10_CUDA_KERNEL_LAUNCH_CHECK()`.",
        "- Imports: `torch`, `torch.nn`, `torch.nn.functional`, `torch.utils.cpp_extension.load_inline` and plain "
        "standard-library modules such as `math`. Never the modules the static scan bans, and never assign to "
        "attributes of torch or of other modules (both listed below). `torch.compile` is not available.",
        "- Sizes come only from the inputs (their `.size()`/`.shape`), never from the reference's module constants: the "
        "harness changes them per shape.",
    ]
    if problem.shared_constants:
        defaults = problem.module_defaults()
        lines.append("- Module constants that `Model`'s constructor reads: define them at module level with the "
                     "reference's default (" + ", ".join(f"`{c} = {defaults[c]!r}`" for c in problem.shared_constants) +
                     ") and read them in `__init__` as `Model` does; the harness sets the shape's value before it builds "
                     "`ModelNew`.")
    lines += [
        "- `forward` returns a new, plain tensor of the reference's shape, dtype and device (not a view or an expanded "
        "tensor, not a tuple), and leaves its inputs exactly as they were.",
        "- Every shape and dtype listed below reaches `forward`: handle every size (one row, widths of 1, odd and prime "
        "widths, rows no vector width divides) with bounds checks, and every dtype listed.",
        "- A module docstring that states the design and its invariants; no dead code, no debugging output, no timing.",
    ]
    return "\n".join(lines)


# ----- the problem's shapes -------------------------------------------------------------------------------------
def _describe_value(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}[{', '.join(str(d) for d in value.shape)}]"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_describe_value(v) for v in value) + "]"
    return repr(value)


def _meta_run(problem: Problem, shape) -> dict:
    """The shape's inputs, constructor arguments and output, worked out on the meta device: {'inputs': [...],
    'init': [...], 'output': [...]}, each entry missing where the reference cannot run there. The module's
    constants are left as they were."""
    module = problem.module
    values = problem.constants(shape)
    saved = {name: getattr(module, name) for name in values if hasattr(module, name)}
    found = {}
    try:
        for name, value in values.items():
            if isinstance(saved.get(name), tuple) and isinstance(value, list):
                value = tuple(value)
            setattr(module, name, value)
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            try:
                inputs = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]
            except Exception:  # noqa: BLE001 - a reference that builds its inputs on a named device
                return found
            inputs = [x.to(shape.torch_dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
            found["inputs"] = inputs
            try:
                init = list(module.get_init_inputs())
                found["init"] = init
                model = module.Model(*init)
                with torch.no_grad():
                    out = model(*inputs)
                if isinstance(out, torch.Tensor):
                    found["output"] = list(out.shape)
            except Exception:  # noqa: BLE001 - an op with no meta kernel: the sizes of the inputs must do
                pass
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
    return found


def _shape_lines(problem: Problem, shape, forward_args: list) -> list:
    uses = " and ".join(u for u in ("correctness", "timing") if u in shape.uses)
    settings = ", ".join(f"{k}={v}" for k, v in problem.constants(shape).items())
    out_dtype = str(problem.output_dtype(shape)).removeprefix("torch.")
    lines = [f"- `{shape.name}` ({uses}; dtype {shape.dtype}" + (", the default shape" if shape.default else "") + ")"
             + (f": {settings}" if settings else "")]
    meta = _meta_run(problem, shape)
    if "inputs" in meta:
        names = [a for a in forward_args if not a.startswith("*")]
        described = [f"{names[i] if i < len(names) else f'input {i}'} = {_describe_value(x)}" for i, x in enumerate(meta["inputs"])]
        lines.append("  - inputs: " + ", ".join(described))
    if meta.get("init"):
        lines.append("  - constructor: `Model(" + ", ".join(_describe_value(v) for v in meta["init"]) + ")`")
    if "output" in meta:
        dims = meta["output"]
        lines.append(f"  - output: {out_dtype}[{', '.join(str(d) for d in dims)}]" + (" (a 0-d scalar tensor)" if not dims else ""))
    else:
        lines.append(f"  - output dtype: {out_dtype}")
    return lines


def _shapes(problem: Problem, forward_args: list) -> str:
    timing = problem.shapes_for("timing")
    checked = [s for s in problem.shapes_for("correctness") if "timing" not in s.uses]
    lines = ["## Shapes and dtypes",
             "",
             "The harness sets the reference's module constants per shape, draws the inputs with `get_inputs()` on the GPU "
             "and casts floating inputs to the shape's dtype (integer inputs keep theirs). Timing shapes are checked for "
             "correctness too.",
             "",
             "Timing shapes (the speedup is the geometric mean over these):"]
    for shape in timing:
        lines += _shape_lines(problem, shape, forward_args)
    if checked:
        lines += ["", "Correctness-only shapes (edge cases your kernel must get right):"]
        for shape in checked:
            lines += _shape_lines(problem, shape, forward_args)
    return "\n".join(lines)


# ----- how correctness is judged ---------------------------------------------------------------------------------
def _number(value: float) -> str:
    """1.5e-4, 0.5, 60: short, every significant digit kept, exponents for small and large values."""
    if value == 0 or 1e-2 <= abs(value) < 1e5:
        return f"{value:.6g}"
    mantissa, exponent = f"{value:.5e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _names(indices, forward_args: list) -> str:
    names = [a for a in forward_args if not a.startswith("*")]
    return ", ".join(f"`{names[i]}`" if i < len(names) else f"input {i}" for i in indices)


def _family_text(family: dict, forward_args: list) -> str:
    parts = []
    if "common" in family:
        spec = family["common"]
        parts.append(f"one random direction c shared by {_names(spec['args'], forward_args)} (weight {_number(spec['weight'])}): "
                     "every row x becomes x + w|x|c rescaled to |x|, so dot products share a large common part and "
                     "their small differences decide the result")
    if "scale_rows" in family:
        spec = family["scale_rows"]
        how_many = []
        if spec.get("count"):
            how_many.append(f"at least {spec['count']}")
        if spec.get("fraction"):
            how_many.append(f"a fraction {_number(spec['fraction'])}")
        parts.append(f"rows of {_names([spec['arg']], forward_args)} at random positions ({' and '.join(how_many)} of them) "
                     f"scaled {_number(spec['gain'])}x: they dominate the result, so skipping or subsampling rows fails")
    if "scales" in family:
        parts.append("scales " + ", ".join(_number(s) for s in family["scales"]))
    if "low_bits" in family:
        parts.append(f"\"low bits\" on the float32 inputs {_names(family['low_bits']['args'], forward_args)}: every element "
                     "is set so that converting it to bf16, fp16 or TF32 rounds it down in magnitude, so errors of "
                     "reduced-precision arithmetic add up instead of averaging out (3xTF32/3xFP16 splits stay exact)")
    return "; ".join(parts) or "the inputs as drawn, with the per-trial variation"


def _correctness(problem: Problem, forward_args: list) -> str:
    dtypes = sorted({s.dtype for s in problem.shapes}, key=lambda d: list(problem.tolerance).index(d))
    outputs = sorted({f"{s.dtype} -> {str(problem.output_dtype(s)).removeprefix('torch.')}" for s in problem.shapes})
    lines = ["## How correctness is judged",
             "",
             "The harness draws every input from a secret seed and computes the expected output itself, in float64. "
             "Each correctness shape gets 5 trials of fresh inputs and a cache-probe trial (its first and last elements "
             "equal to the previous trial's). An output passes when its NaN and inf sit where the reference's do, every "
             "element satisfies |out - ref| <= atol + rtol * |ref|, and the relative L2 error "
             "||out - ref|| / ||ref|| is at most rel_l2.",
             "",
             "Tolerances, by input dtype:"]
    for d in dtypes:
        t = problem.tolerance_for(d)
        lines.append(f"- {d}: atol {_number(t['atol'])}, rtol {_number(t['rtol'])}, rel_l2 {_number(t['rel_l2'])}")
    lines += ["", "Output dtype, by input dtype: " + "; ".join(outputs) + ".", ""]
    if problem.vary_args:
        lines.append(f"Each trial multiplies the floating inputs {_names(problem.vary_args, forward_args)} by a scale drawn "
                     f"from {', '.join(_number(s) for s in problem.vary_scales)} (with 0.9-1.1 jitter)"
                     + (f" and shifts them by up to +-{_number(problem.vary_offset)}" if problem.vary_offset else "")
                     + ": no kernel may assume tame or normalised inputs.")
    if problem.families:
        lines.append("Input families: trials rotate through these, so every shape meets each of them:")
        lines += [f"- `{f['name']}`: {_family_text(f, forward_args)}" for f in problem.families]
    else:
        lines.append("Input family: one (`plain`): the inputs `get_inputs()` draws, from a fresh seed each trial.")
    lines += [
        "",
        "Also checked:",
        "- Output memory and freed device memory hold a poison pattern: an element never written fails as "
        "`uninitialised-output`.",
        "- The outputs of timed calls are checked as well (a secret sample and the whole last batch): results reused "
        "across calls (keyed on pointers or on a few elements) fail as `timed-output-wrong`.",
        "- Inputs must not be mutated: an input that differs after the call from what was drawn fails as `input-mutated` "
        "(compute into new tensors, never in place in an input).",
        "- Timing: fresh inputs and an L2 flush before every call, CUDA events on the current stream; work left on "
        "another stream or a host thread fails as `escaped-timing`.",
    ]
    return "\n".join(lines)


def _custom_policy(problem: Problem) -> str:
    ops = ", ".join(f"`aten::{op}`" for op in problem.core_aten_ops) or "(none recorded)"
    lines = [f"## What counts as a custom kernel (policy: `custom: {problem.custom}`)", ""]
    if problem.custom == "full":
        lines.append("Every part of the computation must run in kernels of your own. `forward` may not dispatch any of "
                     f"the reference's core aten ops, from Python or from C++ (`at::`/`torch::` calls in the host code): "
                     f"{ops} (`*` matches any part of a name). Doing so is rejected as `not-custom-kernel`, at any shape.")
    else:
        lines.append("You may call some of the reference's core aten ops beside kernels of your own: "
                     f"{ops}. Such a solution is accepted but marked partial (\"with reference ops\") on the leaderboard; "
                     "one that runs all of its computation in its own kernels is not marked.")
    lines.append("Under either policy a `forward` that launches no kernel of its own is rejected as `not-custom-kernel`. "
                 "Allocating outputs (`torch::empty`), `.contiguous()` and views are not computation and are allowed.")
    return "\n".join(lines)


# ----- the rules ----------------------------------------------------------------------------------------------
def _rules() -> str:
    lines = ["## Rules the harness enforces",
             "",
             "The solution is imported and run in a sandboxed process of its own; each verdict below rejects it, under "
             "the rule named:"]
    for rule in RULES:
        lines.append(f"- {', '.join(f'`{n}`' for n in rule.names)}: {rule.evidence}")
    return "\n".join(lines)


def _grouped(table: dict) -> dict:
    """{reason: [names]} of a {name: reason} table, in the table's order."""
    groups: dict = {}
    for name, reason in table.items():
        groups.setdefault(reason, []).append(name)
    return groups


def _scan_bans() -> str:
    code = lambda names: ", ".join(f"`{n}`" for n in names)  # noqa: E731
    lines = ["## Rejected as cheating before anything runs (static scan of your file)",
             "",
             "The file is scanned before it is imported. Each of these rejects it as `introspection` (unless another rule "
             "is named), wherever it appears outside comments and docstrings:",
             "- importing any of these modules: " + code(scan.BANNED_MODULES) + "; relative imports",
             "- these builtins: " + "; ".join(f"`{n}` ({reason.removesuffix(f' ({n})')})"
                                              for n, reason in scan.BANNED_BUILTINS.items())]
    for reason, names in _grouped(scan.BANNED_NAMES).items():
        lines.append(f"- any name, attribute or string that {reason}: {code(names)}")
    lines += [
        "- gc internals (" + code(f"gc.{n}" for n in sorted(scan.BANNED_GC)) + "; `gc.collect()` is fine) and "
        "`sys.monitoring`",
        "- writing, `setattr`, `delattr` or `del` on an attribute of these modules, or reaching their `__dict__` or "
        f"`vars()`: {code(sorted(scan.PROTECTED_ROOTS))}; rewriting `__class__`, `__bases__`, `__dict__`, `__code__`, "
        "`__defaults__` or `__kwdefaults__`. Allowed: setting build variables in `os.environ[...]`, and switching off "
        "precision-reducing flags (" + code(f"torch.backends...{f} = False" for f in sorted(scan.EXACTNESS_FLAGS)) + ")",
        "- strings that name the harness, `/proc` or `/dev/mem`",
        "- in the CUDA/C++ sources (the strings given to `load_inline`):",
    ]
    for _, rule, reason in scan.NATIVE_PATTERNS:
        lines.append(f"  - code that {reason} (`{rule}`)")
    lines += ["",
              "At run time the same idioms, and also writing files outside a scratch folder, sockets, signals to other "
              "processes, starting threads or processes, and patching torch or the harness, are caught by the sandbox and "
              "the guard (the rules above). Your own CUDA streams, timers, comparison functions and caches across calls "
              "are flagged for review: none of them makes an honest kernel faster here."]
    return "\n".join(lines)


# ----- the example, the reference, the closing ------------------------------------------------------------------
def _example() -> str:
    return "\n".join([
        "## A complete example on a tiny problem",
        "",
        "For this reference:",
        "",
        "```python",
        EXAMPLE_REFERENCE.rstrip("\n"),
        "```",
        "",
        "a complete, accepted solution file is:",
        "",
        "```python",
        example_source().rstrip("\n"),
        "```",
        "",
        "Yours follows the same format, for the reference below, with kernels designed for its computation, shapes and "
        "dtypes (and as fast as you can make them).",
    ])


def _reference(problem: Problem) -> str:
    path = problem.reference_path
    return "\n".join([
        f"## The reference (`{path.name}`, complete)",
        "",
        "```python",
        path.read_text().rstrip("\n"),
        "```",
    ])


def _closing(problem: Problem) -> str:
    return ("## Your answer\n\n"
            f"Answer with exactly one Python code block (```python ... ```) holding the complete solution file for "
            f"`{problem.name}`: the docstring, the imports, `_cpp_src`, `_cuda_src`, the `load_inline` call and `ModelNew`. "
            "Nothing else: no explanation before or after the block, no second block.")
