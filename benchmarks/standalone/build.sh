#!/bin/bash
# Build the standalone benches (no torch) into benchmarks/standalone/bin: bash benchmarks/standalone/build.sh
# Shipped kernels are extracted from their solution files, so the benches time the shipped code.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p "$here/bin" "$here/gen"
python3 "$here/extract_src.py" "$root/solutions/cross_entropy/fast_v3.py" "$here/gen/ce_v3.cuh"
for src in "$here"/*.cu; do
    name=$(basename "$src" .cu)
    "$NVCC" -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -cudart static -lineinfo \
        -Xptxas -v -I"$here/gen" -o "$here/bin/$name" "$src" 2> "$here/bin/$name.ptxas.txt" || {
        cat "$here/bin/$name.ptxas.txt"; exit 1; }
done
