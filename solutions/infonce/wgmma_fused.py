"""InfoNCE loss, v3: Hopper wgmma (sm_90a) 3xTF32 / 3xFP16 GEMM fused with an online log-sum-exp, one launch.

loss = mean_b softplus(lse_j(<q_b, n_j>/T) - pos_b),  pos_b = cos(q_b, p_b)/T   (as fast.py)

Design (details and the error argument: docs/perf-notes/infonce.md, sections "Eighth session: fast_v3 (wgmma)",
"Ninth session", "Twelfth session" and, for 3xFP16, "Twenty-first session"):
  * CTA = 2 warpgroups = 128 query rows x a contiguous range of BN-wide negative tiles (split-N).  Per
    iteration (a k-tile of 32 floats) thread 0's two tensor-map copies (TMA) bring the raw query and negatives
    tiles into a ring of stages in shared memory, PD k-tiles ahead; every thread reads its pieces back, splits
    them into tf32 hi/lo (hi = round-to-nearest(x), lo = round-to-nearest(x - hi)), keeps the query parts in
    registers (wgmma's A operand) and writes the negatives' parts once per CTA into a ring of hi/lo slots in the
    128-byte-swizzled K-major layout (wgmma's B operand, read through smem descriptors).  (The bench also builds
    the eighth session's variants that load straight to registers.)
    Small problems (one n-tile per CTA, one wave, D <= 512 at BN = 40: the seed shape) run the B-resident kernel
    instead: each CTA copies its whole negatives tile by TMA and splits it once into tf32 hi/lo in shared memory
    (its first two k-tiles before the loop, the rest at the first iteration that reads them), so the K loop has
    no B work and no CTA barrier: each warpgroup streams its own 64 query rows through its own ring.
    Each k8-step issues three wgmma.m64nBNk8.f32.tf32 (a_lo.b_hi, a_hi.b_lo, a_hi.b_hi, fast.py's order);
    one batch always waits behind the running one (wait_group 1).  A K permutation (identical for both
    operands) lets every thread use 16-byte loads and conflict-free 4-byte smem stores.
  * 3xFP16 (the B-resident kernel's F16 form, automatic wherever the B-resident kernel runs): fp16 keeps tf32's 11
    significant bits at twice the tensor rate, so each k16-step issues three wgmma.m64nBNk16.f32.f16 on
    hi = rn_f16(x), lo = rn_f16((x - hi) * 2^11): a_lo.b_hi and a_hi.b_lo into a second accumulator, a_hi.b_hi
    into the first, summed as acc + 2^-11 acc_x at the end of the tile.  Per entry |x - hi - 2^-11 lo| <= 2^-22 |x|
    + 2^-36 for every |x| < 65520 (the 2^11 keeps lo out of fp16's subnormals), so the products are as exact as
    3xTF32's.  Entries beyond fp16's range (or inf, NaN) make the dot products of their row non-finite; those are
    recomputed in fp32 from global memory (slow, never wrong).  The resident k-tile is half the bytes (hi and lo
    in one 128-byte row per negative), so the tile fits for twice the D.
  * After each n-tile the accumulators are folded into a running per-row (max, sum of exp2): logits never
    touch memory.  Each CTA writes one (max, sum) per row; the last CTA of the grid (acq_rel ticket) merges them
    in split order with the positive cosines (computed by the block's CTAs during the pipeline fill) into
    softplus terms and adds them in a fixed order.  Deterministic, no spin waits; the counter resets itself.
  * Tiles: 128 x 40, B-resident where it fits (seed 256 x 2560: 2 x 64 = 128 CTAs of one tile each), else
    128 x 40 or 128 x 128 (big problems); the host picks tile and split count with fast.py's wave model.  Seed
    shape: the 3xFP16 K-split pairs of 128 x 80 tiles.  Inputs that cannot use 16-byte loads
    (D % 4 != 0 or a misaligned base) run fast.py's mma.sync kernels (copied below as `legacy`).
  * The device code (`_kernel_src`) has no torch headers: benchmarks/standalone/infonce_bench.cu compiles the
    same string and calls the same plan()/launch().
The workspace and its counters are persistent per device: do not run this op concurrently on two streams of
one device (as fast.py). Built for sm_90a only (wgmma): it runs on H100/H200-class GPUs and nowhere else.
Measured on the H200 (2026-12-02, standalone bench, twelfth session): 4.86-4.88 ms at 4096x1024 N=65536 (fast.py
8.72-8.78 ms in the same calls), 19.1-19.3 us at the seed shape (fast.py 27.8-28.2 us); every bench check passes.
make eval run 825de696: 0.0200 ms at the seed shape, 4.928 ms at the big shape.  3xFP16 (2026-12-03, bench): 16.1-16.3
us at the seed shape against 18.1-18.3 for the 3xTF32 pairs in the same calls; with the pair's sums sent by st.async,
15.9-16.0.  make eval run e8edc9a3 (3xFP16, before st.async): 0.01742 ms at the seed shape, 4.884 ms at the big shape.
Twenty-second session: the kernels' code compacted (slow paths out of line: after each L2 flush every line of code
comes from memory); make eval run 6215a01a: 0.01594 ms at the seed shape, 4.716 ms at the big shape.  The positive
cosines after the K loop with a K split: 14.6-14.7 us at the seed shape in the bench.
Twenty-fifth session: the folds' arithmetic (the max of the raw dot products times the scale, one FFMA and one ex2
per term, four independent chains), the K split's positive cosines from rows staged in shared memory with float norms
refined in double, 1/B from the host: 14.4-14.6 us at the seed shape in the bench against 14.7 for the previous file.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

TEMPERATURE = 0.1  # overridden per shape (same name as the reference module constant)

_cpp_src = ("torch::Tensor infonce_fast_v3(torch::Tensor query, torch::Tensor positive, torch::Tensor negatives, "
            "double temperature, int64_t mode, int64_t variant, int64_t splits);")

# Device code and the plain-C++ plan/launch (no torch headers), shared with the standalone bench.
_kernel_src = r"""
// ============================================================================================================
// fast_v3 device code (no torch headers; benchmarks/standalone/infonce_bench.cu compiles this same string).
// Needs sm_90a (wgmma).  Two paths:
//   * infonce_wgmma_kernel: Hopper wgmma 3xTF32 GEMM fused with an online log-sum-exp (16-byte-loadable inputs).
//   * legacy::infonce_fused_kernel: fast.py's mma.sync kernel, unchanged, for D % 4 != 0 or misaligned bases.
// plan() / launch() (plain host C++) pick the path, the tile variant and the split count; the torch wrapper and
// the standalone bench both call them, so the bench times exactly what the solution runs.
// ============================================================================================================
#include <cuda.h>  // CUtensorMap and cuTensorMapEncodeTiled's prototype (called through the runtime's entry point)
#include <cuda_runtime.h>
#include <stdint.h>
#include <stddef.h>
#include <math.h>
#include <algorithm>

namespace infonce_v3 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// hi = tf32 round-to-nearest (ties away) of x, lo = the same rounding of x - hi (exact in fp32); both have
// their low 13 bits cleared, so the tensor core's treatment of those bits does not matter.  Same as fast.py.
__device__ __forceinline__ void split_tf32(uint32_t xbits, uint32_t& hi, uint32_t& lo) {
    const uint32_t h = (xbits + 0x1000u) & 0xffffe000u;
    const float r = __uint_as_float(xbits) - __uint_as_float(h);
    hi = h;
    lo = (__float_as_uint(r) + 0x1000u) & 0xffffe000u;
}

// ------------------------------------------------------------------------------------------------------------
// legacy: fast.py's kernel (solutions/infonce/fast.py), copied without change except the namespace; see the
// notes there and in docs/perf-notes/infonce.md.  Used only when 16-byte loads are impossible.
// ------------------------------------------------------------------------------------------------------------
namespace legacy {

constexpr int BK = 32;

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
    const int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <int WM, int WN, int MF, int NF, int KSPLIT>
struct Tile {
    static constexpr int kThreads = KSPLIT * WM * WN * 32;
    static constexpr int BM = WM * MF * 16;
    static constexpr int BN = WN * NF * 8;
    static constexpr int kStageFloats = (BM + BN) * BK;
    static constexpr int kRedFloats = KSPLIT > 1 ? (KSPLIT - 1) * WM * WN * MF * NF * 4 * 32 : 0;
};

template <int WM, int WN, int MF, int NF, int KSPLIT, int STAGES, bool VEC4>
__global__ void __launch_bounds__(KSPLIT * WM * WN * 32, 1)
infonce_fused_kernel(const float* __restrict__ q, const float* __restrict__ p, const float* __restrict__ neg,
                     int B, int D, int N, int S, int n_tiles, float scale2, double inv_t,
                     float2* __restrict__ part, double* __restrict__ pos_buf, unsigned* __restrict__ counter,
                     float* __restrict__ out) {
    using TL = Tile<WM, WN, MF, NF, KSPLIT>;
    constexpr int NT = TL::kThreads, BM = TL::BM, BN = TL::BN, STAGE = TL::kStageFloats;
    constexpr int NWARPS = NT / 32, KSTEPS = BK / 8 / KSPLIT;
    extern __shared__ __align__(128) float smem[];
    __shared__ float red_m[WN][BM], red_s[WN][BM];
    __shared__ int is_last;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kgrp = warp / (WM * WN), wm = (warp / WN) % WM, wn = warp % WN;
    float* red_acc = smem + STAGES * STAGE;
    const int m_tiles = (B + BM - 1) / BM;
    const int split = blockIdx.x / m_tiles, mt = blockIdx.x % m_tiles;
    const int row0 = mt * BM;
    const int t_begin = (int)((long long)split * n_tiles / S);
    const int t_end = (int)((long long)(split + 1) * n_tiles / S);
    const int KT = (D + BK - 1) / BK;
    const int total = (t_end - t_begin) * KT;

    int ld_kt = 0, ld_tile = t_begin, ld_stage = 0;
    constexpr int RSTEP = NT / 8;
    const int ld_r0 = tid >> 3, ld_ch = tid & 7;
    const uint32_t ld_dst0 = smem_u32(smem) + (uint32_t)(ld_r0 * BK + ((ld_ch ^ (ld_r0 & 7)) << 2)) * 4u;
    const size_t row_step = (size_t)RSTEP * D;
    const float* ld_q = q + (size_t)(row0 + ld_r0) * D + ld_ch * 4;
    const float* ld_n = neg + ((size_t)t_begin * BN + ld_r0) * D + ld_ch * 4;
    auto load_stage = [&](int it) {
        if (it < total) {
            if constexpr (VEC4) {
                static_assert(NT % 8 == 0 && BM % RSTEP == 0, "loader layout");
                const uint32_t dst = ld_dst0 + (uint32_t)(ld_stage * STAGE) * 4u;
                const int k0 = ld_kt * BK;
                const bool kok = k0 + ld_ch * 4 < D;
#pragma unroll
                for (int i = 0; i < BM / RSTEP; ++i) {
                    const bool ok = kok && row0 + ld_r0 + i * RSTEP < B;
                    cp_async16(dst + i * RSTEP * BK * 4, ok ? ld_q + i * row_step + k0 : q, ok);
                }
#pragma unroll
                for (int i = 0; i < (BN + RSTEP - 1) / RSTEP; ++i) {
                    const int rl = ld_r0 + i * RSTEP;
                    if (BN % RSTEP == 0 || rl < BN) {
                        const bool ok = kok && ld_tile * BN + rl < N;
                        cp_async16(dst + (BM + i * RSTEP) * BK * 4, ok ? ld_n + i * row_step + k0 : neg, ok);
                    }
                }
            } else {
                const int col0 = ld_tile * BN, k0 = ld_kt * BK;
                float* st = smem + ld_stage * STAGE;
                for (int c = tid; c < (BM + BN) * BK; c += NT) {
                    const int r = c / BK, k = c % BK, gk = k0 + k;
                    const bool isA = r < BM;
                    const int grow = isA ? row0 + r : col0 + (r - BM);
                    const float* base = isA ? q : neg;
                    const bool ok = grow < (isA ? B : N) && gk < D;
                    cp_async4(smem_u32(st + r * BK + ((((k >> 2) ^ (r & 7)) << 2) | (k & 3))),
                              ok ? base + (size_t)grow * D + gk : base, ok);
                }
            }
            if (++ld_stage == STAGES) ld_stage = 0;
            if (++ld_kt == KT) {
                ld_kt = 0;
                ++ld_tile;
                ld_n += (size_t)BN * D;
            }
        }
        cp_async_commit();
    };

    for (int i = 0; i < STAGES - 1; ++i) load_stage(i);

    for (int r = split + S * warp; r < BM; r += S * NWARPS) {
        const int row = row0 + r;
        if (row >= B) break;
        const float* qr = q + (size_t)row * D;
        const float* pr = p + (size_t)row * D;
        float dot = 0.f, qq = 0.f, pp = 0.f;
        if constexpr (VEC4) {
            const float4* q4 = reinterpret_cast<const float4*>(qr);
            const float4* p4 = reinterpret_cast<const float4*>(pr);
#pragma unroll 4
            for (int k = lane; k < D / 4; k += 32) {
                const float4 a = __ldg(q4 + k), b = __ldg(p4 + k);
                dot = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, dot))));
                qq = fmaf(a.x, a.x, fmaf(a.y, a.y, fmaf(a.z, a.z, fmaf(a.w, a.w, qq))));
                pp = fmaf(b.x, b.x, fmaf(b.y, b.y, fmaf(b.z, b.z, fmaf(b.w, b.w, pp))));
            }
        } else {
#pragma unroll 4
            for (int k = lane; k < D; k += 32) {
                const float a = __ldg(qr + k), b = __ldg(pr + k);
                dot = fmaf(a, b, dot);
                qq = fmaf(a, a, qq);
                pp = fmaf(b, b, pp);
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            dot += __shfl_xor_sync(0xffffffffu, dot, off);
            qq += __shfl_xor_sync(0xffffffffu, qq, off);
            pp += __shfl_xor_sync(0xffffffffu, pp, off);
        }
        if (lane == 0) {
            const double nq = fmax(sqrt((double)qq), 1e-8), np = fmax(sqrt((double)pp), 1e-8);
            pos_buf[row] = (double)dot / (nq * np) * inv_t;
        }
    }

    float acc[MF][NF][4];
    float run_m[MF][2], run_s[MF][2];
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) run_m[i][h] = -INFINITY, run_s[i][h] = 0.f;
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    const int a_row = wm * MF * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
    const int a_chk = lane >> 4;
    const int b_row = BM + wn * NF * 8 + (lane >> 4) * 8 + (lane & 7);
    const int b_chk = (lane >> 3) & 1;
    const int sw = lane & 7;

    int rd_stage = 0, rd_kt = 0, rd_tile = t_begin;
    for (int it = 0; it < total; ++it) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        load_stage(it + STAGES - 1);
        const uint32_t st = smem_u32(smem + rd_stage * STAGE);
        if (++rd_stage == STAGES) rd_stage = 0;
        const bool tile_done = ++rd_kt == KT;
#pragma unroll
        for (int kq = 0; kq < KSTEPS; ++kq) {
            const int kk = kgrp * KSTEPS + kq;
            uint32_t ahi[MF][4], alo[MF][4], bhi[NF][2], blo[NF][2];
#pragma unroll
            for (int i = 0; i < MF; ++i) {
                uint32_t raw[4];
                ldsm_x4(raw, st + ((a_row + i * 16) * BK + (((kk * 2 + a_chk) ^ sw) << 2)) * 4);
#pragma unroll
                for (int e = 0; e < 4; ++e) split_tf32(raw[e], ahi[i][e], alo[i][e]);
            }
#pragma unroll
            for (int j = 0; j + 1 < NF; j += 2) {
                uint32_t raw[4];
                ldsm_x4(raw, st + ((b_row + j * 8) * BK + (((kk * 2 + b_chk) ^ sw) << 2)) * 4);
                split_tf32(raw[0], bhi[j][0], blo[j][0]);
                split_tf32(raw[1], bhi[j][1], blo[j][1]);
                split_tf32(raw[2], bhi[j + 1][0], blo[j + 1][0]);
                split_tf32(raw[3], bhi[j + 1][1], blo[j + 1][1]);
            }
            if constexpr (NF % 2) {
                uint32_t raw[2];
                const int row = BM + wn * NF * 8 + (NF - 1) * 8 + (lane & 7);
                ldsm_x2(raw, st + (row * BK + (((kk * 2 + b_chk) ^ sw) << 2)) * 4);
                split_tf32(raw[0], bhi[NF - 1][0], blo[NF - 1][0]);
                split_tf32(raw[1], bhi[NF - 1][1], blo[NF - 1][1]);
            }
#pragma unroll
            for (int i = 0; i < MF; ++i)
#pragma unroll
                for (int j = 0; j < NF; ++j) {
                    mma_tf32(acc[i][j], alo[i], bhi[j]);
                    mma_tf32(acc[i][j], ahi[i], blo[j]);
                    mma_tf32(acc[i][j], ahi[i], bhi[j]);
                }
        }

        if (tile_done) {
            if constexpr (KSPLIT > 1) {
                float* my = red_acc + (((kgrp - 1) * WM * WN + (warp % (WM * WN))) * MF * NF * 4) * 32 + lane;
                if (kgrp > 0) {
#pragma unroll
                    for (int i = 0; i < MF; ++i)
#pragma unroll
                        for (int j = 0; j < NF; ++j)
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                my[((i * NF + j) * 4 + e) * 32] = acc[i][j][e];
                                acc[i][j][e] = 0.f;
                            }
                }
                __syncthreads();
                if (kgrp == 0) {
#pragma unroll
                    for (int g = 1; g < KSPLIT; ++g) {
                        const float* other = red_acc + (((g - 1) * WM * WN + warp) * MF * NF * 4) * 32 + lane;
#pragma unroll
                        for (int i = 0; i < MF; ++i)
#pragma unroll
                            for (int j = 0; j < NF; ++j)
#pragma unroll
                                for (int e = 0; e < 4; ++e) acc[i][j][e] += other[((i * NF + j) * 4 + e) * 32];
                    }
                }
            }
        }
        if (tile_done && kgrp == 0) {
            const int colw = rd_tile * BN + wn * NF * 8 + 2 * (lane & 3);
#pragma unroll
            for (int i = 0; i < MF; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float tmax = -INFINITY;
#pragma unroll
                    for (int j = 0; j < NF; ++j)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const float v = colw + j * 8 + e < N ? acc[i][j][h * 2 + e] * scale2 : -INFINITY;
                            acc[i][j][h * 2 + e] = v;
                            tmax = fmaxf(tmax, v);
                        }
                    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
                    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
                    const float m_new = fmaxf(run_m[i][h], tmax);
                    if (m_new != -INFINITY) {
                        float s = run_s[i][h] * exp2f(run_m[i][h] - m_new);
#pragma unroll
                        for (int j = 0; j < NF; ++j)
#pragma unroll
                            for (int e = 0; e < 2; ++e) s += exp2f(acc[i][j][h * 2 + e] - m_new);
                        run_s[i][h] = s;
                        run_m[i][h] = m_new;
                    }
                }
