"""Static scans of a solution's source.

scan_source: warnings only, pointing a reviewer at lines worth reading (regex over the source without its
prose). scan_violations: a verdict, from the syntax tree, for code honest solutions never contain
(introspection, patching what the harness relies on, torch's mode switches, device code that calls the
Python C API); it covers what raises no audit event at run time (harness/guard.py)."""
from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

from .problem import private_files

PATTERNS = [
    (r"torch\.cuda\.Stream|cudaStreamCreate|torch\.cuda\.stream\(|ExternalStream|getStreamFromPool", "uses its own CUDA stream"),
    (r"\bthreading\b|concurrent\.futures|multiprocessing|\bThread\(", "starts threads or processes"),
    (r"\bgc\.|get_objects|sys\._getframe|\binspect\.|f_back|f_locals", "inspects the interpreter (gc, frames)"),
    (r"elapsed_time|perf_counter|torch\.cuda\.Event|\btime\.time\b", "touches timers"),
    (r"allclose|assert_close|isclose", "touches comparison functions"),
    (r"\bharness\b", "refers to the harness"),
    (r"setattr\(\s*(torch|time|harness)|(torch|time)\.[A-Za-z_.]+\s*=[^=]|__code__|builtins", "patches attributes of torch, time or builtins"),
    (r"os\.environ|getenv|/proc/", "reads the environment"),
    (r"data_ptr\(\)\s*(in|not in|==)|_cache\b|lru_cache|functools\.cache", "may cache results across calls"),
    (r"ctypes|cffi", "loads native code outside torch's extension loader"),
]


def _without_prose(text: str) -> str:
    """The source with comments and docstrings blanked (line numbers kept): prose that names a trick
    is not the trick. String literals that are code (CUDA sources) stay."""
    lines = text.splitlines(keepends=True)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return text
    spans = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            spans.append((body[0].lineno, body[0].end_lineno))
    for first, last in spans:
        for i in range(first - 1, last):
            lines[i] = "\n"
    try:
        for token in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
            if token.type == tokenize.COMMENT:
                row, col = token.start
                lines[row - 1] = lines[row - 1][:col] + "\n"
    except (tokenize.TokenError, IndentationError):
        pass
    return "".join(lines)


def scan_source(path: Path, reference_ops=()) -> list:
    try:
        text = _without_prose(Path(path).read_text(errors="replace"))
    except OSError as error:
        return [f"cannot read source: {error}"]
    warnings = []
    for pattern, message in PATTERNS:
        match = re.search(pattern, text)
        if match:
            line = text.count("\n", 0, match.start()) + 1
            warnings.append(f"line {line}: {message} ({match.group(0).strip()!r})")
    for op in reference_ops:
        position = text.find(op)
        if position >= 0 and op not in ("@",):
            warnings.append(f"line {text.count(chr(10), 0, position) + 1}: calls {op}, an op of the reference")
    if "load_inline" not in text and "cpp_extension" not in text:
        warnings.append("builds no CUDA extension (no load_inline)")
    return warnings


def needs_cuda(path: Path) -> bool:
    """True when the solution builds CUDA code: it cannot run on a machine without a GPU. (A C++-only
    extension, load_inline with cpp_sources alone, builds and runs on the CPU.)"""
    text = Path(path).read_text(errors="replace")
    return "cuda_sources" in text or bool(re.search(r"\.cu['\"]", text)) or "with_cuda=True" in text


