#!/bin/bash
# Build the standalone benches (no torch): bash benchmarks/standalone/build.sh [OUT_DIR]
# (OUT_DIR defaults to benchmarks/standalone/bin, which is git-ignored and carried to the GPU machine.)
# Shipped kernels are extracted from their solution files, so the benches time the shipped code.
# BASE=<git revision> also builds ce_stream_base and infonce_bench_base from that revision's solution files and
# bench sources (in OUT_DIR/base), so that one device call can time the code before and after a change side by side:
# across calls the GPU machines differ by 1-2%, more than most changes are worth.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
bin=${1:-$here/bin}
gen="$bin/gen"
mkdir -p "$bin" "$gen"
# The device strings of the solution files under SRC_ROOT, as headers in GEN_DIR.  InfoNCE: wgmma_fused.py's device
# string as is; a BASE revision from before its rename has fast_v3.py and fast.py instead, whose bench wants both
# (fast.py's string is one torch extension source, so only its device part, its anonymous namespace, is kept).
gen_headers() {  # SRC_ROOT GEN_DIR
    local src=$1 out=$2
    local ce="$src/solutions/cross_entropy/tma_pieces.py"
    [ -f "$ce" ] || ce="$src/solutions/cross_entropy/fast_v3.py"  # a BASE revision before the rename
    python3 "$here/extract_src.py" "$ce" "$out/ce_v3.cuh"
    if [ -f "$src/solutions/infonce/wgmma_fused.py" ]; then
        python3 "$here/extract_src.py" "$src/solutions/infonce/wgmma_fused.py" "$out/infonce_wgmma_fused.cuh"
    else
        python3 "$here/extract_src.py" "$src/solutions/infonce/fast_v3.py" "$out/infonce_v3.cuh"
        python3 "$here/extract_src.py" "$src/solutions/infonce/fast.py" "$out/infonce_fast_full.cuh" _cuda_src
        python3 - "$out/infonce_fast_full.cuh" "$out/infonce_fast_dev.cuh" <<'EOF_PY'
import sys
lines = open(sys.argv[1]).read().splitlines(keepends=True)
start = lines.index("namespace {\n")
end = lines.index("}  // namespace\n", start)
open(sys.argv[2], "w").write("".join(lines[start:end + 1]))
EOF_PY
    fi
}
gen_headers "$root" "$gen"
# softmax_regs.cu (not built from a BASE revision) compiles register_rows.py's device string.
python3 "$here/extract_src.py" "$root/solutions/softmax/register_rows.py" "$gen/softmax_register_rows.cuh" _device_src
for src in "$here"/*.cu; do
    name=$(basename "$src" .cu)
    case "$name" in infonce_bench|wgmma_rate|stream_probe|merge_probe) continue ;; esac  # need sm_90a: built below
    "$NVCC" -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -cudart static -lineinfo \
        -Xptxas -v -I"$gen" -o "$bin/$name" "$src" 2> "$bin/$name.ptxas.txt" || {
        cat "$bin/$name.ptxas.txt"; exit 1; }
done

# The InfoNCE bench and the wgmma rate probe (both compile wgmma_fused.py's device string), side by side.
build_sm90a() {  # NAME
    "$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -cudart static -lineinfo -Xptxas -v -I"$here" \
        -I"$gen" -o "$bin/$1" "$here/$1.cu" 2> "$bin/$1.ptxas.txt" || { cat "$bin/$1.ptxas.txt"; return 1; }
}
build_sm90a infonce_bench &
build_sm90a wgmma_rate &
wait -n && wait -n  # both must succeed
"$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -cudart static -lineinfo -Xptxas -v -I"$here" -I"$gen" \
    -o "$bin/stream_probe" "$here/stream_probe.cu" 2> "$bin/stream_probe.ptxas.txt" || {
    cat "$bin/stream_probe.ptxas.txt"; exit 1; }
# merge_probe ends one of its stand-ins with the InfoNCE solution's own finish_cta
"$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -cudart static -lineinfo \
    -Xptxas -v -I"$here" -I"$gen" -o "$bin/merge_probe" "$here/merge_probe.cu" \
    2> "$bin/merge_probe.ptxas.txt" || { cat "$bin/merge_probe.ptxas.txt"; exit 1; }

# BASE: the same two benches from another revision (its own bench sources, which match its solution files).
if [ -n "${BASE:-}" ]; then
    tree="$bin/base/tree"
    rm -rf "$tree" && mkdir -p "$tree"
    git -C "$root" archive "$BASE" solutions benchmarks/standalone | tar -x -C "$tree"
    gen_headers "$tree" "$bin/base"
    sa="$tree/benchmarks/standalone"
    "$NVCC" -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -cudart static -lineinfo -I"$bin/base" \
        -o "$bin/ce_stream_base" "$sa/ce_stream.cu" &
    "$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -cudart static -lineinfo -I"$sa" -I"$bin/base" \
        -o "$bin/infonce_bench_base" "$sa/infonce_bench.cu" &
    wait -n && wait -n
    echo "built $bin/ce_stream_base and $bin/infonce_bench_base from $(git -C "$root" rev-parse --short "$BASE")"
fi