#pragma unroll
            for (int i = 0; i < MF; ++i)
#pragma unroll
                for (int j = 0; j < NF; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
        }
        if (tile_done) rd_kt = 0, ++rd_tile;
    }
    cp_async_wait<0>();

    if (kgrp == 0) {
#pragma unroll
        for (int i = 0; i < MF; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float s = run_s[i][h];
                s += __shfl_xor_sync(0xffffffffu, s, 1);
                s += __shfl_xor_sync(0xffffffffu, s, 2);
                if ((lane & 3) == 0) {
                    const int r = wm * MF * 16 + i * 16 + h * 8 + (lane >> 2);
                    red_m[wn][r] = run_m[i][h];
                    red_s[wn][r] = s;
                }
            }
    }
    __syncthreads();
    for (int r = tid; r < BM; r += NT) {
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < WN; ++w) m = fmaxf(m, red_m[w][r]);
        float s = 0.f;
        if (m != -INFINITY) {
#pragma unroll
            for (int w = 0; w < WN; ++w)
                if (red_m[w][r] != -INFINITY) s += red_s[w][r] * exp2f(red_m[w][r] - m);
        }
        if (row0 + r < B) part[(size_t)split * B + row0 + r] = make_float2(m, s);
    }

    __threadfence();
    __syncthreads();
    if (tid == 0) is_last = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();

    constexpr double LN2 = 0.69314718055994530942;
    double loss = 0.0;
    for (int b = tid; b < B; b += NT) {
        float m = -INFINITY;
        double s = 0.0;
        for (int k0 = 0; k0 < S; k0 += 8) {
            float2 v[8];
#pragma unroll
            for (int u = 0; u < 8; ++u)
                v[u] = k0 + u < S ? __ldcg(part + (size_t)(k0 + u) * B + b) : make_float2(-INFINITY, 0.f);
            float mr = m;
#pragma unroll
            for (int u = 0; u < 8; ++u) mr = v[u].y > 0.f ? fmaxf(mr, v[u].x) : mr;
            if (mr != -INFINITY) {
                if (mr > m) s *= (double)exp2f(m - mr), m = mr;
#pragma unroll
                for (int u = 0; u < 8; ++u)
                    if (v[u].y > 0.f) s += (double)v[u].y * (double)exp2f(v[u].x - m);
            }
        }
        const double x = ((double)m + log2(s)) * LN2 - __ldcg(pos_buf + b);
        loss += x > 0.0 ? x + log1p(exp(-x)) : log1p(exp(x));
    }
    double* red = reinterpret_cast<double*>(smem);
    red[tid] = loss;
    __syncthreads();
    for (int w = NT / 2; w > 0; w >>= 1) {
        if (tid < w) red[tid] += red[tid + w];
        __syncthreads();
    }
    if (tid == 0) {
        out[0] = (float)(red[0] / (double)B);
        *counter = 0u;
    }
}

// fast.py's two tile shapes (WM, WN, MF, NF, KSPLIT, STAGES) and its cost weights.
#define INFONCE_V3_LEGACY_BIG 2, 4, 4, 4, 1, 4
#define INFONCE_V3_LEGACY_SMALL 1, 2, 4, 5, 4, 6

}  // namespace legacy

// ------------------------------------------------------------------------------------------------------------
// wgmma path.
//
// CTA = WGS warpgroups (128 threads each); warpgroup w owns query rows [64w, 64w+64) of the CTA's BM = 64*WGS
// rows and all BN columns of each n-tile.  The CTA walks its n-tiles (a contiguous split of the N axis) and,
// inside each, K in k-tiles of 32 floats (one iteration per k-tile, flat over (n-tile, k-tile)).
//
// Per iteration, every thread:
//   0. takes its raw pieces of the k-tile: TMA variants read them (16-byte shared loads) from the raw stage that
//      thread 0's tensor-map copies filled PD iterations earlier (after waiting on the stage's mbarrier); the
//      register variants have them in registers, loaded PD iterations earlier;
//   1. splits the query (A) fragment into hi/lo tf32 in registers (A is the register operand of wgmma: m64k8 per
//      warpgroup, each thread holds rows g and g+8 of its warp's 16 rows);
//   2. splits its share of the negatives (B) k-tile and stores hi and lo into hi/lo slot it % NSLOT, in the
//      128-byte swizzled K-major layout wgmma reads through a shared-memory descriptor;
//   3. fence.proxy.async (generic-proxy stores -> async-proxy wgmma reads), __syncthreads; TMA: thread 0 then
//      refills the raw stage every thread has just read, for iteration it+PD;
//   4. issues 4 k8-steps x 3 wgmma (a_lo.b_hi, a_hi.b_lo, a_hi.b_hi: fast.py's 3xTF32 order), commits, and
//      waits for the PREVIOUS iteration's group (wait_group 1), so one batch is always queued behind the running
//      one;
//   5. register variants: issue the global loads of iteration it+PD into the registers that batch it-1 has just
//      released, and an L2 prefetch of iteration it+6's lines.
// Slot it % NSLOT (NSLOT >= 3) was last read by the batch of iteration it-NSLOT; every thread waited for that batch
// (step 4 of it-NSLOT+1) before the __syncthreads of it-1, so the stores in step 2 never race a wgmma read.
//
// K permutation.  A dot product may visit k in any order as long as both operands agree.  Each thread loads
// 8 consecutive floats (two 16-byte loads) per row per k-tile: physical k = 8c + i, i = 0..7, c = lane & 3.
// wgmma's k8-step s, column j (0..7) is mapped to physical k = 8*(j & 3) + 2s + (j >> 2).  With that map:
//   A fragment (a0,a1,a2,a3) = (row g, col c), (row g+8, col c), (row g, col c+4), (row g+8, col c+4)
//       = physical k 8c+2s (rows g, g+8) and 8c+2s+1 (rows g, g+8): registers x[2s], y[2s], x[2s+1], y[2s+1];
//   B element (row n, physical 8c+i) belongs to step s = i>>1, column j = c + 4(i&1), i.e. 16-byte chunk
//       2s + (j>>2) = i, word j&3 = c, so it is stored at  n*128 + ((i ^ (n&7)) << 4) + (c << 2).
// The store pattern is conflict-free (a warp covers 8 consecutive rows x 4 values of c per store).
//
// Epilogue per n-tile (wait_group 0): the accumulator (wgmma m64nN f32 layout: thread holds rows g, g+8 of its
// warp's 16, columns 8j + 2c + {0,1}) is scaled by log2(e)/T, masked at N and folded into a running per-row
// (max, sum of exp2), exactly as fast.py.  The first wgmma of the next n-tile uses scale-d = 0.
//
// Merge (finish_cta): each CTA writes one (max, sum) per row to part[split][row]; the last CTA of the grid (one
// acq_rel ticket) merges every row over all splits in split order, forms softplus(lse - pos) and adds the rows in
// a fixed order.  Deterministic; the counter is reset by its last user.  The positive cosines are computed by the
// CTAs of the m-tile during the pipeline fill.  No spin waits anywhere (the ticket only decides who merges).
// ------------------------------------------------------------------------------------------------------------

struct WgParams {
    const float* q;
    const float* p;
    const float* n;
    int B, D, N, S, n_tiles;
    float scale2;
    double inv_t;
    double inv_b;       // 1 / B, for the mean
    float2* part;       // [S][B]
    double* pos;        // [B]
    unsigned* counters; // [1], zero between launches
    float* out;
    float* dbg_logits;  // optional [B][N]: raw dot products (debug)
    double* dbg_rowloss;  // optional [B]: per-row loss (debug)
    int cos_stage;        // K-split kernel: the launch has room for the staged positive rows (cosines_after_loop)
};

__device__ __forceinline__ uint64_t sw128_desc(uint32_t saddr) {
    // start address >> 4 (bits 0-13), leading byte offset 16 B (unused for swizzled K-major; bits 16-29),
    // stride byte offset 1024 B = 8 rows of 128 B (bits 32-45), base offset 0 (bits 49-51; tiles are
    // 1024-byte aligned), layout type 1 = 128-byte swizzle (bits 62-63).
    return (uint64_t)((saddr >> 4) & 0x3FFFu) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void st_smem_u32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
// Barrier `id` (1..15; 0 is __syncthreads's) for `count` threads of the CTA (the PROD kernel's consumers, each
// warpgroup of the BRES kernel).
__device__ __forceinline__ void bar_sync_named(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ unsigned atom_add_acq_rel_gpu(unsigned* p, unsigned v) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
// wgmma path's split: hi = tf32 round-to-nearest-even of x (cvt.rn.tf32.f32 is one F2FP instruction on sm_90;
// the mask makes hi's low 13 bits exactly zero, so x - hi below is the exact remainder of the value the tensor core
// uses), lo = the same rounding of x - hi (exact in fp32).  lo's low bits need no mask: whether the tensor core
// ignores them or not, lo is rn_tf32(x - hi) or closer to x - hi.  Error bound as fast.py's round-half-away split:
// |x - hi| <= 2^-11 |x|, |x - hi - lo| <= 2^-11 |x - hi| <= 2^-22 |x|.  (The ninth session tried fast.py's integer
// rounding here instead, IADD + LOP3 at the full integer rate, thinking the conversions' quarter rate bound the
// split: the seed shape got 6% slower and the big shape 10%.)
__device__ __forceinline__ void split_tf32_rn(uint32_t xbits, uint32_t& hi, uint32_t& lo) {
    uint32_t h, l;
    asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(h) : "f"(__uint_as_float(xbits)));
    h &= 0xffffe000u;
    const float r = __uint_as_float(xbits) - __uint_as_float(h);
    asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(l) : "f"(r));
    hi = h;
    lo = l;
}

// 3xFP16 split of two floats into f16x2 words (x0 in the low half, the lower wgmma column): hi = rn_f16(x),
// lo = rn_f16((x - hi) * 2^11).  fp16 keeps the 11 significant bits of tf32, so for 2^-14 <= |x| < 65504 the bounds
// are split_tf32_rn's: |x - hi| <= 2^-11 |x|, |x - hi - 2^-11 lo| <= 2^-22 |x| (x - hi is exact in fp32; scaling the
// remainder by 2^11 keeps lo out of fp16's subnormals, and the products hi.lo are summed in an accumulator of their
// own, scaled back by 2^-11 at the end).  |x| >= 65520 (or inf, NaN) makes hi infinite and the products non-finite:
// fix_nonfinite recomputes those dot products in fp32.
__device__ __forceinline__ void split_f16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
    uint32_t h, l;
    float h0, h1;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(x1), "f"(x0));
    asm("{\n.reg .b16 a, b;\nmov.b32 {a, b}, %2;\ncvt.f32.f16 %0, a;\ncvt.f32.f16 %1, b;\n}" : "=f"(h0), "=f"(h1) : "r"(h));
    const float r0 = __fmul_rn(__fsub_rn(x0, h0), 2048.f), r1 = __fmul_rn(__fsub_rn(x1, h1), 2048.f);
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(l) : "f"(r1), "f"(r0));
    hi = h;
    lo = l;
}

__device__ __forceinline__ float4 ldg4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }

// Predicated forms (no branch around them; see the load lambda of the kernel for why).
__device__ __forceinline__ void st_smem_u32_if(uint32_t addr, uint32_t v, bool on) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p st.shared.u32 [%0], %1;\n}\n"
                 ::"r"(addr), "r"(v), "r"((int)on) : "memory");
}
__device__ __forceinline__ void prefetch_l2_if(const void* p, bool on) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %1, 0;\n @p prefetch.global.L2 [%0];\n}\n" ::"l"(p), "r"((int)on));
}

// mbarrier and TMA (tensor) copies, for the TMA variants.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ bool mbar_try(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return done != 0;
}
// The same wait with acquire at cluster scope: for an mbarrier that a peer CTA of the cluster arrives on remotely.
__device__ __forceinline__ bool mbar_try_cluster(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return done != 0;
}
// 2-D tile copy (box of the tensor map) global -> this CTA's smem at dst, completion in bytes on bar.  Elements
// outside the tensor are written as zeros (and counted): ragged rows and the K tail need no code.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(dst), "l"(map), "r"(x), "r"(y), "r"(bar) : "memory");
}
// 3-D tile copy: the BRES kernel's A stage of KPI k-tiles in one copy (the query matrix seen as [k-tile][row][32]).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int x, int y, int z, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
        ::"r"(dst), "l"(map), "r"(x), "r"(y), "r"(z), "r"(bar) : "memory");
}
__device__ __forceinline__ void sts4(uint32_t addr, const uint32_t (&v)[4]) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
                 : "memory");
}
__device__ __forceinline__ float4 lds4(uint32_t addr) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
    return v;
}
// Thread-block clusters (the K-split BRES kernel): a peer CTA's address of a shared-memory location, and a 16-byte
// store there.
__device__ __forceinline__ uint32_t cluster_peer_addr(uint32_t addr, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
// Arrive (release at cluster scope) on an mbarrier of a peer CTA (its address from cluster_peer_addr).
__device__ __forceinline__ void mbar_arrive_remote(uint32_t bar) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(bar) : "memory");
}
// A 16-byte store into a peer CTA's shared memory that counts its bytes on the peer's mbarrier `bar` (complete_tx):
// the peer's wait on that barrier sees the data, and the sender waits for nothing.
__device__ __forceinline__ void st_async_f4(uint32_t addr, float a, float b, float c, float d, uint32_t bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                 ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d), "r"(bar) : "memory");
}

// A 1-D bulk copy (TMA engine) of `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory into
// this CTA's shared memory, counted on mbarrier `bar`.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// Diagnostics, compiled only into the standalone bench's probe builds (build.sh): INFONCE_V3_STAMPS records
// %globaltimer per CTA at the phase boundaries below (thread 0, or the thread V3_STAMP_T names; predicated stores, no
// branch near wgmma), at the end of each K-loop iteration (V3_ITER) and thread 0's SM clocks per K-loop phase
// (V3_PHASE); INFONCE_V3_NO_PROXY_FENCE drops the proxy fence of the K loop
// (timing only: the results may then be wrong); INFONCE_V3_TMA_TID moves the TMA issue to another thread.
#ifndef INFONCE_V3_TMA_TID
#define INFONCE_V3_TMA_TID 0  // the thread that issues the TMA copies (a probe build moves it)
#endif
#ifdef INFONCE_V3_STAMPS
constexpr int kStampSlots = 12, kStampCtas = 4096;
__device__ unsigned long long g_v3_stamps[kStampCtas][kStampSlots];
// %globaltimer into *a when `on` (a predicated store: no branch near the wgmma).
__device__ __forceinline__ void v3_time_if(unsigned long long* a, bool on) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p st.u64 [%0], %1;\n}\n"
                 ::"l"(a), "l"(t), "r"((int)on) : "memory");
}
__device__ __forceinline__ void v3_stamp(int slot, bool on, int thread = 0) {
    v3_time_if(&g_v3_stamps[blockIdx.x % kStampCtas][slot], on && threadIdx.x == thread);
}
#define V3_STAMP(slot, on) v3_stamp(slot, on)
#define V3_STAMP_T(slot, on, thread) v3_stamp(slot, on, thread)
// %globaltimer at the end of each of the first kStampIters K-loop iterations (thread 0; the B-resident kernel).
constexpr int kStampIters = 16;
__device__ unsigned long long g_v3_iter[kStampCtas][kStampIters];
#define V3_ITER(it) v3_time_if(&g_v3_iter[blockIdx.x % kStampCtas][min((it), kStampIters - 1)], \
                               threadIdx.x == 0 && (it) < kStampIters)
// Per-phase SM clocks of the K loop, summed over iterations, thread 0 of each CTA (g_v3_phase[cta][phase]).
__device__ unsigned long long g_v3_phase[kStampCtas][kStampSlots];
#define V3_PHASE_DECL unsigned v3_ph[kStampSlots] = {}; unsigned v3_t = (unsigned)clock();
#define V3_PHASE(i) do { const unsigned t_ = (unsigned)clock(); v3_ph[i] += t_ - v3_t; v3_t = t_; } while (0)
#define V3_PHASE_STORE() do { if (threadIdx.x == 0) for (int i_ = 0; i_ < kStampSlots; ++i_) \
    g_v3_phase[blockIdx.x % kStampCtas][i_] = v3_ph[i_]; } while (0)
#else
#define V3_STAMP(slot, on) ((void)0)
#define V3_STAMP_T(slot, on, thread) ((void)0)
#define V3_ITER(it) ((void)0)
#define V3_PHASE_DECL
#define V3_PHASE(i) ((void)0)
#define V3_PHASE_STORE() ((void)0)
#endif

// wgmma.mma_async m64nNk8 f32 += tf32 * tf32 (WgmmaF16: m64nNk16 f32 += f16 * f16, B K-major), A from registers
// (4 per thread), B from a smem descriptor.  V3_ACC20 / V3_ACC40: the accumulator operands of N = 40 / 80.
#define V3_ACC20 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
#define V3_ACC40 V3_ACC20, "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), \
    "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), \
    "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
