"""Write a solution file's device-only CUDA strings to a header, so standalone benches compile the
shipped kernels themselves instead of a copy.

Usage: extract_src.py SOLUTION.py OUT.cuh [NAME ...]
NAMEs are module-level string variables, concatenated in the order given (default: `_kernel_src`)."""
import ast
import sys

path, out, names = sys.argv[1], sys.argv[2], sys.argv[3:] or ["_kernel_src"]
found = {}
for node in ast.parse(open(path).read()).body:
    if isinstance(node, ast.Assign):
        for target in node.targets:
            if getattr(target, "id", "") in names:
                found[target.id] = ast.literal_eval(node.value)
missing = [n for n in names if n not in found]
if missing:
    sys.exit(f"{path}: no {', '.join(missing)} string")
open(out, "w").write("".join(found[n] for n in names))
