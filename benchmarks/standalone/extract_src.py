"""Write a solution file's device-only CUDA strings to a header, so standalone benches compile the
shipped kernels themselves instead of a copy.

Usage: extract_src.py SOLUTION.py OUT.cuh [NAME ...]
NAMEs are module-level string variables, concatenated in the order given (default: `_kernel_src`). Shared
device code that the solution reads by path (a string naming `_*.cuh`, beside it or at the root of
solutions/) goes first, as the solution puts it first."""
import ast
import sys
from pathlib import Path

path, out, names = sys.argv[1], sys.argv[2], sys.argv[3:] or ["_kernel_src"]
tree = ast.parse(open(path).read())
found = {}
for node in tree.body:
    if isinstance(node, ast.Assign):
        for target in node.targets:
            if getattr(target, "id", "") in names:
                found[target.id] = ast.literal_eval(node.value)
missing = [n for n in names if n not in found]
if missing:
    sys.exit(f"{path}: no {', '.join(missing)} string")
folder = Path(path).resolve().parent
shared = []
for node in ast.walk(tree):
    value = getattr(node, "value", None)
    if isinstance(node, ast.Constant) and isinstance(value, str) and value.startswith("_") and value.endswith(".cuh"):
        header = next((f / value for f in (folder, folder.parent) if (f / value).is_file()), None)
        if header is None:
            sys.exit(f"{path}: names {value}, found neither beside it nor in {folder.parent}")
        shared.append(header.read_text())
open(out, "w").write("".join(shared) + "".join(found[n] for n in names))