#define V3_WG_REGS20 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19}"
#define V3_WG_REGS40 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}"
template <int N>
struct Wgmma;
template <> struct Wgmma<40> {
    static __device__ __forceinline__ void mma(float (&d)[20], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t desc_b, int scale_d) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %25, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n40k8.f32.tf32.tf32 " V3_WG_REGS20
                     ", {%20, %21, %22, %23}, %24, p, 1, 1;\n}\n"
                     : V3_ACC20
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(scale_d)
                     : "memory");
    }
};
template <> struct Wgmma<80> {
    static __device__ __forceinline__ void mma(float (&d)[40], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t desc_b, int scale_d) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %45, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n80k8.f32.tf32.tf32 " V3_WG_REGS40
                     ", {%40, %41, %42, %43}, %44, p, 1, 1;\n}\n"
                     : V3_ACC40
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(scale_d)
                     : "memory");
    }
};
template <int N>
struct WgmmaF16;
template <> struct WgmmaF16<40> {
    static __device__ __forceinline__ void mma(float (&d)[20], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t desc_b, int scale_d) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %25, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n40k16.f32.f16.f16 " V3_WG_REGS20
                     ", {%20, %21, %22, %23}, %24, p, 1, 1, 0;\n}\n"
                     : V3_ACC20
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(scale_d)
                     : "memory");
    }
};
template <> struct WgmmaF16<80> {
    static __device__ __forceinline__ void mma(float (&d)[40], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t desc_b, int scale_d) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %45, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 " V3_WG_REGS40
                     ", {%40, %41, %42, %43}, %44, p, 1, 1, 0;\n}\n"
                     : V3_ACC40
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(scale_d)
                     : "memory");
    }
};
template <> struct Wgmma<96> {
    static __device__ __forceinline__ void mma(float (&d)[48], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t desc_b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n96k8.f32.tf32.tf32 "
            "{"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
            "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
            "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
            "%30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
            "%40, %41, %42, %43, %44, %45, %46, %47"
            "}, {%48, %49, %50, %51}, %52, p, 1, 1;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(scale_d)
            : "memory");
    }
};
template <> struct Wgmma<128> {
    static __device__ __forceinline__ void mma(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint64_t desc_b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
            "{"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
            "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
            "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
            "%30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
            "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
            "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
            "%60, %61, %62, %63"
            "}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(scale_d)
            : "memory");
    }
};

// The query (A) hi/lo fragments of KH k8-steps, in wgmma order per k8-step l: [4l + 0..3] = (row g, col c),
// (row g+8, col c), (row g, col c+4), (row g+8, col c+4) = floats 2l, 2l (row g+8), 2l+1, 2l+1 of the thread's two
// rows' pieces x (row g) and y (row g+8) (the K permutation: physical floats 8c + 0..7 of each k-tile).
template <int KH>
__device__ __forceinline__ void split_a_fragments(const float4 (&x)[KH / 2], const float4 (&y)[KH / 2],
                                                  uint32_t (&ahi)[4 * KH], uint32_t (&alo)[4 * KH]) {
#pragma unroll
    for (int l = 0; l < KH; ++l) {
        const float4& xv = x[l >> 1];
        const float4& yv = y[l >> 1];
        split_tf32_rn(__float_as_uint((l & 1) ? xv.z : xv.x), ahi[4 * l + 0], alo[4 * l + 0]);
        split_tf32_rn(__float_as_uint((l & 1) ? yv.z : yv.x), ahi[4 * l + 1], alo[4 * l + 1]);
        split_tf32_rn(__float_as_uint((l & 1) ? xv.w : xv.y), ahi[4 * l + 2], alo[4 * l + 2]);
        split_tf32_rn(__float_as_uint((l & 1) ? yv.w : yv.y), ahi[4 * l + 3], alo[4 * l + 3]);
    }
}

// One committed batch: KH k8-steps x the three products a_lo.b_hi, a_hi.b_lo, a_hi.b_hi (fast.py's order) into acc.
// k8-step l reads the B hi copy at descriptor dh0 + (l / 4) * ktile_step + 2 (l % 4) (k-tile l / 4 of the batch, 32
// bytes per k8-step, in 16-byte units) and the lo copy lo_step further; `first` starts the accumulator (scale-d 0).
template <int BN, int KH>
__device__ __forceinline__ void issue_3xtf32_batch(float (&acc)[BN / 2], const uint32_t (&ahi)[4 * KH],
                                                   const uint32_t (&alo)[4 * KH], uint64_t dh0, uint64_t ktile_step,
                                                   uint64_t lo_step, bool first) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) reg_fence(acc[i]);
    wg_fence();
#pragma unroll
    for (int l = 0; l < KH; ++l) {
        const uint64_t dh = dh0 + (uint64_t)(l >> 2) * ktile_step + (uint64_t)(2 * (l & 3));
        const uint64_t dl = dh + lo_step;
        Wgmma<BN>::mma(acc, alo[4 * l], alo[4 * l + 1], alo[4 * l + 2], alo[4 * l + 3], dh, (first && l == 0) ? 0 : 1);
        Wgmma<BN>::mma(acc, ahi[4 * l], ahi[4 * l + 1], ahi[4 * l + 2], ahi[4 * l + 3], dl, 1);
        Wgmma<BN>::mma(acc, ahi[4 * l], ahi[4 * l + 1], ahi[4 * l + 2], ahi[4 * l + 3], dh, 1);
    }
    wg_commit();
}

// 3xFP16 (the B-resident kernel's F16 form).  The K permutation for k16-steps: wgmma column j (0..15) of step s of a
// k-tile is physical float 8 ((j & 7) >> 1) + 4 s + 2 (j >> 3) + (j & 1), so the thread of c = lane & 3 finds its A
// registers of step s in its raw pieces x[s] = floats 8c + 4s .. 8c + 4s + 3 of row g (y[s]: row g + 8): (row g, cols
// 2c, 2c+1) = x[s].xy, (row g+8, same) = y[s].xy, (row g, cols 2c+8, 2c+9) = x[s].zw, (row g+8, same) = y[s].zw.
// KS16 k16-steps: step l reads pieces x[l] (two per k-tile).
template <int KS16>
__device__ __forceinline__ void split_a_fragments_f16(const float4 (&x)[KS16], const float4 (&y)[KS16],
                                                      uint32_t (&ahi)[4 * KS16], uint32_t (&alo)[4 * KS16]) {
#pragma unroll
    for (int l = 0; l < KS16; ++l) {
        split_f16x2(x[l].x, x[l].y, ahi[4 * l + 0], alo[4 * l + 0]);
        split_f16x2(y[l].x, y[l].y, ahi[4 * l + 1], alo[4 * l + 1]);
        split_f16x2(x[l].z, x[l].w, ahi[4 * l + 2], alo[4 * l + 2]);
        split_f16x2(y[l].z, y[l].w, ahi[4 * l + 3], alo[4 * l + 3]);
    }
}

// One committed batch of KS16 k16-steps: a_lo.b_hi and a_hi.b_lo into acc_x (the products scaled by 2^11), a_hi.b_hi
// into acc.  A resident k-tile of B is one 128-byte row per negative: the hi halves of its two k16-steps in 16-byte
// chunks 0-3 (32 bytes per step), the lo halves in chunks 4-7; step l reads k-tile l / 2 (ktile_step apart, in 16-byte
// units), step l % 2 of it.
template <int BN, int KS16>
__device__ __forceinline__ void issue_3xf16_batch(float (&acc)[BN / 2], float (&acc_x)[BN / 2],
                                                  const uint32_t (&ahi)[4 * KS16], const uint32_t (&alo)[4 * KS16],
                                                  uint64_t dh0, uint64_t ktile_step, bool first) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) reg_fence(acc[i]), reg_fence(acc_x[i]);
    wg_fence();
#pragma unroll
    for (int l = 0; l < KS16; ++l) {
        const uint64_t dh = dh0 + (uint64_t)(l >> 1) * ktile_step + (uint64_t)(2 * (l & 1));
        const int sd = (first && l == 0) ? 0 : 1;
        WgmmaF16<BN>::mma(acc_x, alo[4 * l], alo[4 * l + 1], alo[4 * l + 2], alo[4 * l + 3], dh, sd);
        WgmmaF16<BN>::mma(acc_x, ahi[4 * l], ahi[4 * l + 1], ahi[4 * l + 2], ahi[4 * l + 3], dh + 4, 1);
        WgmmaF16<BN>::mma(acc, ahi[4 * l], ahi[4 * l + 1], ahi[4 * l + 2], ahi[4 * l + 3], dh, sd);
    }
    wg_commit();
}

// The 3xFP16 path's guard.  A dot product of the path is finite unless an input of its row of A or B is outside
// fp16's range (|x| >= 65520, inf, NaN: split_f16x2 makes hi infinite); such a product is recomputed here in fp32
// FFMA from global memory (the whole of K, once the K split's halves are added), so that no input gives a wrong loss,
// only a slow one.  tot: the thread's n-tile dot products in the accumulator layout (row rA + 8h, column colb + 8j + e
// at 4j + 2h + e).
// Row and column of element i of a thread's n-tile accumulator (the wgmma m64nN f32 layout: element 4j + 2h + e is row
// rA + 8h, column colb + 8j + e).
__device__ __forceinline__ int acc_row(int i, int rA) { return rA + 8 * ((i >> 1) & 1); }
__device__ __forceinline__ int acc_col(int i, int colb) { return colb + 8 * (i >> 2) + (i & 1); }
__device__ __forceinline__ float fp32_dot(const float* a, const float* b, int D) {
    float s = 0.f;
    for (int k = 0; k < D; ++k) s = fmaf(a[k], b[k], s);
    return s;
}
// The slow path out of line, on a copy of tot in local memory: inlined, its 40 dot-product loops put about 140 KB of
// code between the check and the fold, and the hot path's jump over them lands on code no SM has fetched yet.
__device__ __noinline__ void recompute_nonfinite(const float* q, const float* n, float* tot, int n_acc, int rA, int colb,
                                                 int B, int N, int D) {
    for (int i = 0; i < n_acc; ++i) {
        const int row = acc_row(i, rA), col = acc_col(i, colb);
        if (!isfinite(tot[i]) && row < B && col < N) tot[i] = fp32_dot(q + (size_t)row * D, n + (size_t)col * D, D);
    }
}
template <int BN>
__device__ __forceinline__ void fix_nonfinite(const WgParams& P, float (&tot)[BN / 2], int rA, int colb, int D) {
    bool bad[4] = {false, false, false, false};  // (four chains of predicate ops instead of one)
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) bad[i & 3] |= !isfinite(tot[i]);
    if (!((bad[0] || bad[1]) || (bad[2] || bad[3]))) return;
    float t[BN / 2];  // (tot itself stays in registers: only this copy's address is taken)
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) t[i] = tot[i];
    recompute_nonfinite(P.q, P.n, t, BN / 2, rA, colb, P.B, P.N, D);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) tot[i] = t[i];
}
// The same for one row's BN / 4 dot products (x[2j + e]: row rA + 8h, column colb + 8j + e).
template <int BN>
__device__ __forceinline__ void fix_nonfinite_row(const WgParams& P, float (&x)[BN / 4], int h, int rA, int colb, int D) {
    bool bad[4] = {false, false, false, false};  // (four chains of predicate ops instead of one)
#pragma unroll
    for (int i = 0; i < BN / 4; ++i) bad[i & 3] |= !isfinite(x[i]);
    if (!((bad[0] || bad[1]) || (bad[2] || bad[3]))) return;
    float t[BN / 2];  // the row in the places of row rA + 8h's h = 0 elements; zeros (finite: kept) in the others
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) t[i] = (i & 2) ? 0.f : x[2 * (i >> 2) + (i & 1)];
    recompute_nonfinite(P.q, P.n, t, BN / 2, rA + 8 * h, colb, P.B, P.N, D);
#pragma unroll
    for (int i = 0; i < BN / 4; ++i) x[i] = t[4 * (i >> 1) + (i & 1)];
}

// The negatives (B) items of a thread of NT (tile rows (tid >> 2) + (NT / 4) u, physical floats 8c + 4v + 0..3 in b[u][v])
// as tf32 hi and lo into a B slot: float 8c + i of a row goes to chunk i, word c (the K permutation); bst is the
// thread's row-0 address with its word and swizzle folded in, the lo copy BUF bytes after the hi copy, cbase the first
// chunk of this part.  Items past the tile's BITEMS (only when BITEMS is not a multiple of NT) store nothing.
template <int NT, int BITEMS, int BUF, int BPER, int NV>
__device__ __forceinline__ void store_b_hilo(const float4 (&b)[BPER][NV], uint32_t bst, uint32_t cbase, int tid) {
#pragma unroll
    for (int u = 0; u < BPER; ++u) {
        const bool on = BITEMS % NT == 0 || u + 1 < BPER || tid + NT * u < BITEMS;
        const uint32_t rowaddr = bst + (uint32_t)(u * (NT / 4) * 128);
#pragma unroll
        for (int e = 0; e < 4 * NV; ++e) {
            const float4& bv = b[u][e >> 2];
            const float xe = (e & 3) == 0 ? bv.x : (e & 3) == 1 ? bv.y : (e & 3) == 2 ? bv.z : bv.w;
            uint32_t hi, lo;
            split_tf32_rn(__float_as_uint(xe), hi, lo);
            const uint32_t a = rowaddr ^ ((cbase + (uint32_t)e) << 4);
            st_smem_u32_if(a, hi, on);
            st_smem_u32_if(a + BUF, lo, on);
        }
    }
}

// Registers of one pipeline stage (one iteration = KH k8-steps of one k-tile): the raw fp32 loads.
//   x, y: this thread's query rows rA and rA + 8, floats 8c + 4*part*NV + 0 .. 4*NV-1 of the k-tile;
//   b:    its negatives items, the same floats.
// The tf32 hi/lo fragments are built from them inside the iteration (not loop-carried).
template <int KH, int BPER>
struct Stage {
    float4 x[KH / 2], y[KH / 2];
    float4 b[BPER][KH / 2];
};


// ---- the wgmma kernel's prologue and epilogue pieces ----------------------------------------------------------
// Positive term pos_b = cos(q_b, p_b) / T for the rows of the m-tile [row0, row0 + BM) with row % S == split (the
// m-tile's S CTAs share them out), one warp per row; written to P.pos in double.  kPrefetchOnly: only bring those
// rows of q and p into L2 (one prefetch per 128 bytes), for a later call.
template <bool kPrefetchOnly = false>
__device__ __forceinline__ void positive_cosines(const WgParams& P, int row0, int BM, int split, int warp, int nwarps,
                                                 int lane) {
    const int B = P.B, D = P.D, S = P.S;
    for (int r = split + S * warp; r < BM; r += S * nwarps) {
        const int row = row0 + r;
        if (row >= B) break;
        if (kPrefetchOnly) {
            for (int k = 32 * lane; k < D; k += 32 * 32) {
                prefetch_l2_if(P.q + (size_t)row * D + k, true);
                prefetch_l2_if(P.p + (size_t)row * D + k, true);
            }
            continue;
        }
        const float4* q4 = reinterpret_cast<const float4*>(P.q + (size_t)row * D);
        const float4* p4 = reinterpret_cast<const float4*>(P.p + (size_t)row * D);
        float dot = 0.f, qq = 0.f, pp = 0.f;
#pragma unroll 4
        for (int k = lane; k < D / 4; k += 32) {
            const float4 a = __ldg(q4 + k), b = __ldg(p4 + k);
            dot = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, dot))));
            qq = fmaf(a.x, a.x, fmaf(a.y, a.y, fmaf(a.z, a.z, fmaf(a.w, a.w, qq))));
            pp = fmaf(b.x, b.x, fmaf(b.y, b.y, fmaf(b.z, b.z, fmaf(b.w, b.w, pp))));
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            dot += __shfl_xor_sync(0xffffffffu, dot, off);
            qq += __shfl_xor_sync(0xffffffffu, qq, off);
            pp += __shfl_xor_sync(0xffffffffu, pp, off);
        }
        if (lane == 0) {
            // torch divides each vector by max(||v||, 1e-8) before the dot product
            const double nq = fmax(sqrt((double)qq), 1e-8), np = fmax(sqrt((double)pp), 1e-8);
            P.pos[row] = (double)dot / (nq * np) * P.inv_t;
        }
    }
}

// K split: the positive cosines of this CTA's rows (those of positive_cosines: rows split + S j of [row0, row0 + BM))
// computed by the warpgroup that sends its sums to the peer, after its loop: warp w takes j = w, w + 4, ...  Rows j <
// kCosStaged come from shared memory (q then p, D floats each, per row at `stage`), copied there in the prologue
// behind the loop's copies and counted on mbarrier `bar`, when the launch had room for them (P.cos_stage); others
// from global memory.  After the loop the warpgroup would otherwise wait on L2 for them (the cluster barrier's acquire
// also empties L1), and it is on the path of the row's fold only as long as it outlasts the keeper's wait.  The norms
// without a division or a square root in double: rsqrtf refined by one Newton step in double (relative error ~1e-13).
constexpr int kCosStaged = 2;
__device__ __forceinline__ double inv_norm(float ss) {  // 1 / max(sqrt(ss), 1e-8), as torch clamps each norm
    if (!(ss > 1e-16f)) return ss == ss ? 1e8 : (double)ss;  // (NaN stays NaN)
    if (ss == INFINITY) return 0.0;
    const double y = (double)rsqrtf(ss), d = (double)ss;
    return y * fma(-0.5 * d * y, y, 1.5);
}
__device__ __forceinline__ void cosines_after_loop(const WgParams& P, int row0, int BM, int split, int warp, int lane,
                                                   uint32_t stage, uint32_t bar) {
    const int B = P.B, D = P.D, S = P.S;
    for (int j = warp, r = split + S * warp; r < BM; j += 4, r += 4 * S) {
        const int row = row0 + r;
        if (row >= B) break;
        float dot = 0.f, qq = 0.f, pp = 0.f;
        auto add = [&](const float4& a, const float4& b) {
            dot = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, dot))));
            qq = fmaf(a.x, a.x, fmaf(a.y, a.y, fmaf(a.z, a.z, fmaf(a.w, a.w, qq))));
            pp = fmaf(b.x, b.x, fmaf(b.y, b.y, fmaf(b.z, b.z, fmaf(b.w, b.w, pp))));
        };
        if (P.cos_stage && j < kCosStaged) {
            while (!mbar_try(bar, 0u)) {
            }
            const uint32_t qa = stage + (uint32_t)(2 * j * D * 4), pa = qa + (uint32_t)(D * 4);
#pragma unroll 4
            for (int k = lane; k < D / 4; k += 32) add(lds4(qa + 16u * k), lds4(pa + 16u * k));
        } else {
            const float4* q4 = reinterpret_cast<const float4*>(P.q + (size_t)row * D);
            const float4* p4 = reinterpret_cast<const float4*>(P.p + (size_t)row * D);
#pragma unroll 4
            for (int k = lane; k < D / 4; k += 32) add(__ldg(q4 + k), __ldg(p4 + k));
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            dot += __shfl_xor_sync(0xffffffffu, dot, off);
            qq += __shfl_xor_sync(0xffffffffu, qq, off);
            pp += __shfl_xor_sync(0xffffffffu, pp, off);
        }
        if (lane == 0) P.pos[row] = (double)dot * inv_norm(qq) * inv_norm(pp) * P.inv_t;
    }
}

