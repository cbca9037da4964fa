"""Start a new solution file: `python -m harness new PROBLEM NAME` writes solutions/<problem>/<name>.py.

Where the problem has a solutions/<problem>/simple.py, the new file is that file's code under a fresh header
docstring (what forward must compute, the tolerances, the commands that build, check and time it, where to
start) with every literal load_inline `name=` changed, so that the two files never share an extension name.
Where it has none, the file is harness/templates/solution.py.tmpl filled in from the reference module: one
CUDA kernel that builds, and a forward that raises NotImplementedError until the author writes the kernel.

Nothing here imports or builds the new file; the header is prose, so the static scan never reads it.
"""
from __future__ import annotations

import ast
import keyword
import re
import string
import textwrap
from pathlib import Path

from .problem import REPO_ROOT, SOLUTIONS_DIR, Problem, ProblemError

TEMPLATE = Path(__file__).resolve().parent / "templates" / "solution.py.tmpl"
STARTER = "simple.py"
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
MAX_NAME = 64
# Lines of the reference's forward quoted in the header; a longer body is cut with a pointer to the file.
MAX_QUOTED_LINES = 30


def new_solution(problem: Problem, name: str, solutions_dir: Path | None = None) -> Path:
    """Write solutions_dir/<problem>/<name>.py (solutions_dir defaults to the repository's solutions/) and
    return its path. ProblemError, with a one-line reason, when the name is not a plain file stem or the
    file exists."""
    _check_name(name)
    folder = Path(solutions_dir or SOLUTIONS_DIR) / problem.name
    path = folder / f"{name}.py"
    if path.exists():
        raise ProblemError(f"{_shown(path)} exists already: pick another name or edit that file")
    starter = folder / STARTER
    extension = _free_extension_name(f"{problem.name}_{name}", folder)
    text = _from_starter(problem, path, starter, extension) if starter.is_file() else _from_template(problem, path, extension)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "x") as handle:  # "x": never overwrite a file that appeared meanwhile
            handle.write(text)
    except FileExistsError:
        raise ProblemError(f"{_shown(path)} exists already: pick another name or edit that file") from None
    return path


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name:
        raise ProblemError("a solution needs a name, e.g. `make new PROBLEM=softmax NAME=mine`")
    if name.endswith(".py"):
        raise ProblemError(f"name the solution without .py: {name[:-3]!r}")
    if name.startswith("_"):
        raise ProblemError(f"{name!r} starts with '_': the harness skips such files (they are private helpers)")
    if not _NAME.fullmatch(name) or keyword.iskeyword(name):
        raise ProblemError(f"{name!r} is not a usable file stem: use letters, digits and '_', starting with a letter")
    if len(name) > MAX_NAME:
        raise ProblemError(f"{name[:20]!r}... is longer than {MAX_NAME} characters")


def _shown(path: Path) -> str:
    """A path as a reader types it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


# ----- extension names ----------------------------------------------------------------------------------------
def _load_inline_names(tree) -> list:
    """[(ast.Constant of name=, its value)] for every load_inline(...) call whose name is a literal string."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called(node) == "load_inline":
            for kw in node.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    found.append((kw.value, kw.value.value))
    return found


def _called(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _free_extension_name(base: str, folder: Path) -> str:
    """`base`, or base_2, base_3... if a file in `folder` already builds an extension of that name."""
    taken = set()
    for other in folder.glob("*.py") if folder.is_dir() else ():
        try:
            taken.update(value for _, value in _load_inline_names(ast.parse(other.read_text(errors="replace"))))
        except (OSError, SyntaxError, ValueError):
            continue
    candidate, index = base, 2
    while candidate in taken:
        candidate, index = f"{base}_{index}", index + 1
    return candidate


# ----- what the header says -------------------------------------------------------------------------------------
def _reference_forward(problem: Problem):
    """(Model.__init__'s arguments node, Model.forward's FunctionDef, the reference's source lines)."""
    source = problem.reference_path.read_text()
    tree = ast.parse(source)
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    methods = {n.name: n for n in (model.body if model else []) if isinstance(n, ast.FunctionDef)}
    if "forward" not in methods:
        raise ProblemError(f"{problem.reference_path}: no Model.forward to describe")
    return methods.get("__init__"), methods["forward"], source.splitlines()


def _forward_text(problem: Problem) -> list:
    """Model.forward's signature and body, as the reference writes them (comments included)."""
    _, forward, lines = _reference_forward(problem)
    body = forward.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and len(body) > 1:
        body = body[1:]  # the method's docstring is not the computation
    first, last = body[0].lineno, body[-1].end_lineno
    while first - 1 > forward.lineno and lines[first - 2].lstrip().startswith("#"):
        first -= 1  # comments that open the body belong to it
    quoted = textwrap.dedent("\n".join(lines[first - 1:last])).splitlines()
    if len(quoted) > MAX_QUOTED_LINES:
        quoted = quoted[:MAX_QUOTED_LINES] + [f"... ({len(quoted) - MAX_QUOTED_LINES} more lines: see {_shown(problem.reference_path)})"]
    signature = f"def forward({ast.unparse(forward.args)})" + (f" -> {ast.unparse(forward.returns)}" if forward.returns else "")
    return [signature + ":"] + ["    " + line if line.strip() else "" for line in quoted]


def _number(value: float) -> str:
    """1.5e-4 for 0.00015: the tolerances as problem.yaml writes them, every digit kept."""
    if value == 0:
        return "0"
    mantissa, exponent = f"{value:.6e}".split("e")
    if 0 <= int(exponent) <= 3:
        return f"{value:g}"
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _para(text: str, indent: str = "  ", width: int = 110) -> list:
    """One paragraph of the header, wrapped."""
    return textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False)


