"""A static scan of a solution's source for suspicious code. Warnings only: rules backed by
evidence reject; this just points a reviewer at lines worth reading."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

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
    except SyntaxError:
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