// Debug only (WgParams::dbg_logits): a tile's raw dot products in the accumulator layout (see fix_nonfinite), out of
// line for the reason given at recompute_nonfinite.
// `rows`: bit h stores row rA + 8h.
__device__ __noinline__ void store_tile_logits(float* dbg, const float* acc, int n_acc, int rA, int colb, int B, int N,
                                               int rows) {
    for (int i = 0; i < n_acc; ++i) {
        const int row = acc_row(i, rA), col = acc_col(i, colb);
        if (((rows >> ((i >> 1) & 1)) & 1) && row < B && col < N) dbg[(size_t)row * N + col] = acc[i];
    }
}

// 2^x by the MUFU alone (exp2f adds a rescale for results below 2^-126): the same 2-ulp approximation, subnormal
// results flushed to zero, which in a sum of terms 2^(v - max) with one term equal to 1 changes nothing; 2^-inf = 0.
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// fold_row's slow case: x[i] (column colb + 8 (i >> 1) + (i & 1)) times f, or -inf past column N.
__device__ __noinline__ void mask_row(float* x, int nv, int colb, int N, float f) {
    for (int i = 0; i < nv; ++i) x[i] = colb + 8 * (i >> 1) + (i & 1) < N ? f * x[i] : -INFINITY;
}
// Fold one row of a finished n-tile (x[2j + e]: column colb + 8j + e, colb = tile * BN + 2c) into the row's running
// (max, sum of exp2) of the logits x * scale2 (scale2 = log2(e)/T), masked at N (fast.py's epilogue).  The quad (4
// lanes of a row) shares the max.  Since the scale is positive and rounding is monotone, the max of the scaled logits
// is the scaled max of the raw dot products, and each term is one FFMA and one ex2: 4 instructions per element
// instead of 7.  Only a ragged tile (columns past N) or a scale that is not positive (T <= 0, T = inf, NaN) takes the
// masking block first (negative: the signs of x and of the scale flipped, which is exact; zero: every logit 0).
// Partial maxima and sums in 4 independent chains: this runs once per tile on one warp per SM sub-partition, so its
// time is its dependency chain (twenty-fifth session).
template <int BN>
__device__ __forceinline__ void fold_row(const WgParams& P, const float (&xin)[BN / 4], float& run_m, float& run_s,
                                         int colb) {
    constexpr int NV = BN / 4;
    const int N = P.N;
    const float scale = P.scale2, s2 = scale > 0.f ? scale : scale == 0.f ? 1.f : fabsf(scale);
    float x[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) x[i] = xin[i];
    // (warp-uniform: the tile's last column, the scale)
    if (colb - 2 * (int)(threadIdx.x & 3) + BN > N || !(scale > 0.f)) {
        float t[NV];  // (out of line on a copy, as fix_nonfinite: one copy of the fold's code)
#pragma unroll
        for (int i = 0; i < NV; ++i) t[i] = x[i];
        mask_row(t, NV, colb, N, scale > 0.f ? 1.f : scale == 0.f ? 0.f : -1.f);
#pragma unroll
        for (int i = 0; i < NV; ++i) x[i] = t[i];
    }
    float mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < NV; ++i) mx[i & 3] = fmaxf(mx[i & 3], x[i]);
    float tmax = fmaxf(fmaxf(mx[0], mx[1]), fmaxf(mx[2], mx[3]));
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
    const float m_new = fmaxf(run_m, tmax * s2);
    // Branch-free: with no valid column yet, m_new = -inf, every term is ex2_ftz(-inf) = 0 and the state stays
    // (-inf, 0).
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    float sa[4] = {run_s * ex2_ftz(run_m - m_use), 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < NV; ++i) sa[i & 3] += ex2_ftz(fmaf(x[i], s2, -m_use));
    run_s = (sa[0] + sa[1]) + (sa[2] + sa[3]);
    run_m = m_new;
}

// Fold a finished n-tile's accumulator (wgmma m64nBN f32 layout: this thread holds rows rA, rA + 8 of its warp's 16,
// columns colb + 8j + {0,1}: element 4j + 2h + e) into the running (max, sum of exp2) of its two rows.
template <int BN>
__device__ __forceinline__ void fold_tile(const WgParams& P, const float (&acc)[BN / 2], float (&run_m)[2],
                                          float (&run_s)[2], int rA, int colb) {
    if (P.dbg_logits != nullptr) {
        float t[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) t[i] = acc[i];
        store_tile_logits(P.dbg_logits, t, BN / 2, rA, colb, P.B, P.N, 3);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float x[BN / 4];
#pragma unroll
        for (int i = 0; i < BN / 4; ++i) x[i] = acc[4 * (i >> 1) + 2 * h + (i & 1)];
        fold_row<BN>(P, x, run_m[h], run_s[h], colb);
    }
}

// The end of the wgmma kernel: write this CTA's per-row (max, sum) partials; the last CTA of the grid (one
// acq_rel ticket) merges every row and writes the mean loss.  NT = threads per CTA (all of them take part in the
// barriers).  Threads tid < NM merge the rows; MERGES = false compiles a copy without the merge loop (for the
// producer warpgroup of the PROD kernel, whose copy runs under its own small register budget).
template <int NT, int NM = NT, bool MERGES = true>
__device__ __forceinline__ void finish_cta(const WgParams& P, const float (&run_m)[2], const float (&run_s)[2], int rA,
                                           int writes, int split, double* s_wsum, int* s_flag) {
    // This CTA's (max, sum) per row: the quad shares the max; add the quad's sums (lane c == 0 of the quad writes
    // row rA + 8h where bit h of `writes` is set).
    const int B = P.B, S = P.S;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float sum = run_s[h];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int row = rA + 8 * h;
        if (((writes >> h) & 1) && row < B) P.part[(size_t)split * B + row] = make_float2(run_m[h], sum);
    }

    // One ticket: the last CTA to finish merges every row.  The barrier orders every thread's writes (partials,
    // positive cosines) before thread 0's acq_rel atomic, whose release at gpu scope carries them (the pattern of
    // CUTLASS's generic barrier); in the merging CTA the atomic's acquire and the barrier after it order every thread's
    // reads (through L2, ld.cg) after the other CTAs' tickets.  (Until the sixteenth session a gpu-scope fence stood
    // before the atomic and another after the barrier, MEMBAR.SC.GPU in the SASS: without them the seed shape took
    // 18.6-18.9 us against 19.0-19.3 in the same bench calls.  Until the ninth session the last CTA of each m-tile
    // merged its rows and a second ticket summed the m-tiles: 8.2 us of serial tail at the seed shape, by
    // %globaltimer stamps; this is one ticket and one merge.)
    __syncthreads();
    if (tid == 0) *s_flag = atom_add_acq_rel_gpu(P.counters, 1u) == gridDim.x - 1;
    __syncthreads();
    V3_STAMP(4, true);  // ticket taken
    if (!*s_flag) return;

    // Thread t owns rows t, t + NT, ...: it merges a row's S partials in split order, kMergeChunk loads in flight
    // (two rounds at the seed shape), into a (max, sum) with the sum in float.  This code runs once per launch on
    // one SM, so it starts with a cold instruction cache: it is kept short (rolled loops, no double-precision
    // library calls), which the ninth session's stamps showed to matter more than its arithmetic.
    // Numerics: the sum is of S positive terms, so in float it is within about S x 2^-24 relative of the exact sum
    // (8e-6 at S = 132; the plan's S stays near the SM count), and the loss's relative error from a relative error e
    // of the sum is at most e (a log, then softplus, whose slope is below 1): far inside the 1e-4 tolerance.  (It
    // was a double sum until the eleventh session: 16,384 float-to-double conversions and double FMAs on the one
    // merging SM, about 1 us of the seed shape's tail.)  The merged sum is >= 1 (the partial holding the row's max
    // contributes exp2(0) * its own sum >= 1), so log2f of it is well conditioned (absolute error ~1e-6 at most);
    // x = lse - pos is formed in double from the exact float max and the double positive logit, and softplus(x) =
    // max(x, 0) + log1p(e^-|x|) keeps full relative accuracy when the loss is tiny (log1pf and expf: ~1e-7).
    constexpr double LN2 = 0.69314718055994530942;
    constexpr int kMergeChunk = 32;  // 64 was slower (twelfth session, BRES kernel: 4.4 us of merge against 2.8)
    // The merge's pointers and sizes in registers: left to itself ptxas may reload them from the kernel parameters
    // (constant bank, cold on this SM) for every load (the PROD kernel's SASS: 64 LDC before the 32 loads).
    const float2* part = P.part;
    const double* pos = P.pos;
    int nB = B, nS = S;
    asm volatile("" : "+l"(part), "+l"(pos), "+r"(nB), "+r"(nS));
    double tloss = 0.0;
#pragma unroll 1
    for (int row = tid; MERGES && row < nB; row += NM) {
        const double pv = __ldcg(pos + row);
        float m = -INFINITY, sum = 0.f;
#pragma unroll 1
        for (int k0 = 0; k0 < nS; k0 += kMergeChunk) {
            float2 v[kMergeChunk];
#pragma unroll
            for (int u = 0; u < kMergeChunk; ++u)
                v[u] = k0 + u < nS ? __ldcg(part + (size_t)(k0 + u) * nB + row) : make_float2(-INFINITY, 0.f);
            // (four independent chains: the merge is one SM's dependency chain)
            float mq[4] = {m, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
            for (int u = 0; u < kMergeChunk; ++u) mq[u & 3] = fmaxf(mq[u & 3], v[u].x);  // an empty partial: (-inf, 0)
            const float mr = fmaxf(fmaxf(mq[0], mq[1]), fmaxf(mq[2], mq[3]));
            const float mu = mr == -INFINITY ? 0.f : mr;
            float sq[4] = {sum * ex2_ftz(m - mu), 0.f, 0.f, 0.f};
#pragma unroll
            for (int u = 0; u < kMergeChunk; ++u) sq[u & 3] = fmaf(v[u].y, ex2_ftz(v[u].x - mu), sq[u & 3]);
            sum = (sq[0] + sq[1]) + (sq[2] + sq[3]);
            m = mr;
        }
        const double x = ((double)m + (double)log2f(sum)) * LN2 - pv;
        const double loss = (x > 0.0 ? x : 0.0) + (double)log1pf(expf(-fabsf((float)x)));
        if (P.dbg_rowloss != nullptr) P.dbg_rowloss[row] = loss;
        tloss += loss;
    }
    V3_STAMP(5, true);  // merger: row losses formed
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) tloss += __shfl_xor_sync(0xffffffffu, tloss, off);
    if (lane == 0) s_wsum[warp] = tloss;
    __syncthreads();
    if (tid == 0) {
        double t = 0.0;
#pragma unroll
        for (int w = 0; w < NT / 32; ++w) t += s_wsum[w];
        P.out[0] = (float)(t * P.inv_b);  // (no double division on the merger's path)
        P.counters[0] = 0u;
    }
    V3_STAMP(6, true);  // merger: output written
}