def _header(problem: Problem, path: Path, origin: str, start: list, design: list) -> str:
    shown = _shown(path)
    checked_only = [s.name for s in problem.shapes_for("correctness") if "timing" not in s.uses]
    dtypes = sorted({s.dtype for s in problem.shapes}, key=list(problem.tolerance).index)
    outputs = sorted({f"{s.dtype} -> {problem.output_dtype(s)}".replace("torch.", "") for s in problem.shapes})
    constants = "Sizes come only from the inputs: the module is given no size constant" + (
        f"; only {', '.join(problem.shared_constants)}, which the harness sets to the shape's value before it builds "
        "ModelNew." if problem.shared_constants else ".")
    lines = [*_para(origin, ""), "",
             f"What forward must compute ({_shown(problem.directory / 'problem.yaml')}, {_shown(problem.reference_path)}):",
             *_para(problem.description),
             "  The reference's Model:",
             *("      " + line if line else "" for line in _forward_text(problem)),
             *_para("ModelNew takes the same constructor arguments (get_init_inputs()) and the same inputs, and returns "
                    "a plain tensor of the reference's shape, dtype and device; it must leave its inputs as they are. "
                    f"Input dtype -> output dtype: {'; '.join(outputs)}."),
             "  Timing shapes (each is checked too):",
             *(f"    {s.name}: " + ", ".join([*(f"{k}={v}" for k, v in s.constants.items()), s.dtype])
               for s in problem.shapes_for("timing")),
             *_para(f"Checked only (sizes in problem.yaml): {', '.join(checked_only)}." if checked_only else ""),
             *_para(constants),
             "",
             "Tolerances (against a float64 reference; an output passes where |out - ref| <= atol + rtol * |ref| at",
             "every element and the relative L2 error is below rel_l2; NaN and inf where the reference has them):",
             *(f"  {d}: atol {_number(t['atol'])}, rtol {_number(t['rtol'])}, rel_l2 {_number(t['rel_l2'])}"
               for d, t in ((d, problem.tolerance_for(d)) for d in dtypes)),
             "",
             "Build, check and time (on the GPU machine; for one shape add ARGS=\"--shape NAME\"):",
             f"  make eval PROBLEM={problem.name} SOLUTION={shown}",
             f"  python -m harness eval {problem.name} --solution {shown}",
             *_para("The first run builds the extension (minutes); later runs reuse the build under .build/. "
                    "docs/writing-a-solution.md has the rules, the verdicts and the common failures."),
             "",
             "Where to start:", *start]
    if design:
        lines += ["", "Design (simple.py's, as started; rewrite this docstring as the kernel becomes yours: the design and",
                  "its invariants, no figures or history):", *("  " + line if line else "" for line in design)]
    text = "\n".join(line.rstrip() for line in lines).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return f'"""{text}\n"""'


