#!/bin/bash
# Build the standalone benches (no torch): bash benchmarks/standalone/build.sh [OUT_DIR]
# (OUT_DIR defaults to benchmarks/standalone/bin, which is git-ignored and carried to the GPU machine.)
# Shipped kernels are extracted from their solution files, so the benches time the shipped code.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
bin=${1:-$here/bin}
gen="$bin/gen"
mkdir -p "$bin" "$gen"
python3 "$here/extract_src.py" "$root/solutions/cross_entropy/fast_v3.py" "$gen/ce_v3.cuh"
python3 "$here/extract_src.py" "$root/solutions/softmax/fast_v4.py" "$gen/softmax_v4.cuh" _v1_kernels_src _v4_kernels_src
for src in "$here"/*.cu; do
    name=$(basename "$src" .cu)
    "$NVCC" -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -cudart static -lineinfo \
        -Xptxas -v -I"$gen" -o "$bin/$name" "$src" 2> "$bin/$name.ptxas.txt" || {
        cat "$bin/$name.ptxas.txt"; exit 1; }
done