// TMA = false: each thread loads its pieces straight to registers, PD iterations ahead (the eighth session's path).
// TMA = true: thread 0 copies each k-tile's raw A (BM x 32) and B (BN x 32) tiles into a ring of PD stages with two
// tensor-map copies (128-byte swizzle, zeros outside the tensors); every thread reads its pieces back with 16-byte
// shared loads.  No per-thread global loads, no loop-carried load registers (ninth session: the register path's
// loads were consumed right after issue, by ptxas's moves, so each iteration waited for them).
template <int WGS, int BN, int PD, int KH, bool TMA>
__global__ void __launch_bounds__(WGS * 128, WGS == 1 ? 2 : 1)
    infonce_wgmma_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                         const WgParams P) {
    constexpr int NT = WGS * 128, BM = WGS * 64;
    constexpr int NACC = BN / 2;
    constexpr int BUF = BN * 128;   // bytes of one tf32 copy (hi or lo) of a BN x 32 k-tile
    constexpr int SLOT = 2 * BUF;  // hi then lo; BUF is a multiple of 1024, so every copy is 1024-aligned
    // hi/lo B slots: 3 suffice (slot it % NSLOT was last read by batch it - NSLOT, retired before the barrier of
    // it - 1); the TMA path uses one per raw stage, so that in the loop (unrolled by PD) every slot address and
    // descriptor is a constant offset.
    constexpr int NSLOT = TMA ? PD : 3;
    static_assert(NSLOT >= 3, "hi/lo slots");
    constexpr int BITEMS = BN * 4;  // (row, 8-float chunk) items of a k-tile
    constexpr int BPER = (BITEMS + NT - 1) / NT;
    constexpr int NSTG = PD;  // stage of iteration it is refilled for it + PD right after its own split
    constexpr int RAW_A = BM * 128, RAW_B = BN * 128;  // TMA: bytes of one stage's raw A and B tiles
    static_assert(!TMA || KH == 4, "TMA path: whole k-tiles");
    constexpr int NPART = 4 / KH;  // iterations per k-tile
    constexpr int NV = KH / 2;     // float4 per row per iteration
    constexpr int PFK = 6;         // L2 prefetch distance, k-tiles
    static_assert(KH == 2 || KH == 4, "k8-steps per iteration");
    static_assert(BN % 8 == 0 && BN >= 8 && BN <= 256, "wgmma N");
    static_assert((NT / 4) % 8 == 0, "a warp's B items must cover 8 consecutive rows");
    static_assert(PD >= 1, "prefetch depth");
    extern __shared__ unsigned char smem_raw[];
    __shared__ double s_wsum[NT / 32];
    __shared__ int s_flag;
    __shared__ alignas(8) unsigned long long s_full[TMA ? PD : 1];  // TMA: one mbarrier per raw stage

    V3_STAMP(0, true);  // entry
    const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;  // the host adds 1 KB of slack
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq = warp & 3, g = lane >> 2, c = lane & 3;
    const int B = P.B, D = P.D, N = P.N, S = P.S;
    const int m_tiles = (B + BM - 1) / BM;
    const int mt = blockIdx.x % m_tiles, split = blockIdx.x / m_tiles;  // same-split CTAs adjacent (L2 reuse)
    const int row0 = mt * BM;
    // Balanced contiguous split of the n-tiles, in 32-bit arithmetic (no 64-bit division subroutine: ptxas must
    // see every loop bound as warp-uniform, or it serialises the wgmma pipeline).
    const int t_q = P.n_tiles / S, t_r = P.n_tiles % S;
    const int t_begin = split * t_q + min(split, t_r);
    const int t_end = t_begin + t_q + (split < t_r ? 1 : 0);
    const int KT = (D + 31) / 32;
    const int total = (t_end - t_begin) * KT * NPART;

    // A: this thread's fragment rows rA and rA + 8 (physical k 8c + 0..7 of each k-tile).
    // Rows past B read row B-1 instead: their dot products are garbage but belong to rows that are never written.
    const int rA = row0 + 64 * wg + 16 * wq + g;
    const float* pA0 = P.q + (size_t)min(rA, B - 1) * D;
    const float* pA1 = P.q + (size_t)min(rA + 8, B - 1) * D;
    // B: item u = tile row (tid >> 2) + (NT/4) u, physical k 8c + 0..7.  (tid >> 2) & 7 == g: the row's swizzle.
    const int rB0 = tid >> 2;
    // Columns past N (and items past the tile's BN rows) read row N-1: their dot products are masked in fold().
    const float* pB[BPER];
    auto set_b_rows = [&](int tile) {
#pragma unroll
        for (int u = 0; u < BPER; ++u) pB[u] = P.n + (size_t)min(tile * BN + rB0 + (NT / 4) * u, N - 1) * D;
    };

    // Loader cursor (iteration order: n-tile, k-tile, part).  Branch-free (ptxas serialises wgmma when registers
    // that feed it are written in a divergent path): every load is issued.  K tail: a float4 past D is read from the
    // row's last float4 instead (D % 4 == 0), and only the negatives' copy is zeroed, which zeroes every product of
    // the tail.  Past the last iteration the cursor runs on harmlessly.
    int ld_kt = 0, ld_part = 0, ld_tile = t_begin;
    set_b_rows(ld_tile);
    auto load = [&](Stage<KH, BPER>& st) {
        const int k = ld_kt * 32 + ld_part * 4 * NV + 8 * c;  // this thread's first float of the iteration
#pragma unroll
        for (int v = 0; v < NV; ++v) {
            const int kv = k + 4 * v;
            const int kc = min(kv, D - 4);
            st.x[v] = ldg4(pA0 + kc);
            st.y[v] = ldg4(pA1 + kc);
#pragma unroll
            for (int u = 0; u < BPER; ++u) {
                const float4 b = ldg4(pB[u] + kc);
                const bool kok = kv < D;
                st.b[u][v] = make_float4(kok ? b.x : 0.f, kok ? b.y : 0.f, kok ? b.z : 0.f, kok ? b.w : 0.f);
            }
        }
        if (++ld_part == NPART) {
            ld_part = 0;
            if (++ld_kt == KT) {
                ld_kt = 0;
                ++ld_tile;
                set_b_rows(ld_tile);
            }
        }
    };

    // L2 prefetch, PFK k-tiles ahead of the loads: thread t < BM owns query row row0 + t, thread BM <= t < BM + BN
    // owns row t - BM of the prefetch cursor's n-tile; one 128-byte line per row and k-tile (the line of the
    // row's first float in the k-tile: all of it when D % 32 == 0 and the base is 128-byte aligned).
    static_assert(BN <= NT - BM, "one prefetching thread per row");
    const bool pf_isA = tid < BM;
    const int pf_r = pf_isA ? tid : tid - BM;
    int pf_left = (t_end - t_begin) * KT, pf_kt = 0, pf_tile = t_begin;
    bool pf_ok;
    const float* pf_ptr;
    auto pf_set_rows = [&]() {  // selects, no branch
        const int col = pf_tile * BN + pf_r;
        pf_ok = pf_isA ? row0 + pf_r < B : pf_r < BN && col < N;
        pf_ptr = (pf_isA ? P.q : P.n) + (pf_ok ? (size_t)(pf_isA ? row0 + pf_r : col) * D : 0);
    };
    pf_set_rows();
    auto prefetch = [&]() {
        if (pf_left > 0) {
            prefetch_l2_if(pf_ptr + pf_kt * 32, pf_ok);  // predicated, not branched (see load)
            --pf_left;
            if (++pf_kt == KT) {
                pf_kt = 0;
                ++pf_tile;
                pf_set_rows();
            }
        }
    };

    Stage<KH, BPER> stg[TMA ? 1 : NSTG];
    const uint32_t raw0 = sbase + (uint32_t)(NSLOT * SLOT);  // TMA: raw stage s at raw0 + s * (RAW_A + RAW_B)
    const uint32_t full0 = smem_u32(&s_full[0]);
    // TMA: thread 0 fills raw stage `stage` with the loader cursor's k-tile (and every thread advances the cursor).
    auto tma_issue = [&](int stage) {
        const uint32_t dst = raw0 + (uint32_t)(stage * (RAW_A + RAW_B)), bar = full0 + 8u * (uint32_t)stage;
        if (tid == INFONCE_V3_TMA_TID) {
            mbar_arrive_expect_tx(bar, (uint32_t)(RAW_A + RAW_B));
            tma_load_2d(dst, &tmA, ld_kt * 32, row0, bar);
            tma_load_2d(dst + RAW_A, &tmB, ld_kt * 32, ld_tile * BN, bar);
        }
        if (++ld_kt == KT) ld_kt = 0, ++ld_tile;
    };
    if constexpr (TMA) {
        if (tid == 0) {
#pragma unroll
            for (int s = 0; s < PD; ++s) mbar_init(full0 + 8u * (uint32_t)s, 1u);
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncthreads();
#pragma unroll
        for (int s = 0; s < PD; ++s)
            if (s < total) tma_issue(s);
    } else {
#pragma unroll
        for (int i = 0; i < PFK; ++i) prefetch();
#pragma unroll
        for (int s = 0; s < PD; ++s) load(stg[s]);
    }

    // Positive term for the rows of this m-tile with row % S == split, while the first loads are in flight.
    positive_cosines(P, row0, BM, split, warp, NT / 32, lane);
    V3_STAMP(1, true);  // prologue done: first loads issued, positive cosines written
    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
    float run_m[2] = {-INFINITY, -INFINITY}, run_s[2] = {0.f, 0.f};

    // Fold the finished n-tile into the running (max, sum of exp2) of rows rA and rA + 8 (fast.py's epilogue).
    auto fold = [&](int tile) { fold_tile<BN>(P, acc, run_m, run_s, rA, tile * BN + 2 * c); };

    // B store address of item u, chunk i: b_st0 + slot + u rows, ^ (i << 4) (bits 4-6 of the row address are
    // zero, so after | (g << 4) the xor gives + ((i ^ g) << 4)).
    const uint32_t b_st0 = (sbase + (uint32_t)(rB0 * 128 + (c << 2))) | (uint32_t)(g << 4);
    const uint64_t desc0 = sw128_desc(sbase);
    int rd_kt = 0, rd_part = 0, rd_tile = t_begin, rd_slot = 0;
    V3_PHASE_DECL
    for (int it0 = 0; it0 < total; it0 += NSTG) {
#pragma unroll
        for (int s = 0; s < NSTG; ++s) {
            if (it0 + s < total) {
                Stage<KH, BPER> tst;  // TMA: this iteration's pieces, read back from raw stage s
                if constexpr (TMA) {
                    const uint32_t bar = full0 + 8u * (uint32_t)s, par = (uint32_t)(it0 / NSTG) & 1u;
                    while (!mbar_try(bar, par)) {  // unbounded (see the notes' next steps: bound it as cross_entropy's)
                    }
                    V3_PHASE(0);  // waiting for the raw stage
                    // 128-byte swizzle: 16-byte chunk j of tile row r sits at r * 128 + ((j ^ (r & 7)) << 4); the
                    // thread's A rows (rl, rl + 8) and B rows (rB0 + 64 u) all have r & 7 == g.
                    const uint32_t ra = raw0 + (uint32_t)(s * (RAW_A + RAW_B));
                    const int rl = 64 * wg + 16 * wq + g;
#pragma unroll
                    for (int v = 0; v < 2; ++v) {
                        const uint32_t cof = (uint32_t)(((2 * c + v) ^ g) << 4);
                        tst.x[v] = lds4(ra + (uint32_t)(rl * 128) + cof);
                        tst.y[v] = lds4(ra + (uint32_t)((rl + 8) * 128) + cof);
#pragma unroll
                        for (int u = 0; u < BPER; ++u)  // items past the tile's BN rows read row BN-1 (never stored)
                            tst.b[u][v] = lds4(ra + (uint32_t)(RAW_A + min(rB0 + (NT / 4) * u, BN - 1) * 128) + cof);
                    }
                }
                Stage<KH, BPER>& st = TMA ? tst : stg[TMA ? 0 : s];
                // 1. A hi/lo fragments (registers, wgmma's A operand)
                uint32_t ahi[4 * KH], alo[4 * KH];
                split_a_fragments<KH>(st.x, st.y, ahi, alo);
                // 2. B hi/lo into slot rd_slot, chunks rd_part*KH*2/2 .. (the k8-steps of this part)
                const int slot = TMA ? s : rd_slot;
                store_b_hilo<NT, BITEMS, BUF>(st.b, b_st0 + (uint32_t)(slot * SLOT), (uint32_t)(rd_part * 4 * NV), tid);
                V3_PHASE(1);  // shared loads, splits, hi/lo stores
                // 3. make the generic-proxy stores visible to wgmma (async proxy), then to every warp
#ifndef INFONCE_V3_NO_PROXY_FENCE
                fence_proxy_async_smem();
#endif
                __syncthreads();
                V3_STAMP(2, it0 + s == 0);  // first k-tile split and stored by every thread
                V3_PHASE(2);  // proxy fence and barrier
                // TMA: every thread has read raw stage s (before the barrier): refill it for iteration it + PD
                if constexpr (TMA) {
                    if (it0 + s + PD < total) tma_issue(s);
                }
                V3_PHASE(6);  // TMA refill (thread 0)
                // 4. KH k8-steps x 3 products (KH <= 4: all in this slot's k-tile)
                issue_3xtf32_batch<BN, KH>(acc, ahi, alo,
                                           desc0 + (uint64_t)((slot * SLOT) >> 4) + (uint64_t)(2 * KH * rd_part), 0,
                                           (uint64_t)(BUF >> 4), rd_kt == 0 && rd_part == 0);
                V3_PHASE(3);  // wgmma issue
                wg_wait<1>();  // the batch of the previous iteration is done (its A fragments are free)
#pragma unroll
                for (int i = 0; i < NACC; ++i) reg_fence(acc[i]);
                V3_PHASE(4);  // wait for the previous batch
                // 5. refill this stage (consumed by the split above) for iteration it + PD, prefetch ahead, advance
                if constexpr (!TMA) {
                    load(st);
                    if (rd_part == 0) prefetch();
                }
                if (++rd_part == NPART) {
                    rd_part = 0;
                    rd_slot = rd_slot == NSLOT - 1 ? 0 : rd_slot + 1;
                    if (++rd_kt == KT) {
                        wg_wait<0>();
#pragma unroll
                        for (int i = 0; i < NACC; ++i) reg_fence(acc[i]);
                        fold(rd_tile);
                        rd_kt = 0;
                        ++rd_tile;
                    }
                }
            }
        }
    }
    V3_PHASE(5);  // the rest (folds, cursor, loop)
    V3_PHASE_STORE();
    wg_wait<0>();  // (already done by the last fold; keeps the wgmma pipeline closed on every path)
    V3_STAMP(3, true);  // K loop and last fold done

    finish_cta<NT>(P, run_m, run_s, rA, c == 0 ? 3 : 0, split, s_wsum, &s_flag);
}


// PROD (eleventh session): the TMA kernel with a producer warpgroup.  Thread 0 of the kernel above spends about 240
// clocks per k-tile issuing the copies while the other warps wait for it at the next wgmma (a warpgroup-wide
// instruction), and every CTA computes its positive cosines from cold memory before its first k-tile.  Here warpgroup
// 2 (warps 8-11) issues every copy (thread 256; it waits on a per-stage "empty" mbarrier that consumer thread 0
// arrives on after each k-tile's barrier) and computes the cosines after its last copy, while the consumers finish
// their last k-tiles.  The consumers (warps 0-7) run the kernel above's loop (the same products in the same order:
// bit-identical loss) with a named barrier for their 256 threads.  Registers: 384 threads leave 168 per thread at
// entry (three warps share each sub-partition's 16K registers); setmaxnreg gives the consumers 224 and the producer
// 56 (224 x 256 + 56 x 128 = 168 x 384: an increase blocks until the pool holds the registers, so the two must
// balance exactly).  The roles never rejoin: each ends in its own copy of finish_cta (its barriers are warp-uniform),
// so the consumers merge under their 224 registers.  Measured (eleventh session): the K loop ends 2.1 us earlier than
// the kernel above's, but the merge takes 4.4-4.9 us against 3.0 (with a common end too), so the call is 0.3-0.5 us
// slower and this kernel is not in the automatic plan.  Its SASS reloads the kernel parameters (64 LDC) before the
// merge's loads, where the kernel above forms the addresses from registers: the lead for the next step.
template <int BN, int PD>
__global__ void __launch_bounds__(384, 1)
    infonce_wgmma_prod_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                              const WgParams P) {
    constexpr int NC = 256, NT = NC + 128, BM = 128, NACC = BN / 2;
    constexpr int BUF = BN * 128, SLOT = 2 * BUF;  // hi then lo, one slot per raw stage
    constexpr int RAW_A = BM * 128, RAW_B = BN * 128, RAW = RAW_A + RAW_B;
    constexpr int BITEMS = BN * 4, BPER = (BITEMS + NC - 1) / NC;  // (row, 8-float chunk) items of a k-tile
    static_assert(PD >= 3, "hi/lo slot it % PD was last read by batch it - PD (see the kernel above)");
    static_assert(BN % 8 == 0 && BN >= 8 && BN <= 256, "wgmma N");
    extern __shared__ unsigned char smem_raw[];
    __shared__ double s_wsum[NT / 32];
    __shared__ int s_flag;
    __shared__ alignas(8) unsigned long long s_full[PD], s_empty[PD];

    V3_STAMP(0, true);  // entry
    const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;  // the host adds 1 KB of slack
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq = warp & 3, g = lane >> 2, c = lane & 3;
    const int B = P.B, D = P.D, S = P.S;
    const int m_tiles = (B + BM - 1) / BM;
    const int mt = blockIdx.x % m_tiles, split = blockIdx.x / m_tiles;
    const int row0 = mt * BM;
    const int t_q = P.n_tiles / S, t_r = P.n_tiles % S;  // 32-bit, warp-uniform (see the kernel above)
    const int t_begin = split * t_q + min(split, t_r);
    const int t_end = t_begin + t_q + (split < t_r ? 1 : 0);
    const int KT = (D + 31) / 32;
    const int total = (t_end - t_begin) * KT;
    const uint32_t raw0 = sbase + (uint32_t)(PD * SLOT), full0 = smem_u32(&s_full[0]), empty0 = smem_u32(&s_empty[0]);
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < PD; ++s) {
            mbar_init(full0 + 8u * (uint32_t)s, 1u);
            mbar_init(empty0 + 8u * (uint32_t)s, 1u);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    float run_m[2] = {-INFINITY, -INFINITY}, run_s[2] = {0.f, 0.f};
    const int rA = row0 + 64 * wg + 16 * wq + g;  // consumers: this thread's A rows rA, rA + 8
    if (warp >= NC / 32) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
        // Producer: every copy of the CTA, in iteration order, PD stages ahead of the consumers.
        if (tid == NC) {
            int kt = 0, tile = t_begin;
#pragma unroll 1
            for (int it = 0; it < total; ++it) {
                const int s = it % PD;
                if (it >= PD)
                    while (!mbar_try(empty0 + 8u * (uint32_t)s, (uint32_t)((it / PD - 1) & 1))) {  // unbounded
                    }
                const uint32_t dst = raw0 + (uint32_t)(s * RAW), bar = full0 + 8u * (uint32_t)s;
                mbar_arrive_expect_tx(bar, (uint32_t)RAW);
                tma_load_2d(dst, &tmA, kt * 32, row0, bar);
                tma_load_2d(dst + RAW_A, &tmB, kt * 32, tile * BN, bar);
                if (++kt == KT) kt = 0, ++tile;
            }
        }
        __syncwarp();
        // Positive term for this m-tile's rows with row % S == split, off the consumers' path.
        positive_cosines(P, row0, BM, split, warp - NC / 32, 4, lane);
        finish_cta<NT, NC, false>(P, run_m, run_s, rA, 0, split, s_wsum, &s_flag);  // barriers only
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
        V3_STAMP(1, true);  // prologue done
        float acc[NACC];
#pragma unroll
        for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
        const int rB0 = tid >> 2;
        const uint32_t b_st0 = (sbase + (uint32_t)(rB0 * 128 + (c << 2))) | (uint32_t)(g << 4);  // as above
        const uint64_t desc0 = sw128_desc(sbase);
        const int rl = 64 * wg + 16 * wq + g;  // A rows in the raw tile: rl, rl + 8 (both have r & 7 == g)
        int rd_kt = 0, rd_tile = t_begin;
        for (int it0 = 0; it0 < total; it0 += PD) {
#pragma unroll
            for (int s = 0; s < PD; ++s) {
                if (it0 + s < total) {
                    while (!mbar_try(full0 + 8u * (uint32_t)s, (uint32_t)((it0 / PD) & 1))) {  // unbounded
                    }
                    const uint32_t ra = raw0 + (uint32_t)(s * RAW);
                    float4 x[2], y[2], bv[BPER][2];
#pragma unroll
                    for (int v = 0; v < 2; ++v) {
                        const uint32_t cof = (uint32_t)(((2 * c + v) ^ g) << 4);
                        x[v] = lds4(ra + (uint32_t)(rl * 128) + cof);
                        y[v] = lds4(ra + (uint32_t)((rl + 8) * 128) + cof);
#pragma unroll
                        for (int u = 0; u < BPER; ++u)  // items past the tile's BN rows read row BN-1 (never stored)
                            bv[u][v] = lds4(ra + (uint32_t)(RAW_A + min(rB0 + (NC / 4) * u, BN - 1) * 128) + cof);
                    }
                    uint32_t ahi[16], alo[16];
                    split_a_fragments<4>(x, y, ahi, alo);
                    store_b_hilo<NC, BITEMS, BUF>(bv, b_st0 + (uint32_t)(s * SLOT), 0u, tid);
                    fence_proxy_async_smem();
                    bar_sync_named(1, NC);  // the consumers only
                    V3_STAMP(2, it0 + s == 0);  // first k-tile split and stored
                    if (tid == 0) mbar_arrive(empty0 + 8u * (uint32_t)s);  // every consumer has read raw stage s
                    issue_3xtf32_batch<BN, 4>(acc, ahi, alo, desc0 + (uint64_t)((s * SLOT) >> 4), 0,
                                              (uint64_t)(BUF >> 4), rd_kt == 0);
                    wg_wait<1>();
#pragma unroll
                    for (int i = 0; i < NACC; ++i) reg_fence(acc[i]);
                    if (++rd_kt == KT) {
                        wg_wait<0>();
#pragma unroll
                        for (int i = 0; i < NACC; ++i) reg_fence(acc[i]);
                        fold_tile<BN>(P, acc, run_m, run_s, rA, rd_tile * BN + 2 * c);
                        rd_kt = 0;
                        ++rd_tile;
                    }
                }
            }
        }
        wg_wait<0>();
        V3_STAMP(3, true);  // K loop and last fold done
        finish_cta<NT, NC>(P, run_m, run_s, rA, c == 0 ? 3 : 0, split, s_wsum, &s_flag);  // the merge, under 224 registers
    }
}