# ----- violations: what honest solutions never do, found in the syntax tree ----------------------------------
# Modules a solution has no business importing.
BANNED_MODULES = {
    "inspect": "imports inspect (frames)", "ctypes": "imports ctypes (raw memory)", "_ctypes": "imports ctypes (raw memory)",
    "cffi": "imports cffi (raw memory)", "harness": "imports the harness", "marshal": "imports marshal (bytecode)",
    "dis": "imports dis (bytecode)", "pdb": "imports a debugger", "bdb": "imports a debugger", "trace": "imports trace",
    "tracemalloc": "imports tracemalloc (allocation stacks)", "code": "imports code (an interpreter)",
    "codeop": "imports codeop (compiles code)", "faulthandler": "imports faulthandler (stack dumps)",
}
# Names and attributes that reach frames, every object, tracing, code objects or torch's mode switches.
BANNED_NAMES = {
    **dict.fromkeys(("_getframe", "_getframemodulename", "_current_frames", "_current_exceptions"), "reads interpreter frames"),
    **dict.fromkeys(("f_back", "f_locals", "f_globals", "f_builtins", "f_code", "tb_frame", "gi_frame", "cr_frame", "ag_frame",
                     "gi_code"), "walks interpreter frames"),
    **dict.fromkeys(("settrace", "setprofile", "settrace_all_threads", "setprofile_all_threads", "addaudithook"),
                    "traces or audits the interpreter"),
    **dict.fromkeys(("get_objects", "get_referrers", "get_referents"), "lists live objects (gc)"),
    **dict.fromkeys(("__closure__", "cell_contents", "__code__", "__globals__", "__builtins__", "__defaults__",
                     "__kwdefaults__", "__subclasses__", "CodeType", "FrameType"), "reaches into functions or code objects"),
    **dict.fromkeys(("_disable_current_modes", "_DisableTorchDispatch", "DisableTorchFunction", "DisableTorchFunctionSubclass",
                     "_pop_mode", "_pop_mode_temporarily", "_pop_torch_function_stack", "_pop_torch_dispatch_stack",
                     "_push_mode", "_python_dispatch", "TorchDispatchMode", "TorchFunctionMode", "BaseTorchFunctionMode",
                     "_set_torch_function_mode", "_len_torch_function_stack", "_len_torch_dispatch_stack",
                     "_ExcludeDispatchKeyGuard", "_IncludeDispatchKeyGuard", "_dispatch_tls_set_dispatch_key_excluded",
                     "_dispatch_tls_set_dispatch_key_included", "_enable_record_function", "_toggle_collection_dynamic",
                     "_RecordFunctionFast", "_set_record_function", "_get_dispatch_stack_at", "_get_dispatch_mode",
                     "_get_current_dispatch_mode", "_get_current_dispatch_mode_stack", "_get_function_stack_at"),
                    "switches torch's function or dispatch modes, or its op recording"),
    **dict.fromkeys(("redispatch", "redispatch_boxed", "_op_dk", "DispatchKeySet", "_dispatch_call_boxed", "call_boxed",
                     "_dispatch_library", "_dispatch_get_computed_kernel_for_dispatch_key"),
                    "calls an op below torch's dispatch modes and op recording (redispatch)"),
    **dict.fromkeys(("TensorExprKernel", "_jit_set_texpr_fuser_enabled", "_jit_override_can_fuse_on_cpu",
                     "_jit_override_can_fuse_on_gpu", "_jit_set_llga_enabled", "_jit_set_texpr_reductions_enabled"),
                    "compiles ops with a TorchScript fuser, which no op record sees"),
    **dict.fromkeys(("meta_path", "path_hooks"), "installs import hooks"),
    "_construct_storage_from_data_pointer": "makes a tensor over a raw address",
    **dict.fromkeys(("from_file", "fromfile", "memmap"), "reads or maps files through native code"),
}
# Attributes on the gc module beyond collecting (gc.collect, gc.disable... stay allowed).
BANNED_GC = {"callbacks", "garbage", "set_debug"}
# Builtins that run or compile code given as data.
BANNED_BUILTINS = {"exec": "runs code from a string (exec)", "eval": "runs code from a string (eval)",
                   "compile": "compiles code at run time (compile)", "__import__": "imports by computed name (__import__)",
                   "breakpoint": "starts a debugger (breakpoint)"}
# Modules whose attributes a solution must not write: the harness and the timing path rely on them.
PROTECTED_ROOTS = {"torch", "time", "os", "sys", "builtins", "gc", "threading", "json", "hmac", "hashlib", "struct", "posix",
                   "_thread", "posixpath", "pathlib", "io", "operator", "functools", "types", "traceback", "warnings",
                   "importlib", "harness", "math", "random", "numpy", "triton"}