# ----- from simple.py -------------------------------------------------------------------------------------------
_KERNEL = re.compile(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:void\s+)?(\w+)\s*\(")


def _strings_by_name(tree) -> dict:
    """Module-level NAME = "literal" assignments."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def _where_to_start(tree, names: dict) -> list:
    """Which string holds the CUDA source, its kernels, and the host functions forward calls."""
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _called(node) == "load_inline"):
            continue
        keywords = {kw.arg: kw.value for kw in node.keywords}
        source = keywords.get("cuda_sources")
        functions = keywords.get("functions")
        exported = [e.value for e in getattr(functions, "elts", []) if isinstance(e, ast.Constant)]
        if isinstance(source, ast.Name):
            kernels = list(dict.fromkeys(_KERNEL.findall(names.get(source.id, ""))))
            lines += _para(f"`{source.id}` holds the CUDA source" + (f": kernel{'s' if len(kernels) > 1 else ''} "
                                                                      f"{', '.join(kernels)}" if kernels else "") + ".")
        if exported:
            lines += _para(f"forward calls the host function{'s' if len(exported) > 1 else ''} {', '.join(exported)} "
                           "through the extension; a host function is declared in `_cpp_src` and listed in functions=[...].")
    return lines + _para("Change the kernel first and keep the host function's checks; the load_inline name is this file's own.")


def _from_starter(problem: Problem, path: Path, starter: Path, extension: str) -> str:
    source = starter.read_text()
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        raise ProblemError(f"{_shown(starter)} does not parse (line {error.lineno}): fix it before starting from it") from None
    literals = sorted(_load_inline_names(tree), key=lambda item: (item[0].lineno, item[0].col_offset))
    if not literals:
        raise ProblemError(f"{_shown(starter)} has no load_inline(name=\"...\") to rename: write {path.name} by hand")
    # Rename in place (ast offsets are in UTF-8 bytes), from the last literal to the first.
    lines = [line.encode() for line in source.splitlines(keepends=True)]
    for index, (node, _) in reversed(list(enumerate(literals))):
        if node.lineno != node.end_lineno:
            raise ProblemError(f"{_shown(starter)}: the load_inline name at line {node.lineno} spans lines: write {path.name} by hand")
        new = extension if index == 0 else f"{extension}_{index + 1}"
        line = lines[node.lineno - 1]
        lines[node.lineno - 1] = line[:node.col_offset] + repr(new).replace("'", '"').encode() + line[node.end_col_offset:]
    renamed = b"".join(lines).decode()
    design, rest = "", renamed
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        design = first.value.value
        rest = "".join(renamed.splitlines(keepends=True)[first.end_lineno:])
    header = _header(problem, path, f"{problem.name} solution {path.stem!r}, started from {STARTER}: the same code, its "
                     f"extension renamed {extension}.", _where_to_start(tree, _strings_by_name(tree)),
                     textwrap.dedent(design).strip().splitlines())
    text = header + "\n" + rest.lstrip("\n")
    _check_written(text, path)
    return text


# ----- from the template ----------------------------------------------------------------------------------------
_CPP_TYPES = {"int": "int64_t", "float": "double", "bool": "bool"}


def _from_template(problem: Problem, path: Path, extension: str) -> str:
    init, forward, _ = _reference_forward(problem)
    if forward.args.vararg or forward.args.kwarg or forward.args.kwonlyargs:
        raise ProblemError(f"{_shown(problem.reference_path)}: Model.forward takes *args, **kwargs or keyword-only "
                           f"arguments, which the template does not cover: write {path.name} by hand")
    parameters = forward.args.posonlyargs + forward.args.args
    inputs = [(p.arg, ast.unparse(p.annotation) if p.annotation else "") for p in parameters[1:]]
    cpp = [(n, "torch::Tensor" if "Tensor" in a or not a else _CPP_TYPES.get(a, "torch::Tensor")) for n, a in inputs]
    tensors = [n for n, t in cpp if t == "torch::Tensor"]
    if not tensors:
        raise ProblemError(f"{_shown(problem.reference_path)}: Model.forward takes no tensor: write {path.name} by hand")
    function = extension
    source = tensors[0]
    checks = [f'    TORCH_CHECK({n}.is_cuda(), "{n} must be a CUDA tensor");' for n in tensors]
    checks += [f"    // TODO: every dtype of problem.yaml's shapes ({', '.join(sorted({s.dtype for s in problem.shapes}))}); "
               "this placeholder reads float32.",
               f'    TORCH_CHECK({source}.scalar_type() == torch::kFloat32, "{source}: float32 only, so far");',
               f"    {source} = {source}.contiguous();"]
    defaults = problem.module_defaults()
    shared = "".join(f"\n{c} = {defaults[c]!r}  # the harness sets the shape's value before ModelNew is built\n"
                     for c in problem.shared_constants)
    if init is not None:
        init_parameters = ast.unparse(init.args)
    else:
        init_parameters = "self"
    message = (f"{_shown(path)}: the kernel is a TODO; write it in _cuda_src, then return _ext.{function}(...) "
               "from forward")
    start = _para(f"`_cuda_src` holds the CUDA source: {function}_kernel is a placeholder (a copy of {source}), launched by "
                  f"the host function {function}, which `_cpp_src` declares for load_inline. Write the kernel, give the "
                  "output the reference's shape and dtype in the host function, then make forward return its result. "
                  "Until then forward raises NotImplementedError, which the harness reports as rule `exception`.")
    header = _header(problem, path, f"{problem.name} solution {path.stem!r}, written from harness/templates/solution.py.tmpl "
                     "(the problem has no simple.py): one CUDA kernel that builds, and a forward that raises "
                     "NotImplementedError until the kernel computes what Model.forward returns.", start, [])
    text = string.Template(TEMPLATE.read_text()).substitute(
        header=header, shared_constants=shared, extension=extension, function=function, first_tensor=source, source=source,
        cpp_declaration=f"torch::Tensor {function}({', '.join(f'{t} {n}' for n, t in cpp)})", checks="\n".join(checks),
        init_parameters=init_parameters, forward_parameters=ast.unparse(forward.args),
        call_arguments=", ".join(n for n, _ in inputs), message=message.replace('"', "'"))
    _check_written(text, path)
    return text


def _check_written(text: str, path: Path) -> None:
    """The text parses and defines ModelNew (a failure here is the scaffold's bug, never the author's)."""
    try:
        tree = ast.parse(text)
    except SyntaxError as error:
        raise ProblemError(f"could not write {path.name}: the generated code does not parse (line {error.lineno}); "
                           "please report it") from None
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        raise ProblemError(f"could not write {path.name}: the generated code defines no ModelNew; please report it")