// BRES (twelfth session): the negatives tile resident in shared memory.  The kernels above split each k-tile of B
// inside the K loop, behind a CTA-wide barrier per k-tile; the eleventh session's ncu and stamps put the loop's time
// in that serial chain (shared loads, splits, hi/lo stores, proxy fence, barrier, copy issue, wgmma issue) with no
// unit busy.  When a CTA's whole BN x D negatives tile fits in shared memory as tf32 hi and lo (BN x D x 8 bytes:
// 160 KB at the seed shape), the CTA splits it once per tile (its first FG k-tiles before the loop, the rest at the
// first iteration that reads them: two CTA barriers per tile in all), and the loop has no other B work and no other
// CTA-wide barrier: each warpgroup streams its own 64 query rows through its own ring of raw TMA stages (KPI k-tiles
// per stage and iteration), splits them in registers, syncs its own 128 threads (after which its copy thread may
// refill the stage) and issues its batch.  The two warpgroups run free of each other.  The products are those of the
// kernels above, in the same order (the partials are bit-identical).  The plan uses it when every CTA has one n-tile
// and the grid is one wave; with several n-tiles per CTA (forced splits) each tile is loaded and split in turn.
// Measured (twelfth session, standalone bench, seed shape): 19.1-19.3 us against the 40-wide TMA kernel's 22.2-22.5;
// by stamps the prologue ends 2.3 us after entry and the K loop takes 9.7 us (13.6 before), 1.3 us of it the split
// of B's second group.
// A3D (sixteenth session): a stage's KPI k-tiles of A arrive by one 3-D tensor copy (D % 32 == 0; the plan checks)
// instead of KPI 2-D copies, in the same shared-memory layout; the copy thread's refill costs about half as many
// clocks (67 against 105-117 per k-tile), and the seed shape took 18.4-18.7 us against 18.6-18.9 with two copies.
// KS = 2 (nineteenth session): a cluster of two CTAs shares one BN-wide n-tile and splits K, CTA (cluster rank) r taking
// the r-th half of the iterations, so each CTA holds a BN x D / 2 tile of B and streams only its half of A: at the seed
// shape a 128 x 80 tile per pair instead of 128 x 40 per CTA, with half the A traffic, half the A splits and half the
// wgmma issues per CTA for the same tensor work.  After the loop the pair adds its accumulators through distributed
// shared memory, each CTA keeping one of every thread's two rows, and writes one partial per cluster and row: half as many
// partials for the merge to read (the peer's accumulators land in a buffer of their own after the B tile, announced by
// a remote mbarrier arrive).  The plan gives every cluster exactly one n-tile.  Measured (nineteenth session, bench,
// seed shape): 18.0-18.3 us against 18.4-18.5 for bres3d_n40_s2k2 in the same calls; by stamps the pair's loops end
// about 2 us earlier, and the wait for the slower CTA of the pair, the exchange and the 80-column fold take most of it.
// XA (twenty-second session): with a K split, all of A resident (a stage per iteration, no refills) and each
// warpgroup's exchange buffer in the first stages of its own ring, freed by a remote mbarrier arrive once read.  Bench,
// seed shape: 16.4 us against 15.9 for the 4-stage ring at one k-tile per stage; 15.2-15.3 against 15.4-15.6 at two
// (`s4k2_xa`, automatic in run 6215a01a); 14.9-15.0 against 14.6-14.7 once the positive cosines left group 1's split.
template <int BN, int PD, int KPI, int FG, bool A3D = false, int KS = 1, bool F16 = false, bool XA = false>
__global__ void __launch_bounds__(256, 1)
    infonce_wgmma_bres_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                              const WgParams P) {
    constexpr int NT = 256, BM = 128, NACC = BN / 2;
    constexpr int BUF = BN * 128;     // bytes of one tf32 copy (hi or lo) of a BN x 32 k-tile (a multiple of 1024)
    // A resident k-tile: tf32 hi and lo copies (the raw copy lands in the lo slot), or F16 (3xFP16): one BN x 128-byte
    // slot holding both, where the raw copy lands (issue_3xf16_batch has the layout).
    constexpr int KT_BYTES = F16 ? BUF : 2 * BUF, RAW_OFF = F16 ? 0 : BUF;
    constexpr int KS16 = 2 * KPI, AREGS = F16 ? 4 * KS16 : 4 * 4 * KPI;  // F16: k16-steps per iteration; A registers
    constexpr int RAW_K = 64 * 128;   // one warpgroup's raw 64 x 32 query k-tile
    constexpr int RAW_A = KPI * RAW_K;  // one stage: KPI k-tiles
    constexpr int KH = 4 * KPI;       // k8-steps per iteration
    static_assert(BN % 8 == 0 && BN >= 8 && BN <= 256, "wgmma N");
    static_assert(PD >= 2 && (KPI == 1 || KPI == 2), "stages, k-tiles per stage");
    static_assert(FG % KPI == 0 && FG > 0, "B group 0 is a whole number of iterations");
    extern __shared__ unsigned char smem_raw[];
    __shared__ double s_wsum[NT / 32];
    __shared__ int s_flag;
    __shared__ alignas(8) unsigned long long s_full[2 * PD];  // warpgroup w's stage s: s_full[w * PD + s]
    __shared__ alignas(8) unsigned long long s_bfull[2];  // the raw B tile's copies: k-tiles [0, FG), [FG, KTR)
    __shared__ alignas(8) unsigned long long s_xfull[2];  // KS = 2: the peer's sums for warpgroup w have landed
    __shared__ alignas(8) unsigned long long s_xfree[2];  // XA: the peer's warpgroup w's exchange buffer may be written
    __shared__ alignas(8) unsigned long long s_cfull;     // KS = 2: the staged positive rows have landed

    V3_STAMP(0, true);  // entry
    const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;  // the host adds 1 KB of slack
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq = warp & 3, g = lane >> 2, c = lane & 3;
    const int B = P.B, D = P.D, S = P.S;
    static_assert(KS == 1 || KS == 2, "K split: pairs (a cluster of 4 CTAs of 225 KB does not fit 128 at once)");
    const int m_tiles = (B + BM - 1) / BM;
    const int rank = (int)(blockIdx.x % KS), cl = (int)(blockIdx.x / KS);  // 1-D grid, clusters of (KS, 1, 1)
    const int mt = cl % m_tiles, split = cl / m_tiles;  // split: the cluster's partial (S clusters per m-tile)
    // The positive cosines of the m-tile's rows, shared out over its S clusters (with a K split: its rows [64 rank,
    // 64 rank + 64) to CTA rank of each cluster).
    const int cos_row0 = mt * BM + (KS == 1 ? 0 : 64 * rank), cos_rows = BM / KS;
    const int wrow0 = mt * BM + 64 * wg;  // the first of the warpgroup's 64 rows
    const int t_q = P.n_tiles / S, t_r = P.n_tiles % S;  // 32-bit, warp-uniform (see infonce_wgmma_kernel)
    const int t_begin = split * t_q + min(split, t_r);
    const int t_end = t_begin + t_q + (split < t_r ? 1 : 0);
    const int KI = ((D + 32 * KPI - 1) / (32 * KPI) + KS - 1) / KS;  // iterations per n-tile (of this CTA's K range)
    const int KTR = KI * KPI;                         // k-tiles of the resident B tile (past D: zeros)
    const int kofs = rank * KTR;                      // the first k-tile of this CTA's K range
    const int total = (t_end - t_begin) * KI;         // iterations of each warpgroup
    const int rA = wrow0 + 16 * wq + g;
    // K split: each warpgroup receives half of its accumulator from the peer, XBYTES, into an exchange buffer of its
    // own.  XA: the whole K range of A resident (every iteration has a stage of its own, no refills: the plan checks
    // KI <= PD), and each warpgroup's exchange buffer in the first stages of its own ring, whose 128 threads tell the
    // peer (a remote arrive on its s_xfree[wg]) once they have read those stages.
    constexpr int XBYTES = 128 * (BN / 4) * 4, XSTAGES = (XBYTES + RAW_A - 1) / RAW_A;
    static_assert(!XA || (KS == 2 && PD >= XSTAGES), "XA: a K split whose ring holds the exchange buffer");
    const int x_sig_it = min(total, XSTAGES) - 1;  // XA: the iteration after which the buffer's stages are read

    // Shared memory: the A rings (warpgroup w's stage s at sbase + (w * PD + s) * RAW_A, k-tile h of the stage
    // RAW_K further per h), then the resident B tile (k-tile kt at b_res + kt * KT_BYTES: tf32 its hi copy, its lo
    // copy BUF after it; F16 one slot of both).
    const uint32_t a_ring = sbase + (uint32_t)(wg * PD * RAW_A);
    const uint32_t b_res = sbase + (uint32_t)(2 * PD * RAW_A);
    const uint32_t full0 = smem_u32(&s_full[wg * PD]);

    // The BN x D negatives tile `tile` into b_res as hi/lo, in two steps.  (1) Thread 0 copies k-tile kt's raw
    // BN x 32 box (tensor map, 128-byte swizzle: float 4j + e of row n in 16-byte chunk j at position j ^ (n & 7);
    // zeros past N and past D) into kt's slot (tf32: its lo slot), one mbarrier per group: k-tiles [0, FG) and
    // [FG, KTR).  (2) Each
    // thread takes items q = (k-tile, row q % BN) of a group: reads the row's 8 raw chunks, then writes its hi and lo
    // chunks in place.
    // Chunk i of the hi/lo layout holds physical floats i, 8 + i, 16 + i, 24 + i (the K permutation of the kernels
    // above: float 8c + i in chunk i, word c), at position i ^ (n & 7), so a thread rewrites only the 128 bytes it has
    // read.  Consecutive threads take consecutive rows: the 8 lanes of each 16-byte access phase hit 8 different
    // positions of 8 rows, no bank conflicts.  Group 0 is split in the prologue, group 1 at the start of the first
    // iteration that reads it (a CTA barrier), by which time its copies have landed: most of the tile's memory stream
    // runs under the loop instead of in front of it.  (First versions: per-thread global loads of each item's 128
    // bytes, a warp touching 32 rows per load, prologue 6-8 us at the seed shape; then the whole tile split in the
    // prologue, 4.9 us, most of it waiting for 80 KB per SM from memory; then groups of 4 k-tiles, 0.7 us per
    // group split in the loop.)
    const int NG = KTR > FG ? 2 : 1;
    auto bbar = [&](int grp) { return smem_u32(&s_bfull[grp]); };
    auto b_copy = [&](int tile, int grp) {  // the copies of one group (thread 0)
        if (tid == 0 && grp < NG) {
            const int k0 = grp == 0 ? 0 : FG, k1 = grp == 0 ? min(FG, KTR) : KTR;
            mbar_arrive_expect_tx(bbar(grp), (uint32_t)((k1 - k0) * BUF));
#pragma unroll 1
            for (int kt = k0; kt < k1; ++kt)
                tma_load_2d(b_res + (uint32_t)(kt * KT_BYTES + RAW_OFF), &tmB, (kofs + kt) * 32, tile * BN, bbar(grp));
        }
    };
    // Split group grp (parity: the tile's use of the group's barrier).  With cos_warp0 >= 0 the warps from cos_warp0
    // on first compute the positive cosines (they have few or no items in this group).
    auto b_split = [&](int grp, uint32_t parity, int cos_warp0) {
        const int k0 = grp == 0 ? 0 : FG, items = BN * ((grp == 0 ? min(FG, KTR) : KTR) - k0);
        if (cos_warp0 >= 0 && warp >= cos_warp0)
            positive_cosines(P, cos_row0, cos_rows, split, warp - cos_warp0, NT / 32 - cos_warp0, lane);
        while (!mbar_try(bbar(grp), parity)) {  // unbounded, as the A stages
        }
        V3_STAMP(11, grp == 1);
        // One item per thread at a time (two or three in flight made ptxas spill: 1-2 us slower at the seed shape).
#pragma unroll 1
        for (int q = tid; q < items; q += NT) {
            const int kt = k0 + q / BN, n = q % BN;
            const uint32_t row = b_res + (uint32_t)(kt * KT_BYTES + n * 128);
            float4 f[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) f[j] = lds4(row + (uint32_t)RAW_OFF + (uint32_t)((j ^ (n & 7)) << 4));
            if constexpr (F16) {  // chunk 2s + h (hi) / 4 + 2s + h (lo), word w: floats 8w + 4s + 2h, +1 = f[2w + s]
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    uint32_t hi[4], lo[4];
#pragma unroll
                    for (int w = 0; w < 4; ++w) {
                        const float4& x = f[2 * w + (i >> 1)];
                        split_f16x2((i & 1) ? x.z : x.x, (i & 1) ? x.w : x.y, hi[w], lo[w]);
                    }
                    sts4(row + (uint32_t)((i ^ (n & 7)) << 4), hi);
                    sts4(row + (uint32_t)(((4 + i) ^ (n & 7)) << 4), lo);
                }
            } else {
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    uint32_t hi[4], lo[4];
#pragma unroll
                    for (int w = 0; w < 4; ++w) {
                        const float4& x = f[2 * w + (i >> 2)];
                        const float e = (i & 3) == 0 ? x.x : (i & 3) == 1 ? x.y : (i & 3) == 2 ? x.z : x.w;
                        split_tf32_rn(__float_as_uint(e), hi[w], lo[w]);
                    }
                    const uint32_t a = row + (uint32_t)((i ^ (n & 7)) << 4);
                    sts4(a, hi);
                    sts4(a + (uint32_t)BUF, lo);
                }
            }
        }
        fence_proxy_async_smem();  // generic-proxy stores, read by wgmma (async proxy)
        __syncthreads();
    };

    // Warpgroup copy cursor (A does not depend on the n-tile): its thread 0 fills stage `stage` with k-tiles
    // ld_kt .. ld_kt + KPI - 1 of the warpgroup's 64 rows (zeros past B and past D, whole boxes included); every
    // thread advances the cursor.
    int ld_kt = 0;
    auto tma_issue = [&](int stage) {
        if ((tid & 127) == 0) {
            const uint32_t bar = full0 + 8u * (uint32_t)stage, dst = a_ring + (uint32_t)(stage * RAW_A);
            mbar_arrive_expect_tx(bar, (uint32_t)RAW_A);
            if (A3D) tma_load_3d(dst, &tmA, 0, wrow0, kofs + ld_kt, bar);
#pragma unroll
            for (int h = 0; h < (A3D ? 0 : KPI); ++h)
                tma_load_2d(dst + (uint32_t)(h * RAW_K), &tmA, (kofs + ld_kt + h) * 32, wrow0, bar);
        }
        ld_kt += KPI;
        if (ld_kt == KTR) ld_kt = 0;
    };
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < 2 * PD; ++s) mbar_init(smem_u32(&s_full[0]) + 8u * (uint32_t)s, 1u);
#pragma unroll 1
        for (int grp = 0; grp < 2; ++grp) mbar_init(bbar(grp), 1u);
#pragma unroll
        for (int w = 0; w < 2; ++w) {
            if (KS > 1) mbar_init(smem_u32(&s_xfull[w]), 1u);
            if (XA) mbar_init(smem_u32(&s_xfree[w]), 1u);
        }
        if (KS > 1) mbar_init(smem_u32(&s_cfull), 1u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#pragma unroll
        for (int w = 0; w < 2; ++w)
            if (KS > 1) mbar_arrive_expect_tx(smem_u32(&s_xfull[w]), (uint32_t)XBYTES);  // the peer's st.async
    }
    __syncthreads();
    // KS = 2: the peer may arrive on s_xfull only once it is initialised; this arrive is waited for after the K loop.
    if (KS > 1) asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    b_copy(t_begin, 0);  // in the order they are needed: B group 0, the first A stages, B group 1