# Flags that make torch MORE exact: a solution may switch them off (TF32 and reduced-precision reductions).
EXACTNESS_FLAGS = {"allow_tf32", "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"}
# cuDNN switches a solution may set to a constant: they choose algorithms in its own process only, and the
# outputs are checked whatever they pick (torch.backends.cudnn.benchmark = True is common in solutions).
CUDNN_SWITCHES = {"benchmark", "deterministic", "enabled"}
# In device code (the strings handed to load_inline): the Python C API, other processes, host threads.
NATIVE_PATTERNS = [
    (r"\b_?Py(Eval|Frame|ThreadState|InterpreterState|Import|Run|Sys|GC|Code|Function|Cell|Module_GetDict|Dict_(Set|Get)Item"
     r"|Object_(Get|Set)Attr)\w*|\bPy_CompileString|\b_PyRuntime", "introspection", "calls the Python C API"),
    (r"\b(py|pybind11)::(module_?::import|globals|exec|eval|eval_file)\b", "introspection", "runs Python code from native code"),
    (r"\b(dlopen|dlsym|ptrace|process_vm_readv|process_vm_writev)\b", "introspection", "loads symbols or reads other processes"),
    (r"/proc/|/dev/mem\b", "introspection", "opens /proc or /dev/mem"),
    # a call sits where code does (a line's start, after an operator, `::`, `return`...), never after a word as in
    # prose ("on this system (sm_90)"); string literals inside the code are blanked first (printf messages)
    (r"(?:^|(?<=[^\w\s])|(?<=\breturn)|(?<=\belse)|(?<=\bdo))[ \t]*\b(syscall|fork|vfork|execve|execv|execvp|system|popen"
     r"|posix_spawn)\s*\(", "sandbox-violation", "starts processes or makes raw system calls"),
    (r"\bstd::(thread|async|jthread)\b(?!::hardware_concurrency)|\bpthread_create\b", "background-thread", "starts a host thread"),
]
# The patterns above that judge code, not names: they see the code with its string literals blanked.
_CODE_ONLY_RULES = frozenset({"sandbox-violation", "background-thread"})
NATIVE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".cpp", ".cc", ".cxx", ".inl")


def _strip_c_comments(text: str) -> str:
    """C/C++ comments out of device code; only those that start a line or follow a blank, so that a path
    written "/proc//self/mem" stays what it is."""
    parts, done, start = [], 0, text.find("/*")
    while start >= 0:  # one pass (a regex for this took quadratic time on a string of unclosed "/*")
        if start == 0 or text[start - 1].isspace():
            end = text.find("*/", start + 2)
            if end < 0:
                break  # no comment closes after here
            parts += [text[done:start], " "]
            done = end + 2
            start = text.find("/*", done)
        else:
            start = text.find("/*", start + 1)
    text = "".join(parts) + text[done:]
    return re.sub(r"(^|(?<=\s))//[^\n]*", "", text, flags=re.M)


def _docstring_ids(tree) -> set:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            found.add(id(body[0].value))
    return found


def _root(node):
    """The name an attribute/subscript chain starts from (torch for torch.cuda.Event.x), and the chain."""
    parts = []
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
        elif isinstance(node, ast.Call):
            return None, []
        node = node.value
    if isinstance(node, ast.Name):
        return node.id, [node.id] + parts[::-1]
    return None, []


