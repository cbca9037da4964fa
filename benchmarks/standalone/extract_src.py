"""Write a solution file's device-only CUDA string (its `_kernel_src`) to a header, so standalone
benches compile the shipped kernel itself instead of a copy. Usage: extract_src.py SOLUTION.py OUT.cuh"""
import ast
import sys

tree = ast.parse(open(sys.argv[1]).read())
for node in tree.body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_kernel_src" for t in node.targets):
        open(sys.argv[2], "w").write(ast.literal_eval(node.value))
        break
else:
    sys.exit(f"{sys.argv[1]}: no _kernel_src string")