#pragma unroll
    for (int s = 0; s < PD; ++s)
        if (s < total) tma_issue(s);
    b_copy(t_begin, 1);
    // K split: this CTA's first positive rows of q and p (cosines_after_loop), behind every copy the loop waits for,
    // into shared memory after the B tile and the exchange buffer (wg_smem_bytes' caller, make_plan, adds the room).
    const uint32_t cos_stage = b_res + (uint32_t)(KTR * KT_BYTES + (XA ? 0 : BN * 256));
    if (KS > 1 && NG > 1 && P.cos_stage && tid == 0) {
        const uint32_t bar = smem_u32(&s_cfull), rb = (uint32_t)(D * 4);
        int rows = 0;
        while (rows < kCosStaged && split + S * rows < cos_rows && cos_row0 + split + S * rows < B) ++rows;
        mbar_arrive_expect_tx(bar, (uint32_t)rows * 2u * rb);
#pragma unroll 1
        for (int j = 0; j < rows; ++j) {
            const size_t row = (size_t)(cos_row0 + split + S * j) * D;
            bulk_copy_g2s(cos_stage + 2u * j * rb, P.q + row, rb, bar);
            bulk_copy_g2s(cos_stage + (2u * j + 1u) * rb, P.p + row, rb, bar);
        }
    }
    // The positive cosines: with one group, while group 0's copies are in flight (all warps); else at the start of
    // group 1's split (which always happens on the first tile), by the last two warps (more when the group's items
    // fill fewer warps), from rows prefetched into L2 now; with a K split, after the loop, by the warpgroup that sends
    // its sums to the peer (it waits for nothing then, while the keeper waits and folds), from the rows staged above
    // (cosines_after_loop; the others prefetched into L2 now).  Group 1's split is on the loop's critical path: with
    // the cosines in it the seed shape took 15.2-15.6 us, without 14.6-15.0 (bench).
    const int cos_warp0 = NG == 1 ? 0 : min(NT / 32 - 2, BN * (KTR - FG) / 32);
    const bool all_staged = KS > 1 && P.cos_stage && S * kCosStaged >= cos_rows;  // (then no prefetch is needed)
    if (NG > 1 && !all_staged) positive_cosines<true>(P, cos_row0, cos_rows, split, warp, NT / 32, lane);
    b_split(0, 0u, NG == 1 ? 0 : -1);
    V3_STAMP(1, true);  // prologue done: B group 0 split and stored

    float acc[NACC], acc_x[F16 ? NACC : 1];  // F16: acc_x sums the hi.lo products (scaled by 2^11)
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
#pragma unroll
    for (int i = 0; i < (F16 ? NACC : 1); ++i) acc_x[i] = 0.f;
    float run_m[2] = {-INFINITY, -INFINITY}, run_s[2] = {0.f, 0.f};
    float tot[F16 ? NACC : 1];  // F16: an n-tile's dot products (K splits: handed over after the loop)
    const uint64_t descB = sw128_desc(b_res);
    const int rl = 16 * wq + g;  // the thread's A rows in the warpgroup's box: rl, rl + 8 (both with row & 7 == g)
    int rd_ki = 0, rd_tile = t_begin;
    V3_PHASE_DECL
    // Unrolled by two (PD when odd): consecutive iterations' A fragments live in different registers; the stage index
    // is known at run time only.  (Unrolled by PD the loop's code is twice as long at PD = 4; the seed shape took the
    // same time either way, within 0.1 us, so the shorter code stays.)
    constexpr int UNR = PD % 2 == 0 ? 2 : PD;
    for (int it0 = 0; it0 < total; it0 += UNR) {
#pragma unroll
        for (int s0 = 0; s0 < UNR; ++s0) {
            const int it = it0 + s0, s = it % PD;  // the iteration, its stage
            if (it < total) {
                // The iteration reads B group 1 first: split it.  With a K split (one n-tile per cluster) that is
                // iteration FG / KPI, so only that unrolled copy carries the split's code: the loop's code is fetched
                // cold after an L2 flush, and every copy of code that never runs is bytes in the way.
                if ((KS == 1 || s0 == (FG / KPI) % UNR) && rd_ki * KPI == FG && NG == 2)
                    b_split(1, (uint32_t)((rd_tile - t_begin) & 1), rd_tile == t_begin && KS == 1 ? cos_warp0 : -1);
                const uint32_t bar = full0 + 8u * (uint32_t)s, par = (uint32_t)(it / PD) & 1u;
                while (!mbar_try(bar, par)) {  // unbounded, as the kernels above
                }
                V3_PHASE(0);  // waiting for the raw stage
                const uint32_t ra = a_ring + (uint32_t)(s * RAW_A);
                float4 x[2 * KPI], y[2 * KPI];
#pragma unroll
                for (int h = 0; h < KPI; ++h)
#pragma unroll
                    for (int v = 0; v < 2; ++v) {
                        const uint32_t cof = (uint32_t)(h * RAW_K) + (uint32_t)(((2 * c + v) ^ g) << 4);
                        x[2 * h + v] = lds4(ra + (uint32_t)(rl * 128) + cof);
                        y[2 * h + v] = lds4(ra + (uint32_t)((rl + 8) * 128) + cof);
                    }
                uint32_t ahi[AREGS], alo[AREGS];
                if constexpr (F16)
                    split_a_fragments_f16<KS16>(x, y, ahi, alo);
                else
                    split_a_fragments<KH>(x, y, ahi, alo);
                V3_PHASE(1);  // shared loads and splits
                const bool x_sig = XA && it == x_sig_it;
                if (!XA || x_sig)  // (XA: no refills) the refill or the XA signal follows
                    bar_sync_named(1 + wg, 128);  // the warpgroup's 128 threads have read stage s
                if (x_sig) {  // the peer's s_xfree was initialised before the cluster barrier's arrive
                    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
                    if ((tid & 127) == 0) mbar_arrive_remote(cluster_peer_addr(smem_u32(&s_xfree[wg]), 1u - rank));
                }
                V3_STAMP(2, it == 0);  // first stage read by warpgroup 0
                V3_PHASE(2);  // warpgroup barrier
                // the iteration's KPI resident k-tiles, KT_BYTES apart
                const uint64_t dh0 = descB + (uint64_t)((rd_ki * KPI * KT_BYTES) >> 4);
                if constexpr (F16)
                    issue_3xf16_batch<BN, KS16>(acc, acc_x, ahi, alo, dh0, (uint64_t)(KT_BYTES >> 4), rd_ki == 0);
                else
                    issue_3xtf32_batch<BN, KH>(acc, ahi, alo, dh0, (uint64_t)(KT_BYTES >> 4), (uint64_t)(BUF >> 4),
                                               rd_ki == 0);
                V3_PHASE(3);  // wgmma issue
                if (it + PD < total) tma_issue(s);  // refill stage s for iteration it + PD, behind the batch
                V3_PHASE(6);  // TMA refill (warpgroup thread 0)
                wg_wait<1>();  // the previous batch is done (its A fragments are free)
#pragma unroll
                for (int i = 0; i < NACC; ++i) reg_fence(acc[i]);
#pragma unroll
                for (int i = 0; i < (F16 ? NACC : 1); ++i) reg_fence(acc_x[i]);
                V3_PHASE(4);  // wait for the previous batch
                V3_ITER(it);
                if (++rd_ki == KI) {
                    wg_wait<0>();
#pragma unroll
                    for (int i = 0; i < NACC; ++i) reg_fence(acc[i]);
                    if constexpr (!F16) {
                        if constexpr (KS == 1) fold_tile<BN>(P, acc, run_m, run_s, rA, rd_tile * BN + 2 * c);
                    } else {  // the dot products into tot (a new array: no instruction but a wgmma may define an
                              // accumulator register, or ptxas serialises the wgmma); K splits fold after the loop
#pragma unroll
                        for (int i = 0; i < NACC; ++i) {
                            reg_fence(acc_x[i]);
                            tot[i] = fmaf(acc_x[i], 1.f / 2048.f, acc[i]);
                        }
                        if constexpr (KS == 1) {
                            fix_nonfinite<BN>(P, tot, rA, rd_tile * BN + 2 * c, D);
                            fold_tile<BN>(P, tot, run_m, run_s, rA, rd_tile * BN + 2 * c);
                        }
                    }
                    rd_ki = 0;
                    // the next n-tile (forced splits only, never with a K split): both warpgroups are done with B
                    if (++rd_tile < t_end && KS == 1) {
                        __syncthreads();
                        b_copy(rd_tile, 0);
                        b_copy(rd_tile, 1);
                        b_split(0, (uint32_t)((rd_tile - t_begin) & 1), -1);
                    }
                }
            }
        }
    }
    V3_PHASE(5);  // the rest (folds, loop)
    V3_PHASE_STORE();
    wg_wait<0>();
    auto dot = [&](int i) -> float {  // K split: this CTA's part of the n-tile's dot products
        if constexpr (F16) return tot[i]; else return acc[i];
    };
    if constexpr (KS > 1) {
        // The pair's sum of its n-tile (one per cluster), folded by rows: of its two rows rA + 8h every thread keeps
        // h = rank and sends the other's BN / 4 dot products to the same thread of the peer (the same rows, the other
        // half of K), which keeps that one.  So both warpgroups of both CTAs fold, one row per thread, and each row
        // still has one partial per cluster.  16 bytes per st.async into the exchange buffer of the peer's warpgroup,
        // each store counting its bytes on the peer's s_xfull[wg], whose thread 0 expected all XBYTES at the start.
        // The receiver waits there (acquire at cluster scope), adds the peer's sums to its own (the same sum of the
        // same two numbers in either CTA) and folds.  (Until the twenty-fourth session one warpgroup of each CTA kept
        // both its rows and the other sent all of its accumulator, so half the threads folded twice the columns.)
        V3_STAMP_T(7, true, 0);    // K split: warpgroup 0's loop done, before the exchange
        V3_STAMP_T(8, true, 128);  // warpgroup 1's
        // This warpgroup's exchange buffer (at the same offset in both CTAs): after the B tile, or (XA) at the start
        // of its own ring; the thread's 16-byte piece v at + v * 128 * 16.
        const uint32_t xbuf = (XA ? a_ring : b_res + (uint32_t)(KTR * KT_BYTES + wg * XBYTES)) + (uint32_t)((tid & 127) * 16);
        if (!XA)  // (XA: waited for inside the loop)
            asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");  // the peer's s_xfull is initialised
        if (XA)
            while (!mbar_try_cluster(smem_u32(&s_xfree[wg]), 0u)) {
            }
        // element 4j + 2h + e of the accumulator is row h's value i = 2j + e
        auto row_dot = [&](int h, int i) -> float { return dot(4 * (i >> 1) + 2 * h + (i & 1)); };
        const uint32_t dst = cluster_peer_addr(xbuf, 1u - rank);
        const uint32_t pbar = cluster_peer_addr(smem_u32(&s_xfull[wg]), 1u - rank);
        float mine[NACC / 2];
#pragma unroll
        for (int v = 0; v < NACC / 8; ++v) {
            float o[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const float d0 = row_dot(0, 4 * v + u), d1 = row_dot(1, 4 * v + u);
                mine[4 * v + u] = rank == 0 ? d0 : d1;
                o[u] = rank == 0 ? d1 : d0;
            }
            st_async_f4(dst + (uint32_t)(v * 128 * 16), o[0], o[1], o[2], o[3], pbar);
        }
        if (NG > 1 && wg != rank)  // (see cos_warp0)
            cosines_after_loop(P, cos_row0, cos_rows, split, wq, lane, cos_stage, smem_u32(&s_cfull));
        while (!mbar_try_cluster(smem_u32(&s_xfull[wg]), 0u)) {
        }
        V3_STAMP_T(9, true, 128 * rank);  // warpgroup `rank` has the peer's sums
#pragma unroll
        for (int v = 0; v < NACC / 8; ++v) {
            const float4 r = lds4(xbuf + (uint32_t)(v * 128 * 16));
            mine[4 * v] += r.x, mine[4 * v + 1] += r.y, mine[4 * v + 2] += r.z, mine[4 * v + 3] += r.w;
        }
        const int colb = t_begin * BN + 2 * c;
        if constexpr (F16) fix_nonfinite_row<BN>(P, mine, rank, rA, colb, D);
        if (P.dbg_logits != nullptr) {
            float t[NACC];
#pragma unroll
            for (int i = 0; i < NACC; ++i) t[i] = mine[2 * (i >> 2) + (i & 1)];
            store_tile_logits(P.dbg_logits, t, NACC, rA, colb, B, P.N, 1 << rank);
        }
        float m = -INFINITY, sum = 0.f;
        fold_row<BN>(P, mine, m, sum, colb);
        run_m[0] = rank == 0 ? m : -INFINITY, run_s[0] = rank == 0 ? sum : 0.f;
        run_m[1] = rank == 0 ? -INFINITY : m, run_s[1] = rank == 0 ? 0.f : sum;
        V3_STAMP_T(10, true, 128 * rank);  // warpgroup `rank`'s fold done
    }
    V3_STAMP(3, true);  // K loop and last fold done
    finish_cta<NT>(P, run_m, run_s, rA, c != 0 ? 0 : KS == 1 ? 3 : 1 << rank, split, s_wsum, &s_flag);
}

// ------------------------------------------------------------------------------------------------------------
// Host side (CUDA runtime only): tile variants, the plan (path, variant, split count, workspace layout), launch.
// ------------------------------------------------------------------------------------------------------------
typedef void (*WgKernel)(const CUtensorMap, const CUtensorMap, const WgParams);
enum WgKind { WG_PLAIN = 0, WG_PROD = 1, WG_BRES = 2 };

struct WgVariant {
    const char* name;
    int wgs, bn, pd, kh;  // warpgroups per CTA, tile N, prefetch depth (iterations; TMA: raw stages), k8-steps/iteration
    bool tma;             // raw tiles by tensor-map copies (else per-thread loads to registers)
    int kind;             // WG_PLAIN; WG_PROD (a producer warpgroup: 128 more threads); WG_BRES (B tile resident)
    WgKernel kern;
    double eff;      // relative efficiency per output element (narrow wgmma N is assumed less efficient)
    bool automatic;  // considered by the automatic plan
    bool a3d = false;  // WG_BRES: A stages by one 3-D copy (D % 32 == 0 only; the plan checks)
    int ks = 1;        // WG_BRES: CTAs per cluster splitting K (bn is the cluster's tile; one n-tile per cluster;
                       // bn x 256 bytes more shared memory for the exchange)
    bool f16 = false;  // WG_BRES: 3xFP16 products (half the resident tile's bytes; inputs below 65504 in magnitude)
    bool xa = false;   // WG_BRES, ks = 2: all of A resident (KI <= pd), the exchange buffer in the A ring
};

// The automatic plan uses the entries marked automatic: 128 x 40 and 128 x 128 tiles fed by TMA (big problems take
// 128 x 128: less L2 traffic per flop), and the B-resident 128 x 40 kernel wherever it fits (one n-tile per CTA in one
// wave, the tile's hi/lo in shared memory: the seed shape, 2 m-tiles x 64 splits = 128 CTAs; its efficiency 1.0 makes
// it win over the 40-wide TMA kernel there: 19.1-19.3 us against 22.2-22.5 in the twelfth session's bench calls), in
// its 3-D-copy form when D % 32 == 0 (listed first, so it wins the tie), and before that its K-split pairs of 128 x 80
// tiles, 3xFP16 first (the same cost per CTA in the plan's model, so listed first to win the tie where they fit: the
// seed shape, 2 m-tiles x 32 pairs = 128 CTAs).  The bench
// also builds the others (INFONCE_V3_ALL_VARIANTS: the eighth session's register-fed tiles, the B-resident kernel with
// the whole tile split in the prologue, the producer-warpgroup kernel, one-warpgroup CTAs two per SM) to time them;
// the extension does not compile them.  All of them compile without register spills (ptxas -v), and without ptxas's
// "wgmma serialized" warning.
static const WgVariant kWgVariants[] = {
    {"tma_n40_s4", 2, 40, 4, 4, true, WG_PLAIN, infonce_wgmma_kernel<2, 40, 4, 4, true>, 0.85, true},
    {"tma_n128_s3", 2, 128, 3, 4, true, WG_PLAIN, infonce_wgmma_kernel<2, 128, 3, 4, true>, 1.00, true},
    {"f16_bres3d_ks2_n80_s4k1", 2, 80, 4, 4, true, WG_BRES, infonce_wgmma_bres_kernel<80, 4, 1, 2, true, 2, true>, 1.00,
     true, true, 2, true},
    {"f16_bres3d_n40_s2k2", 2, 40, 2, 8, true, WG_BRES, infonce_wgmma_bres_kernel<40, 2, 2, 2, true, 1, true>, 1.00,
     true, true, 1, true},
    {"bres3d_ks2_n80_s2k1", 2, 80, 2, 4, true, WG_BRES, infonce_wgmma_bres_kernel<80, 2, 1, 2, true, 2>, 1.00, true,
     true, 2},
    {"bres3d_n40_s2k2", 2, 40, 2, 8, true, WG_BRES, infonce_wgmma_bres_kernel<40, 2, 2, 2, true>, 1.00, true, true},
    {"bres_n40_s2k2", 2, 40, 2, 8, true, WG_BRES, infonce_wgmma_bres_kernel<40, 2, 2, 2>, 1.00, true},
#ifdef INFONCE_V3_ALL_VARIANTS
    {"bres_n40_s2k2_all", 2, 40, 2, 8, true, WG_BRES, infonce_wgmma_bres_kernel<40, 2, 2, 1024>, 1.00, false},
    {"prod_n40_s4", 2, 40, 4, 4, true, WG_PROD, infonce_wgmma_prod_kernel<40, 4>, 0.85, false},
    {"tma1_n40_s4", 1, 40, 4, 4, true, WG_PLAIN, infonce_wgmma_kernel<1, 40, 4, 4, true>, 0.85, false},
    {"wg2_n40_pd3_k4", 2, 40, 3, 4, false, WG_PLAIN, infonce_wgmma_kernel<2, 40, 3, 4, false>, 0.85, false},
    {"wg2_n128_pd2_k2", 2, 128, 2, 2, false, WG_PLAIN, infonce_wgmma_kernel<2, 128, 2, 2, false>, 1.00, false},
    {"tma_n80_s4", 2, 80, 4, 4, true, WG_PLAIN, infonce_wgmma_kernel<2, 80, 4, 4, true>, 0.95, false},
    {"f16_bres3d_ks2_n80_s2k1", 2, 80, 2, 4, true, WG_BRES, infonce_wgmma_bres_kernel<80, 2, 1, 2, true, 2, true>, 1.00,
     false, true, 2, true},
    {"f16_bres3d_n40_s3k2", 2, 40, 3, 8, true, WG_BRES, infonce_wgmma_bres_kernel<40, 3, 2, 2, true, 1, true>, 1.00,
     false, true, 1, true},
    {"f16_bres3d_ks2_n80_s4k2_xa", 2, 80, 4, 8, true, WG_BRES, infonce_wgmma_bres_kernel<80, 4, 2, 2, true, 2, true, true>,
     1.00, false, true, 2, true, true},
#endif
};
constexpr int kNumWgVariants = (int)(sizeof(kWgVariants) / sizeof(kWgVariants[0]));