class _Scanner(ast.NodeVisitor):
    def __init__(self, docstrings: set, folder: Path | None, private=()):
        self.found = []
        self.found_set = set()
        self.docstrings = docstrings
        self.folder = folder
        self.private = {p.name: p for p in private}  # shared device code the solution may read, by name
        self.protected = set()   # names bound to protected modules or to things imported from them
        self.bound = set()       # names the module binds itself (a local `compile` is not the builtin)
        self.aliases = {}        # import aliases: cudnn -> torch.backends.cudnn, ENV -> os.environ
        self.in_main = False     # inside `if __name__ == "__main__":` (never run when the harness imports the file)

    def flag(self, node, rule, reason):
        item = (rule, f"line {getattr(node, 'lineno', 0)}: {reason}")
        if item not in self.found_set:  # a set beside the list: 20,000 findings took minutes in a list
            self.found_set.add(item)
            self.found.append(item)

    # --- imports ---
    def visit_Import(self, node):
        for alias in node.names:
            top = alias.name.split(".")[0]
            if top in BANNED_MODULES:
                self.flag(node, "introspection", BANNED_MODULES[top])
            if top in PROTECTED_ROOTS:
                self.protected.add(alias.asname or top)
            if alias.asname:
                self.aliases[alias.asname] = alias.name.split(".")
            self.bound.add((alias.asname or top))
            self._check_name(node, alias.name.split(".")[-1])

    def visit_ImportFrom(self, node):
        module = node.module or ""
        top = module.split(".")[0]
        if node.level:
            self.flag(node, "introspection", "relative import (a solution is a single file)")
        if top in BANNED_MODULES:
            self.flag(node, "introspection", BANNED_MODULES[top])
        for part in module.split("."):
            self._check_name(node, part)
        for alias in node.names:
            self._check_name(node, alias.name)
            if top in PROTECTED_ROOTS:
                self.protected.add(alias.asname or alias.name)
            if module and not node.level:
                self.aliases[alias.asname or alias.name] = module.split(".") + [alias.name]
            self.bound.add(alias.asname or alias.name)

    # --- names, attributes, strings ---
    def _check_name(self, node, name):
        if name in BANNED_NAMES:
            self.flag(node, "introspection", f"{BANNED_NAMES[name]} ({name})")

    def visit_Name(self, node):
        self._check_name(node, node.id)
        if node.id in BANNED_BUILTINS and node.id not in self.bound:
            self.flag(node, "introspection", BANNED_BUILTINS[node.id])

    def visit_Attribute(self, node):
        self._check_name(node, node.attr)
        root, chain = _root(node)
        if root == "sys" and node.attr == "monitoring":
            self.flag(node, "introspection", "traces the interpreter (sys.monitoring)")
        if root == "gc" and node.attr in BANNED_GC:
            self.flag(node, "introspection", f"reaches gc internals (gc.{node.attr})")
        if node.attr == "__dict__" and root in self.protected:
            self.flag(node, "introspection", f"reaches a module's dict ({'.'.join(chain)})")
        chain = self._canonical(chain)
        if (chain[:2] == ["torch", "compile"] or chain[:2] == ["torch", "_dynamo"]) and not self.in_main:
            self.flag(node, "introspection", "uses torch.compile, whose frame-evaluation hook (it sees every frame, the "
                                             "harness's included) is sealed in a solution's process")
        self.generic_visit(node)

    def visit_Constant(self, node):
        value = node.value
        if not isinstance(value, str) or id(node) in self.docstrings:
            return
        if value in BANNED_NAMES:
            self._check_name(node, value)
        if value == "harness" or value.startswith("harness."):
            self.flag(node, "introspection", f"names the harness ({value!r})")
        code = _strip_c_comments(value)
        if "/proc/" in code or "/dev/mem" in code:
            self.flag(node, "introspection", "names /proc or /dev/mem")
        self._check_native(node, value, "")
        if self.folder is not None and value.endswith(NATIVE_SUFFIXES) and "\n" not in value and len(value) < 200:
            for named in self._named_files(value):
                try:
                    self._check_native(node, named.read_text(errors="replace"), f" in {value}")
                except OSError:
                    pass

    def _named_files(self, value: str) -> set:
        """The device-code files a string names: one beside the solution, or a shared private file."""
        found = set()
        beside = self.folder / value
        try:
            if beside.is_file() and beside.resolve().parent == self.folder.resolve():
                found.add(beside.resolve())
        except OSError:
            pass
        if Path(value).name in self.private:
            found.add(self.private[Path(value).name])
        return found

    def _check_native(self, node, text, where):
        code = _strip_c_comments(text)
        # A literal runs to its closing quote or the line's end: one left open would make the search quadratic
        bare = re.sub(r'"(?:[^"\\\n]|\\.)*(?:"|$)', '""', code, flags=re.M)
        for pattern, rule, reason in NATIVE_PATTERNS:
            match = re.search(pattern, bare if rule in _CODE_ONLY_RULES else code, re.M)
            if match:
                self.flag(node, rule, f"device code{where} {reason} ({match.group(0).strip()})")

    # --- calls ---
    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "set_float32_matmul_precision" \
                and not (node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "highest"):
            self.flag(node, "introspection", "turns on reduced precision (set_float32_matmul_precision below 'highest'): "
                                             "the outputs are judged against float32 math")
        if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and node.args:
            root, chain = _root(node.args[0])
            if root is None and isinstance(node.args[0], ast.Name):
                root = node.args[0].id
            if root in self.protected:
                self.flag(node, "introspection", f"{func.id}() on {'.'.join(chain) or root}")
        if isinstance(func, ast.Name) and func.id == "vars" and node.args:
            root = node.args[0].id if isinstance(node.args[0], ast.Name) else _root(node.args[0])[0]
            if root in self.protected:
                self.flag(node, "introspection", f"reaches a module's dict (vars({root}...))")
        if isinstance(func, ast.Attribute) and func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and node.args[0].value.split(".")[0] in BANNED_MODULES:
            self.flag(node, "introspection", BANNED_MODULES[node.args[0].value.split(".")[0]])
        self.generic_visit(node)

    # --- writes ---
    def _check_target(self, node, target, value=None):
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._check_target(node, element)
            return
        if isinstance(target, ast.Starred):
            return self._check_target(node, target.value)
        if isinstance(target, ast.Name):
            self.bound.add(target.id)
            if value is not None and not isinstance(value, ast.Call):
                root, _ = _root(value)
                if (root or (value.id if isinstance(value, ast.Name) else None)) in self.protected:
                    self.protected.add(target.id)  # E = torch.cuda.Event: E is torch's
            return
        if isinstance(target, ast.Attribute) and target.attr in ("__class__", "__bases__", "__dict__", "__code__",
                                                                  "__defaults__", "__kwdefaults__"):
            self.flag(node, "introspection", f"rewrites .{target.attr}")
            return
        root, chain = _root(target)
        if root not in self.protected:
            return
        dotted = ".".join(chain)
        chain = self._canonical(chain)
        if isinstance(target, ast.Subscript):
            if chain[:2] == ["os", "environ"]:
                return  # setting a build variable (TORCH_CUDA_ARCH_LIST, MAX_JOBS) before load_inline
            self.flag(node, "introspection", f"writes into {dotted}[...]")
            return
        if isinstance(target, ast.Attribute) and target.attr in EXACTNESS_FLAGS and "backends" in chain:
            if isinstance(value, ast.Constant) and value.value is False:
                return  # torch.backends.cuda.matmul.allow_tf32 = False: more exact, never faster
            if chain == ["torch", "backends", "cudnn", "allow_tf32"] and isinstance(value, ast.Constant) and value.value is True:
                return  # cuDNN's default in a solution's process: changes nothing
            self.flag(node, "introspection", f"turns on reduced precision ({dotted}): the outputs are judged against "
                                             "float32 math; set it to False or leave it alone")
            return
        if chain[:3] == ["torch", "backends", "cudnn"] and len(chain) == 4 and chain[3] in CUDNN_SWITCHES \
                and isinstance(value, ast.Constant) and isinstance(value.value, bool):
            return
        self.flag(node, "introspection", f"writes the attribute {dotted} of a module the harness relies on")

    def _canonical(self, chain: list) -> list:
        """The chain with an import alias at its head spelled out (cudnn.benchmark -> torch.backends.cudnn.benchmark)."""
        return self.aliases[chain[0]] + chain[1:] if chain and chain[0] in self.aliases else chain

    def visit_If(self, node):
        test = node.test
        if isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__" \
                and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant) \
                and test.comparators[0].value == "__main__":
            was, self.in_main = self.in_main, True  # a self-test block: every other rule still applies in it
            self.generic_visit(node)
            self.in_main = was
            return
        self.generic_visit(node)

    def visit_Assign(self, node):
        for target in node.targets:
            self._check_target(node, target, node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self._check_target(node, node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self._check_target(node, node.target, node.value)
        self.generic_visit(node)

    def visit_Delete(self, node):
        for target in node.targets:
            self._check_target(node, target)
        self.generic_visit(node)

    def visit_FunctionDef(self, node):
        self.bound.add(node.name)
        for arg in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
            self.bound.add(arg.arg)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self.bound.add(node.name)
        self.generic_visit(node)


def scan_violations(path) -> list:
    """[(rule, 'line N: what')] for code honest solutions never contain: introspection (frames, gc object
    lists, tracing, code objects, ctypes, exec/eval/compile, /proc), patches of the modules the harness
    relies on, torch's mode switches, and device code that calls the Python C API or starts processes or
    threads. Each finding rejects the solution (scan_source's findings are warnings only)."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []  # unreadable: the import reports it
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20000))  # the visitor recurses once per level of nesting (a long a + b + ...)
    try:
        return _violations(path, text)
    except (SyntaxError, ValueError):
        return []  # not Python: the import reports it
    except (RecursionError, MemoryError) as error:  # fail closed: what cannot be scanned is not imported
        return [("introspection", f"line 1: nested too deeply for the static scan to read ({type(error).__name__}); "
                                  "a solution must be scannable")]
    finally:
        sys.setrecursionlimit(limit)


def _violations(path: Path, text: str) -> list:
    tree = ast.parse(text)
    scanner = _Scanner(_docstring_ids(tree), path.parent, private_files(path))
    # Bindings first (a later `import torch as t` still protects t where it was used before), then the checks.
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PROTECTED_ROOTS:
                    scanner.protected.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PROTECTED_ROOTS:
            for alias in node.names:
                scanner.protected.add(alias.asname or alias.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scanner.bound.add(node.name)
        elif isinstance(node, ast.arg):
            scanner.bound.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            scanner.bound.add(node.id)
        elif isinstance(node, ast.alias):
            scanner.bound.add((node.asname or node.name).split(".")[0])
    scanner.visit(tree)
    return sorted(scanner.found, key=lambda item: int(item[1].split(":")[0].split()[1]))