// hi/lo B ring (3 slots; TMA: one per stage), TMA raw stages (A and B tiles of 32 floats per row), 1 KB of alignment
// slack.  WG_BRES: two A rings of 64-row stages and the whole BN x D tile as hi/lo (so it depends on D).
inline long long wg_smem_bytes(const WgVariant& v, int D) {
    if (v.kind == WG_BRES) {  // kh / 4 k-tiles per stage; the resident tile is a whole number of stages deep
        const long long kpi = v.kh / 4, ktr = ((D + 32 * kpi - 1) / (32 * kpi) + v.ks - 1) / v.ks * kpi;
        return 2LL * v.pd * kpi * 64 * 128 + ktr * (v.f16 ? 1 : 2) * v.bn * 128 + (v.ks > 1 && !v.xa ? v.bn * 256LL : 0) +
               1024;
    }
    return (v.tma ? v.pd : 3) * 2 * v.bn * 128 + (v.tma ? v.pd * (64 * v.wgs + v.bn) * 128 : 0) + 1024;
}
// Dynamic shared memory a CTA may opt into on sm_90 (227 KB), less a margin for the kernels' static shared memory.
constexpr long long kMaxDynSmem = 227 * 1024 - 512;

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
typedef decltype(&cuTensorMapEncodeTiled) TensorMapEncodeFn;
inline TensorMapEncodeFn tensor_map_encoder() {
    static TensorMapEncodeFn fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            p = nullptr;
        return reinterpret_cast<TensorMapEncodeFn>(p);
    }();
    return fn;
}
// The same rows x D matrix (D % 32 == 0) as [D / 32][rows][32]: a box of box_kt k-tiles of box_rows x 32 floats lands
// in shared memory as box_kt consecutive 2-D boxes (k-tile h at h * box_rows * 128 bytes, the same swizzle).
inline cudaError_t encode_rows_map_3d(CUtensorMap* map, const float* base, int rows, int D, int box_rows, int box_kt) {
    const TensorMapEncodeFn fn = tensor_map_encoder();
    if (fn == nullptr) return cudaErrorNotSupported;
    const cuuint64_t dims[3] = {32u, (cuuint64_t)rows, (cuuint64_t)(D / 32)};
    const cuuint64_t strides[2] = {(cuuint64_t)D * sizeof(float), 32u * sizeof(float)};
    const cuuint32_t box[3] = {32u, (cuuint32_t)box_rows, (cuuint32_t)box_kt};
    const cuuint32_t elem[3] = {1u, 1u, 1u};
    const CUresult r = fn(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, const_cast<float*>(base), dims, strides, box, elem,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}
// rows x D fp32 row-major at base (16-byte aligned, D % 4 == 0), boxes of box_rows x 32 floats, 128-byte swizzle,
// zeros outside the tensor.
inline cudaError_t encode_rows_map(CUtensorMap* map, const float* base, int rows, int D, int box_rows) {
    const TensorMapEncodeFn fn = tensor_map_encoder();
    if (fn == nullptr) return cudaErrorNotSupported;
    const cuuint64_t dims[2] = {(cuuint64_t)D, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)D * sizeof(float)};
    const cuuint32_t box[2] = {32u, (cuuint32_t)box_rows};
    const cuuint32_t elem[2] = {1u, 1u};
    const CUresult r = fn(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<float*>(base), dims, strides, box, elem,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

enum { MODE_AUTO = 0, MODE_LEGACY = 1, MODE_WGMMA = 2 };

struct Plan {
    int path = 1;       // 0 = wgmma kernel, 1 = legacy (fast.py) kernel
    int variant = 0;    // path 0: index into kWgVariants; path 1: 0 = 128x128 tile, 1 = 64x80 tile
    bool vec4 = false;  // 16-byte loads possible (D % 4 == 0 and all three bases 16-byte aligned)
    int S = 1, m_tiles = 1, n_tiles = 1, grid = 1, threads = 0, smem = 0;
    size_t off_pos = 0, off_part = 0, ws_bytes = 0;  // workspace layout (bytes)
    int counters = 1;                                              // zeroed unsigned counters needed
    bool cos_stage = false;  // K split: shared memory holds this CTA's first kCosStaged positive rows of q and p
};

inline size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

// Legacy tile configurations, as fast.py's make_cfg<BIG_ARGS>(1.0) and make_cfg<SMALL_ARGS>(0.7).
struct LegacyCfg {
    int BM, BN, threads, smem;
    double tile_cost;
};
template <int WM, int WN, int MF, int NF, int KSPLIT, int STAGES>
LegacyCfg legacy_cfg(double efficiency) {
    using TL = legacy::Tile<WM, WN, MF, NF, KSPLIT>;
    return LegacyCfg{TL::BM, TL::BN, TL::kThreads, (STAGES * TL::kStageFloats + TL::kRedFloats) * (int)sizeof(float),
                     (double)TL::BM * TL::BN / efficiency};
}

// mode: MODE_AUTO (wgmma when vec4, else legacy), MODE_LEGACY, MODE_WGMMA (legacy anyway when !vec4).
// variant >= 0 forces a wgmma variant (index into kWgVariants); splits > 0 forces S (clamped to the n-tiles).
inline Plan make_plan(int B, int D, int N, bool vec4, int sms, int mode, int variant, int splits) {
    Plan pl;
    pl.vec4 = vec4;
    const bool wg = vec4 && mode != MODE_LEGACY;
    if (wg) {
        double best_t = 1e300;
        if (variant >= kNumWgVariants) variant = -1;
        for (int vi = 0; vi < kNumWgVariants; ++vi) {
            const WgVariant& v = kWgVariants[vi];
            if (variant >= 0 ? vi != variant : !v.automatic) continue;
            const int BM = 64 * v.wgs, per_sm = v.wgs == 1 ? 2 : 1;
            const long long mt = (B + BM - 1) / BM, nt = (N + v.bn - 1) / v.bn;
            if (wg_smem_bytes(v, D) > kMaxDynSmem) continue;
            // B resident: made for small problems, one n-tile per CTA in one wave (each further tile of a CTA is
            // loaded and split in turn, with the loop stopped); with a K split (ks > 1) one n-tile per cluster of ks
            // CTAs, always (forced split counts do not apply), one partial per cluster.
            if (v.kind == WG_BRES && variant < 0 && mt * nt * v.ks > sms) continue;
            // a K split pays for its exchange only with a few k-tiles per CTA (the automatic plan asks for 2 or more)
            if (v.ks > 1 && variant < 0 && (D + 31) / 32 < 2 * v.ks) continue;
            if (v.a3d && D % 32 != 0) continue;
            if (v.xa && ((D + 32 * (v.kh / 4) - 1) / (32 * (v.kh / 4)) + v.ks - 1) / v.ks > v.pd) continue;  // KI <= pd
            const long long s_max = std::min<long long>(nt, 1024);
            for (long long s = 1; s <= s_max; ++s) {  // s: CTAs (clusters) per m-tile
                if (v.ks > 1 ? s != nt : splits > 0 && s != std::min<long long>(splits, s_max)) continue;
                if (v.kind == WG_BRES && variant < 0 && s != nt) continue;
                if (mt * s * v.ks > 0x7fffffffLL) break;
                const long long waves = (mt * s * v.ks + (long long)sms * per_sm - 1) / ((long long)sms * per_sm);
                const long long per_cta = (nt + s - 1) / s;
                const double t = (double)waves * (double)per_cta * BM * v.bn / v.ks / per_sm / v.eff;
                if (t < best_t * 0.97) {  // > 3% better: else fewer splits and earlier variants win near-ties
                    best_t = t;
                    pl.variant = vi;
                    pl.S = (int)s;  // partials per row (K split: one per cluster)
                }
            }
        }
        const WgVariant& v = kWgVariants[pl.variant];
        pl.path = 0;
        pl.m_tiles = (B + 64 * v.wgs - 1) / (64 * v.wgs);
        pl.n_tiles = (N + v.bn - 1) / v.bn;
        pl.threads = 128 * v.wgs + (v.kind == WG_PROD ? 128 : 0);
        pl.smem = (int)wg_smem_bytes(v, D);
        // K split: room for the positive rows that the sending warpgroup reads after its loop, where it fits
        const long long cos_bytes = (long long)kCosStaged * 2 * D * (long long)sizeof(float);
        if (v.kind == WG_BRES && v.ks > 1 && pl.smem + cos_bytes <= kMaxDynSmem)
            pl.smem += (int)cos_bytes, pl.cos_stage = true;
        pl.counters = 1;
    } else {
        const LegacyCfg cfgs[2] = {legacy_cfg<INFONCE_V3_LEGACY_BIG>(1.0), legacy_cfg<INFONCE_V3_LEGACY_SMALL>(0.7)};
        int best_c = 0, best_S = 1;
        double best_t = 1e300;
        for (int ci = 0; ci < 2; ++ci) {
            const long long mt = (B + cfgs[ci].BM - 1) / cfgs[ci].BM, nt = (N + cfgs[ci].BN - 1) / cfgs[ci].BN;
            const long long s_max = std::min<long long>(nt, 1024);
            for (long long s = 1; s <= s_max; ++s) {
                if (splits > 0 && s != std::min<long long>(splits, s_max)) continue;
                if (mt * s > 0x7fffffffLL) break;
                const long long waves = (mt * s + sms - 1) / sms, per_cta = (nt + s - 1) / s;
                const double t = (double)waves * (double)per_cta * cfgs[ci].tile_cost;
                if (t < best_t * 0.97) best_t = t, best_c = ci, best_S = (int)s;
            }
        }
        const LegacyCfg& c = cfgs[best_c];
        pl.path = 1;
        pl.variant = best_c;
        pl.S = best_S;
        pl.m_tiles = (B + c.BM - 1) / c.BM;
        pl.n_tiles = (N + c.BN - 1) / c.BN;
        pl.threads = c.threads;
        pl.smem = c.smem;
        pl.counters = 1;
    }
    const int ks = pl.path == 0 ? kWgVariants[pl.variant].ks : 1;
    pl.grid = (int)std::min<long long>((long long)pl.m_tiles * pl.S * ks, 0x7fffffffLL);
    pl.off_pos = 0;
    pl.off_part = align256((size_t)B * sizeof(double));
    pl.ws_bytes = pl.off_part + align256((size_t)pl.S * B * sizeof(float2));
    return pl;
}

inline const char* plan_name(const Plan& pl) {
    if (pl.path == 0) return kWgVariants[pl.variant].name;
    return pl.variant == 0 ? (pl.vec4 ? "legacy_128x128_v4" : "legacy_128x128_b4")
                           : (pl.vec4 ? "legacy_64x80_v4" : "legacy_64x80_b4");
}

// The launch of a K-split variant (v.ks > 1): clusters of v.ks CTAs along x.  `cluster` is the attribute the
// configuration points at (so it must outlive it).  The bench asks the occupancy API about the same configuration.
inline cudaLaunchConfig_t cluster_launch_config(const WgVariant& v, const Plan& pl, cudaStream_t stream,
                                                cudaLaunchAttribute* cluster) {
    cluster->id = cudaLaunchAttributeClusterDimension;
    cluster->val.clusterDim.x = (unsigned)v.ks, cluster->val.clusterDim.y = 1, cluster->val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)pl.grid), cfg.blockDim = dim3((unsigned)pl.threads);
    cfg.dynamicSmemBytes = (size_t)pl.smem, cfg.stream = stream;
    cfg.attrs = cluster, cfg.numAttrs = 1;
    return cfg;
}

// Raise a kernel's dynamic shared memory limit to `smem` once per device (done[dev] = the largest set so far: the
// BRES kernels' smem grows with D).
template <class K>
inline cudaError_t set_smem_once(K kern, int smem, int (&done)[64]) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev >= 0 && dev < 64 && done[dev] >= smem) return cudaSuccess;
    e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess && dev >= 0 && dev < 64) done[dev] = smem;
    return e;
}

template <int WM, int WN, int MF, int NF, int KSPLIT, int STAGES, bool VEC4>
cudaError_t legacy_launch(const Plan& pl, cudaStream_t stream, const float* q, const float* p, const float* n, int B,
                          int D, int N, float scale2, double inv_t, float2* part, double* pos, unsigned* counter,
                          float* out) {
    auto kern = legacy::infonce_fused_kernel<WM, WN, MF, NF, KSPLIT, STAGES, VEC4>;
    static int done[64] = {};
    cudaError_t e = set_smem_once(kern, pl.smem, done);
    if (e != cudaSuccess) return e;
    kern<<<pl.grid, pl.threads, pl.smem, stream>>>(q, p, n, B, D, N, pl.S, pl.n_tiles, scale2, inv_t, part, pos,
                                                   counter, out);
    return cudaGetLastError();
}

// counters: >= pl.counters zeroed unsigned ints (each launch leaves them zero); ws: >= pl.ws_bytes bytes,
// 256-byte aligned.  dbg_logits / dbg_rowloss: optional debug outputs of the wgmma path (nullptr: off).
inline cudaError_t launch(const Plan& pl, const float* q, const float* p, const float* n, int B, int D, int N,
                          double temperature, unsigned* counters, void* ws, float* out, cudaStream_t stream,
                          float* dbg_logits = nullptr, double* dbg_rowloss = nullptr) {
    char* w = static_cast<char*>(ws);
    double* pos = reinterpret_cast<double*>(w + pl.off_pos);
    float2* part = reinterpret_cast<float2*>(w + pl.off_part);
    const double inv_t = 1.0 / temperature;
    const float scale2 = (float)(1.4426950408889634074 / temperature);  // log2(e) / T
    if (pl.path == 0) {
        static int done[kNumWgVariants][64] = {};
        const WgVariant& v = kWgVariants[pl.variant];
        cudaError_t e = set_smem_once(v.kern, pl.smem, done[pl.variant]);
        if (e != cudaSuccess) return e;
        WgParams P;
        P.q = q, P.p = p, P.n = n;
        P.B = B, P.D = D, P.N = N, P.S = pl.S, P.n_tiles = pl.n_tiles;
        P.scale2 = scale2, P.inv_t = inv_t, P.inv_b = 1.0 / B;
        P.part = part, P.pos = pos, P.counters = counters, P.out = out;
        P.dbg_logits = dbg_logits, P.dbg_rowloss = dbg_rowloss;
        P.cos_stage = pl.cos_stage ? 1 : 0;
        CUtensorMap tmA = {}, tmB = {};
        if (v.tma) {
            // BRES: a box per warpgroup (A3D: of kh / 4 k-tiles)
            e = v.a3d ? encode_rows_map_3d(&tmA, q, B, D, 64, v.kh / 4)
                      : encode_rows_map(&tmA, q, B, D, v.kind == WG_BRES ? 64 : 64 * v.wgs);
            if (e == cudaSuccess) e = encode_rows_map(&tmB, n, N, D, v.bn);
            if (e != cudaSuccess) return e;
        }
        if (v.ks == 1) {
            v.kern<<<pl.grid, pl.threads, pl.smem, stream>>>(tmA, tmB, P);
            return cudaGetLastError();
        }
        cudaLaunchAttribute cluster;
        const cudaLaunchConfig_t cfg = cluster_launch_config(v, pl, stream, &cluster);
        return cudaLaunchKernelEx(&cfg, v.kern, tmA, tmB, P);
    }
    if (pl.variant == 0) {
        return pl.vec4 ? legacy_launch<INFONCE_V3_LEGACY_BIG, true>(pl, stream, q, p, n, B, D, N, scale2, inv_t, part,
                                                                    pos, counters, out)
                       : legacy_launch<INFONCE_V3_LEGACY_BIG, false>(pl, stream, q, p, n, B, D, N, scale2, inv_t,
                                                                     part, pos, counters, out);
    }
    return pl.vec4 ? legacy_launch<INFONCE_V3_LEGACY_SMALL, true>(pl, stream, q, p, n, B, D, N, scale2, inv_t, part,
                                                                  pos, counters, out)
                   : legacy_launch<INFONCE_V3_LEGACY_SMALL, false>(pl, stream, q, p, n, B, D, N, scale2, inv_t, part,
                                                                   pos, counters, out);
}

inline bool can_vec4(const void* q, const void* p, const void* n, int D) {
    return D % 4 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(n) % 16 == 0;
}

}  // namespace infonce_v3
"""

_host_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <vector>

namespace {

// Per-device workspace (leaked on purpose: it must outlive static destruction at interpreter exit).
// counters: zeroed once at allocation; every launch leaves them zero again.  ws: per-launch scratch.
struct DevWorkspace {
    torch::Tensor* counters = nullptr;
    torch::Tensor* ws = nullptr;
};
std::vector<DevWorkspace> g_workspaces;

struct PlanKey {
    int B, D, N, vec4, sms, mode, variant, splits;
    bool operator==(const PlanKey& o) const {
        return B == o.B && D == o.D && N == o.N && vec4 == o.vec4 && sms == o.sms && mode == o.mode &&
               variant == o.variant && splits == o.splits;
    }
};
PlanKey g_plan_key{-1, -1, -1, -1, -1, -1, -1, -1};
infonce_v3::Plan g_plan;

}  // namespace

// mode: 0 = automatic, 1 = fast.py's mma.sync kernels only, 2 = wgmma whenever 16-byte loads are possible.
// variant >= 0 forces a wgmma tile variant, splits > 0 forces the split count (benchmark knobs).
torch::Tensor infonce_fast_v3(torch::Tensor query, torch::Tensor positive, torch::Tensor negatives, double temperature,
                              int64_t mode, int64_t variant, int64_t splits) {
    TORCH_CHECK(query.is_cuda() && positive.is_cuda() && negatives.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(query.scalar_type() == torch::kFloat32 && positive.scalar_type() == torch::kFloat32 &&
                negatives.scalar_type() == torch::kFloat32, "inputs must be float32");
    TORCH_CHECK(query.dim() == 2 && positive.dim() == 2 && negatives.dim() == 2, "inputs must be 2-D");
    TORCH_CHECK(positive.sizes() == query.sizes(), "query and positive must have the same shape");
    TORCH_CHECK(negatives.size(1) == query.size(1), "negatives must have the query's feature dim");
    const c10::cuda::CUDAGuard device_guard(query.device());
    query = query.contiguous();
    positive = positive.contiguous();
    negatives = negatives.contiguous();
    const int64_t B64 = query.size(0), D64 = query.size(1), N64 = negatives.size(0);
    TORCH_CHECK(B64 > 0 && N64 > 0 && D64 > 0, "empty inputs are not supported");
    TORCH_CHECK(B64 < (1LL << 30) && N64 < (1LL << 30) && D64 < (1LL << 30), "sizes too large");
    const int B = (int)B64, D = (int)D64, N = (int)N64;
    const float *qp = query.data_ptr<float>(), *pp = positive.data_ptr<float>(), *np = negatives.data_ptr<float>();

    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const PlanKey key{B, D, N, (int)infonce_v3::can_vec4(qp, pp, np, D), sms, (int)mode, (int)variant, (int)splits};
    if (!(key == g_plan_key)) {
        g_plan = infonce_v3::make_plan(B, D, N, key.vec4 != 0, sms, key.mode, key.variant, key.splits);
        g_plan_key = key;
    }
    const infonce_v3::Plan& pl = g_plan;

    const int dev = query.get_device();
    if ((int)g_workspaces.size() <= dev) g_workspaces.resize(dev + 1);
    DevWorkspace& w = g_workspaces[dev];
    auto opts = query.options();
    if (w.counters == nullptr || w.counters->numel() < pl.counters) {
        const int64_t n = std::max<int64_t>(pl.counters, 64);
        delete w.counters;  // stream-ordered reuse by the caching allocator: launches are on one stream
        w.counters = new torch::Tensor(torch::zeros({n}, opts.dtype(torch::kInt32)));
    }
    if (w.ws == nullptr || (size_t)w.ws->numel() < pl.ws_bytes) {
        const int64_t n = (int64_t)std::max<size_t>(pl.ws_bytes, (size_t)1 << 16);
        delete w.ws;
        w.ws = new torch::Tensor(torch::empty({n}, opts.dtype(torch::kUInt8)));
    }

    auto out = torch::empty({}, opts);
    const cudaError_t err = infonce_v3::launch(pl, qp, pp, np, B, D, N, temperature,
                                               reinterpret_cast<unsigned*>(w.counters->data_ptr<int>()),
                                               w.ws->data_ptr(), out.data_ptr<float>(),
                                               at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "infonce_fast_v3 launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="infonce_fast_v3",
    cpp_sources=_cpp_src,
    cuda_sources=_kernel_src + _host_src,
    functions=["infonce_fast_v3"],
    # wgmma needs the arch-specific sm_90a target; with an arch flag here torch adds none of its own.
    extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"],
    verbose=False,
)

# Knobs (benchmarks): MODE 0 = automatic, 1 = fast.py's kernels only, 2 = wgmma whenever possible;
# VARIANT >= 0 forces a wgmma tile variant; SPLITS > 0 forces the split count.
MODE, VARIANT, SPLITS = 0, -1, 0


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.temperature = TEMPERATURE

    def forward(self, query: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        return _ext.infonce_fast_v3(query, positive, negatives, float(self.temperature), MODE, VARIANT, SPLITS)
