"""InfoNCE loss on Hopper: a split-precision tensor-core GEMM fused with an online log-sum-exp, one launch.

loss = mean_b softplus(lse_j(<q_b, n_j>/T) - pos_b),  pos_b = cos(q_b, p_b)/T

Design:
  * The logits never touch memory.  Each CTA computes a tile of <q_b, n_j> for a contiguous range of n-tiles (a
    split of the N axis) and folds every finished n-tile into a running per-row (max, sum of exp2) of the logits.
    Each CTA (or cluster) writes one (max, sum) per row; the last CTA of the grid (an acq_rel ticket) merges them
    in split order with the positive cosines (computed by the CTAs of each m-tile) into softplus terms and adds
    the rows in a fixed order.  Deterministic, no spin waits on other CTAs; the ticket resets itself.
  * fp32 accuracy from 16-bit-mantissa tensor cores: each operand is split into hi + lo and every dot product is
    a_lo.b_hi + a_hi.b_lo + a_hi.b_hi with fp32 accumulation.  3xTF32: hi = rn_tf32(x), lo = rn_tf32(x - hi),
    |x - hi - lo| <= 2^-22 |x|.  3xFP16: hi = rn_f16(x), lo = rn_f16((x - hi) 2^11) (the 2^11 keeps lo out of
    fp16's subnormals; the cross products go to a second accumulator, scaled back by 2^-11), the same bound for
    every |x| < 65520; a row holding an input beyond that (or inf, NaN) gets non-finite dot products, which are
    recomputed in fp32 from global memory (slow, never wrong).
  * The plan (host, cached per shape and SM count) picks by a wave model:
      - the B-resident kernel (3xFP16 wgmma, clusters of 2 CTAs splitting K, each CTA's half of its 128 x 80
        negatives tile split once into shared memory) when every cluster has exactly one n-tile in one wave, the
        tile fits in shared memory, D % 32 == 0 and each CTA has 2 or more k-tiles: the seed shape;
      - else the TMA kernel (3xTF32 wgmma, 128 x 40 or 128 x 128 tiles, both operands streamed by tensor-map
        copies through a ring of stages and split in the K loop): big problems;
      - the mma.sync kernel (3xTF32, 64 x 80 tiles, 4-byte copies) when 16-byte loads are impossible: D % 4 != 0
        or a base that is not 16-byte aligned.
  * The device code and the plan/launch (`_kernel_src`) use no torch headers: benchmarks/standalone/infonce_bench.cu
    compiles the same string and calls the same make_plan() and launch().
The workspace and its ticket are persistent per device: do not run this op concurrently on two streams of one
device.  Built for sm_90a only (wgmma, TMA, clusters): it runs on H100/H200-class GPUs and nowhere else.
"""
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

TEMPERATURE = 0.1  # overridden per shape (same name as the reference module constant)

_cpp_src = ("torch::Tensor infonce_wgmma_fused(torch::Tensor query, torch::Tensor positive, torch::Tensor negatives, "
            "double temperature);")

# PTX helpers shared with other problems' solutions (mbarriers, exp2): put before _kernel_src.
_ptx_src = (Path(__file__).resolve().parents[1] / "_ptx.cuh").read_text()

# Device code and the plain-C++ plan/launch (no torch headers; it follows _ptx_src), shared with the standalone bench.
_kernel_src = r"""
// ============================================================================================================
// InfoNCE device code and its plain-C++ plan/launch (no torch headers: benchmarks/standalone/infonce_bench.cu
// compiles this same string).  Needs sm_90a (wgmma).  Two paths:
//   * wgmma (16-byte-loadable inputs): infonce_wgmma_kernel (TMA-fed 3xTF32) or infonce_wgmma_bres_kernel
//     (B-resident 3xFP16 K-split pairs), each fused with an online log-sum-exp and a one-ticket merge;
//   * mma_sync::infonce_fused_kernel: mma.sync 3xTF32 with 4-byte copies, for D % 4 != 0 or misaligned bases.
// make_plan() picks the path, the tile and the split count; launch() runs it.
// ============================================================================================================
#include <cuda.h>  // CUtensorMap and cuTensorMapEncodeTiled's prototype (called through the runtime's entry point)
#include <cuda_runtime.h>
#include <stdint.h>
#include <stddef.h>
#include <math.h>
#include <algorithm>

namespace wgmma_fused {

// ------------------------------------------------------------------------------------------------------------
// mma.sync path: inputs that 16-byte loads cannot read (D % 4 != 0 or a base not 16-byte aligned).
// ------------------------------------------------------------------------------------------------------------
namespace mma_sync {

constexpr int BK = 32;

// hi = tf32 round-to-nearest (ties away) of x, lo = the same rounding of x - hi (exact in fp32); both have
// their low 13 bits cleared, so the tensor core's treatment of those bits does not matter.
__device__ __forceinline__ void split_tf32(uint32_t xbits, uint32_t& hi, uint32_t& lo) {
    const uint32_t h = (xbits + 0x1000u) & 0xffffe000u;
    const float r = __uint_as_float(xbits) - __uint_as_float(h);
    hi = h;
    lo = (__float_as_uint(r) + 0x1000u) & 0xffffe000u;
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

// The kernel.  CTA = KSPLIT x WM x WN warps over a BM x BN tile of the logits (each warp MF x NF m16n8 fragments;
// the KSPLIT warp groups take different k8-steps of each k-tile and add their accumulators through shared memory at
// the end of each n-tile).  The CTA walks a contiguous range of n-tiles (split-N: split = blockIdx.x / m_tiles) and,
// inside each, K in k-tiles of BK floats: STAGES - 1 k-tiles of A and B in flight by cp.async (4-byte copies, zeros
// outside the tensors), read back by ldmatrix and split into tf32 hi/lo in registers; each k8-step issues three
// mma.sync (a_lo.b_hi, a_hi.b_lo, a_hi.b_hi).  After each n-tile the accumulators are scaled by log2(e)/T, masked
// at N and folded into a running per-row (max, sum of exp2); each CTA writes one (max, sum) per row to
// part[split][row].  The positive cosines are computed by the CTAs of each m-tile (rows split + S w + ...) while the
// first copies are in flight.  The last CTA of the grid (a fenced atomic ticket) merges every row's partials in
// split order, in double, forms softplus(lse - pos) and sums the rows in a fixed order (deterministic); it resets
// the ticket.
template <int WM, int WN, int MF, int NF, int KSPLIT, int STAGES>
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

    // Stage loader: one 4-byte copy per element (any D, any alignment), zeros past B, N and D; the same
    // swizzled layout as 16-byte chunks would have (chunk k / 4 of row r at chunk position (k / 4) ^ (r & 7)).
    int ld_kt = 0, ld_tile = t_begin, ld_stage = 0;
    auto load_stage = [&](int it) {
        if (it < total) {
            const int col0 = ld_tile * BN, k0 = ld_kt * BK;
            float* st = smem + ld_stage * STAGE;
            for (int c = tid; c < (BM + BN) * BK; c += NT) {
                const int r = c / BK, k = c % BK, gk = k0 + k;
                const bool isA = r < BM;
                const int grow = isA ? row0 + r : col0 + (r - BM);
                const float* base = isA ? q : neg;
                const bool ok = grow < (isA ? B : N) && gk < D;
                cp_async4(smem_addr(st + r * BK + ((((k >> 2) ^ (r & 7)) << 2) | (k & 3))),
                          ok ? base + (size_t)grow * D + gk : base, ok);
            }
            if (++ld_stage == STAGES) ld_stage = 0;
            if (++ld_kt == KT) {
                ld_kt = 0;
                ++ld_tile;
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
#pragma unroll 4
        for (int k = lane; k < D; k += 32) {
            const float a = __ldg(qr + k), b = __ldg(pr + k);
            dot = fmaf(a, b, dot);
            qq = fmaf(a, a, qq);
            pp = fmaf(b, b, pp);
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
        const uint32_t st = smem_addr(smem + rd_stage * STAGE);
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

// The tile: 1 x 2 warps (WM x WN) of 4 x 5 m16n8 fragments (MF x NF), a 64 x 80 tile; the 8 k8-steps of a
// k-tile shared by 4 warp groups (KSPLIT, their partial accumulators added through shared memory at the end of
// each n-tile); 6 stages of cp.async copies in flight.
constexpr int kWM = 1, kWN = 2, kMF = 4, kNF = 5, kKSplit = 4, kStages = 6;
using TileCfg = Tile<kWM, kWN, kMF, kNF, kKSplit>;

}  // namespace mma_sync

// ------------------------------------------------------------------------------------------------------------
// wgmma path: shared pieces.
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
    int cos_stage;      // B-resident kernel: the launch has room for the staged positive rows (cosines_after_loop)
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
// Barrier `id` (1..15; 0 is __syncthreads's) for `count` threads of the CTA (each warpgroup of the B-resident kernel).
__device__ __forceinline__ void bar_sync_named(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ unsigned atom_add_acq_rel_gpu(unsigned* p, unsigned v) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
// 3xTF32 split: hi = tf32 round-to-nearest-even of x (cvt.rn.tf32.f32 is one F2FP instruction on sm_90; the mask
// makes hi's low 13 bits exactly zero, so x - hi below is the exact remainder of the value the tensor core uses),
// lo = the same rounding of x - hi (exact in fp32).  lo's low bits need no mask: whether the tensor core ignores
// them or not, lo is rn_tf32(x - hi) or closer to x - hi.  |x - hi| <= 2^-11 |x|, |x - hi - lo| <= 2^-11 |x - hi|
// <= 2^-22 |x|.
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
// fix_nonfinite_row recomputes those dot products in fp32.
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

// Predicated forms: ptxas serialises the wgmma pipeline when a register that feeds it is written in a divergent
// path, so the kernels predicate instead of branching near it.
__device__ __forceinline__ void st_smem_u32_if(uint32_t addr, uint32_t v, bool on) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p st.shared.u32 [%0], %1;\n}\n"
                 ::"r"(addr), "r"(v), "r"((int)on) : "memory");
}
__device__ __forceinline__ void prefetch_l2_if(const void* p, bool on) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %1, 0;\n @p prefetch.global.L2 [%0];\n}\n" ::"l"(p), "r"((int)on));
}

// mbarrier and TMA (tensor) copies (mbar_init, mbar_arrive_expect_tx and mbar_try are solutions/_ptx.cuh's).
// The same wait with acquire at cluster scope: for an mbarrier that a peer CTA's st.async stores complete on.
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
// 3-D tile copy: the B-resident kernel's A stage of KPI k-tiles in one copy (the query matrix seen as [k-tile][row][32]).
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
// Thread-block clusters (the B-resident kernel's K-split pairs): a peer CTA's address of a shared-memory location, and a 16-byte
// store there.
__device__ __forceinline__ uint32_t cluster_peer_addr(uint32_t addr, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
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

// wgmma.mma_async m64nNk8 f32 += tf32 * tf32 (Wgmma<N>) or m64nNk16 f32 += f16 * f16 (WgmmaF16<N>), B K-major: A from
// registers (4 per thread), B from a smem descriptor, scale-d from a register (0: the product starts the accumulator),
// the N / 2 accumulators in d.  WG_ACC<n> / WG_REGS<n>: the accumulator operands and their register list.
#define WG_ACC20 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
#define WG_ACC40 WG_ACC20, "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), \
    "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), \
    "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
#define WG_ACC64 WG_ACC40, "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), \
    "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), \
    "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), \
    "+f"(d[62]), "+f"(d[63])
#define WG_REGS20 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19}"
#define WG_REGS40 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}"
#define WG_REGS64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
    "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, " \
    "%60, %61, %62, %63}"
// NAME<N>::mma with NACC = N / 2 accumulators: SHAPE the instruction, A / DESC / PRED its operand numbers (after the
// NACC accumulators), TAIL what follows the scale-d predicate and the A and B scales (f16: B's transpose flag).
#define WG_MMA(NAME, N, NACC, SHAPE, REGS, ACC, A, DESC, PRED, TAIL)                                             \
    template <> struct NAME<N> {                                                                                  \
        static __device__ __forceinline__ void mma(float (&d)[NACC], uint32_t a0, uint32_t a1, uint32_t a2,       \
                                                   uint32_t a3, uint64_t desc_b, int scale_d) {                    \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                         \
                         "wgmma.mma_async.sync.aligned." SHAPE " " REGS ", " A ", " DESC ", p, 1, 1" TAIL ";\n}\n" \
                         : ACC                                                                                     \
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(scale_d)                           \
                         : "memory");                                                                              \
        }                                                                                                         \
    };
template <int N>
struct Wgmma;
template <int N>
struct WgmmaF16;
WG_MMA(Wgmma, 40, 20, "m64n40k8.f32.tf32.tf32", WG_REGS20, WG_ACC20, "{%20, %21, %22, %23}", "%24", "%25", "")
WG_MMA(Wgmma, 128, 64, "m64n128k8.f32.tf32.tf32", WG_REGS64, WG_ACC64, "{%64, %65, %66, %67}", "%68", "%69", "")
WG_MMA(WgmmaF16, 80, 40, "m64n80k16.f32.f16.f16", WG_REGS40, WG_ACC40, "{%40, %41, %42, %43}", "%44", "%45", ", 0")

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

// One committed batch: KH k8-steps x the three products a_lo.b_hi, a_hi.b_lo, a_hi.b_hi (small terms first) into acc.
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

// 3xFP16 (the B-resident kernel).  The K permutation for k16-steps: wgmma column j (0..15) of step s of a
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
// only a slow one.
// Row and column of element i of a thread's n-tile accumulator (the wgmma m64nN f32 layout: element 4j + 2h + e is row
// rA + 8h, column colb + 8j + e).
__device__ __forceinline__ int acc_row(int i, int rA) { return rA + 8 * ((i >> 1) & 1); }
__device__ __forceinline__ int acc_col(int i, int colb) { return colb + 8 * (i >> 2) + (i & 1); }
__device__ __forceinline__ float fp32_dot(const float* a, const float* b, int D) {
    float s = 0.f;
    for (int k = 0; k < D; ++k) s = fmaf(a[k], b[k], s);
    return s;
}
// The slow path out of line, on a copy of the dot products in local memory: inlined, its dot-product loops would put
// about 140 KB of code between the check and the fold, and the hot path's jump over them would land on code no SM has
// fetched yet.
__device__ __noinline__ void recompute_nonfinite(const float* q, const float* n, float* tot, int n_acc, int rA, int colb,
                                                 int B, int N, int D) {
    for (int i = 0; i < n_acc; ++i) {
        const int row = acc_row(i, rA), col = acc_col(i, colb);
        if (!isfinite(tot[i]) && row < B && col < N) tot[i] = fp32_dot(q + (size_t)row * D, n + (size_t)col * D, D);
    }
}
// One row's BN / 4 dot products (x[2j + e]: row rA + 8h, column colb + 8j + e).
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

// A thread's raw pieces of one k-tile, read back from a TMA stage:
//   x, y: this thread's query rows rA and rA + 8, floats 8c + 0 .. 7 of the k-tile;
//   b:    its negatives items, the same floats.
// The tf32 hi/lo fragments are built from them inside the iteration (not loop-carried).
template <int BPER>
struct Stage {
    float4 x[2], y[2];
    float4 b[BPER][2];
};


// ---- the wgmma kernels' prologue and epilogue pieces ---------------------------------------------------------
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

// The K-split pair: the positive cosines of this CTA's rows (those of positive_cosines: rows split + S j of [row0, row0 + BM))
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

// 2^x by the MUFU alone (exp2f adds a rescale for results below 2^-126): the same 2-ulp approximation, subnormal
// results flushed to zero, which in a sum of terms 2^(v - max) with one term equal to 1 changes nothing; 2^-inf = 0.
// fold_row's slow case: x[i] (column colb + 8 (i >> 1) + (i & 1)) times f, or -inf past column N.
__device__ __noinline__ void mask_row(float* x, int nv, int colb, int N, float f) {
    for (int i = 0; i < nv; ++i) x[i] = colb + 8 * (i >> 1) + (i & 1) < N ? f * x[i] : -INFINITY;
}
// Fold one row of a finished n-tile (x[2j + e]: column colb + 8j + e, colb = tile * BN + 2c) into the row's running
// (max, sum of exp2) of the logits x * scale2 (scale2 = log2(e)/T), masked at N.  The quad (4 lanes of a row)
// shares the max.  Since the scale is positive and rounding is monotone, the max of the scaled logits
// is the scaled max of the raw dot products, and each term is one FFMA and one ex2: 4 instructions per element
// instead of 7.  Only a ragged tile (columns past N) or a scale that is not positive (T <= 0, T = inf, NaN) takes the
// masking block first (negative: the signs of x and of the scale flipped, which is exact; zero: every logit 0).
// Partial maxima and sums in 4 independent chains: this runs once per tile on one warp per SM sub-partition, so its
// time is its dependency chain.
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
        float t[NV];  // (out of line on a copy, as recompute_nonfinite: one copy of the fold's code)
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
    // Branch-free: with no valid column yet, m_new = -inf, every term is ex2(-inf) = 0 and the state stays
    // (-inf, 0).
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    float sa[4] = {run_s * ex2(run_m - m_use), 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < NV; ++i) sa[i & 3] += ex2(fmaf(x[i], s2, -m_use));
    run_s = (sa[0] + sa[1]) + (sa[2] + sa[3]);
    run_m = m_new;
}

// Fold a finished n-tile's accumulator (wgmma m64nBN f32 layout: this thread holds rows rA, rA + 8 of its warp's 16,
// columns colb + 8j + {0,1}: element 4j + 2h + e) into the running (max, sum of exp2) of its two rows.
template <int BN>
__device__ __forceinline__ void fold_tile(const WgParams& P, const float (&acc)[BN / 2], float (&run_m)[2],
                                          float (&run_s)[2], int rA, int colb) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float x[BN / 4];
#pragma unroll
        for (int i = 0; i < BN / 4; ++i) x[i] = acc[4 * (i >> 1) + 2 * h + (i & 1)];
        fold_row<BN>(P, x, run_m[h], run_s[h], colb);
    }
}

// The end of the wgmma kernels: write this CTA's per-row (max, sum) partials; the last CTA of the grid (one
// acq_rel ticket) merges every row and writes the mean loss.  NT = threads per CTA (all of them take part in the
// barriers and the merge).
template <int NT>
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
    // reads (through L2, ld.cg) after the other CTAs' tickets.  No separate gpu-scope fences (MEMBAR.SC.GPU): the
    // atomic's acq_rel semantics are the whole of the ordering.
    __syncthreads();
    if (tid == 0) *s_flag = atom_add_acq_rel_gpu(P.counters, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!*s_flag) return;

    // Thread t owns rows t, t + NT, ...: it merges a row's S partials in split order, kMergeChunk loads in flight
    // (two rounds at the seed shape), into a (max, sum) with the sum in float.  This code runs once per launch on
    // one SM, so it starts with a cold instruction cache: it is kept short (rolled loops, no double-precision
    // library calls); its instruction fetches matter more than its arithmetic.
    // Numerics: the sum is of S positive terms, so in float it is within about S x 2^-24 relative of the exact sum
    // (8e-6 at S = 132; the plan's S stays near the SM count), and the loss's relative error from a relative error e
    // of the sum is at most e (a log, then softplus, whose slope is below 1): far inside the 1e-4 tolerance.  The
    // merged sum is >= 1 (the partial holding the row's max
    // contributes exp2(0) * its own sum >= 1), so log2f of it is well conditioned (absolute error ~1e-6 at most);
    // x = lse - pos is formed in double from the exact float max and the double positive logit, and softplus(x) =
    // max(x, 0) + log1p(e^-|x|) keeps full relative accuracy when the loss is tiny (log1pf and expf: ~1e-7).
    constexpr double LN2 = 0.69314718055994530942;
    constexpr int kMergeChunk = 32;  // loads in flight per thread (64: slower, more code on a cold SM)
    // The merge's pointers and sizes in registers: left to itself ptxas may reload them from the kernel parameters
    // (constant bank, cold on this SM) for every load.
    const float2* part = P.part;
    const double* pos = P.pos;
    int nB = B, nS = S;
    asm volatile("" : "+l"(part), "+l"(pos), "+r"(nB), "+r"(nS));
    double tloss = 0.0;
#pragma unroll 1
    for (int row = tid; row < nB; row += NT) {
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
            float sq[4] = {sum * ex2(m - mu), 0.f, 0.f, 0.f};
#pragma unroll
            for (int u = 0; u < kMergeChunk; ++u) sq[u & 3] = fmaf(v[u].y, ex2(v[u].x - mu), sq[u & 3]);
            sum = (sq[0] + sq[1]) + (sq[2] + sq[3]);
            m = mr;
        }
        const double x = ((double)m + (double)log2f(sum)) * LN2 - pv;
        const double loss = (x > 0.0 ? x : 0.0) + (double)log1pf(expf(-fabsf((float)x)));
        tloss += loss;
    }
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
}

// ------------------------------------------------------------------------------------------------------------
// The TMA kernel (any problem size; the plan's choice wherever the B-resident kernel does not fit).
//
// CTA = 2 warpgroups (256 threads); warpgroup w owns query rows [64w, 64w+64) of the CTA's BM = 128 rows and all BN
// columns of each n-tile.  The CTA walks its n-tiles (a contiguous split of the N axis) and, inside each, K in
// k-tiles of 32 floats (one iteration per k-tile, flat over (n-tile, k-tile)).  Thread 0 copies each k-tile's raw A
// (BM x 32) and B (BN x 32) tiles into a ring of PD stages with two tensor-map copies (128-byte swizzle, zeros
// outside the tensors), PD iterations ahead.
//
// Per iteration, every thread:
//   0. waits on the stage's mbarrier and reads its raw pieces back with 16-byte shared loads;
//   1. splits the query (A) fragment into hi/lo tf32 in registers (A is the register operand of wgmma: m64k8 per
//      warpgroup, each thread holds rows g and g+8 of its warp's 16 rows);
//   2. splits its share of the negatives (B) k-tile and stores hi and lo into hi/lo slot it % PD, in the 128-byte
//      swizzled K-major layout wgmma reads through a shared-memory descriptor;
//   3. fence.proxy.async (generic-proxy stores -> async-proxy wgmma reads), __syncthreads; thread 0 then refills
//      the raw stage every thread has just read, for iteration it+PD;
//   4. issues 4 k8-steps x 3 wgmma (a_lo.b_hi, a_hi.b_lo, a_hi.b_hi), commits, and waits for the PREVIOUS
//      iteration's group (wait_group 1), so one batch is always queued behind the running one.
// Slot it % PD (PD >= 3) was last read by the batch of iteration it-PD; every thread waited for that batch (step 4
// of it-PD+1) before the __syncthreads of it-1, so the stores in step 2 never race a wgmma read.  One slot per raw
// stage: in the loop (unrolled by PD) every slot address and descriptor is a constant offset.
//
// K permutation.  A dot product may visit k in any order as long as both operands agree.  Each thread takes
// 8 consecutive floats (two 16-byte loads) per row per k-tile: physical k = 8c + i, i = 0..7, c = lane & 3.
// wgmma's k8-step s, column j (0..7) is mapped to physical k = 8*(j & 3) + 2s + (j >> 2).  With that map:
//   A fragment (a0,a1,a2,a3) = (row g, col c), (row g+8, col c), (row g, col c+4), (row g+8, col c+4)
//       = physical k 8c+2s (rows g, g+8) and 8c+2s+1 (rows g, g+8): registers x[2s], y[2s], x[2s+1], y[2s+1];
//   B element (row n, physical 8c+i) belongs to step s = i>>1, column j = c + 4(i&1), i.e. 16-byte chunk
//       2s + (j>>2) = i, word j&3 = c, so it is stored at  n*128 + ((i ^ (n&7)) << 4) + (c << 2).
// The store pattern is conflict-free (a warp covers 8 consecutive rows x 4 values of c per store).
//
// Epilogue per n-tile (wait_group 0): the accumulator (wgmma m64nN f32 layout: thread holds rows g, g+8 of its
// warp's 16, columns 8j + 2c + {0,1}) is folded into a running per-row (max, sum of exp2) of the logits (fold_row).
// The first wgmma of the next n-tile uses scale-d = 0.  The positive cosines are computed by the CTAs of the m-tile
// while the first copies are in flight; finish_cta merges.
// ------------------------------------------------------------------------------------------------------------
template <int BN, int PD>
__global__ void __launch_bounds__(256, 1)
    infonce_wgmma_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                         const WgParams P) {
    constexpr int NT = 256, BM = 128;
    constexpr int NACC = BN / 2;
    constexpr int BUF = BN * 128;   // bytes of one tf32 copy (hi or lo) of a BN x 32 k-tile
    constexpr int SLOT = 2 * BUF;  // hi then lo; BUF is a multiple of 1024, so every copy is 1024-aligned
    static_assert(PD >= 3, "hi/lo slots: one per raw stage, 3 at least");
    constexpr int BITEMS = BN * 4;  // (row, 8-float chunk) items of a k-tile
    constexpr int BPER = (BITEMS + NT - 1) / NT;
    constexpr int RAW_A = BM * 128, RAW_B = BN * 128;  // bytes of one stage's raw A and B tiles
    static_assert(BN % 8 == 0 && BN >= 8 && BN <= 256, "wgmma N");
    static_assert((NT / 4) % 8 == 0, "a warp's B items must cover 8 consecutive rows");
    extern __shared__ unsigned char smem_raw[];
    __shared__ double s_wsum[NT / 32];
    __shared__ int s_flag;
    __shared__ alignas(8) unsigned long long s_full[PD];  // one mbarrier per raw stage

    const uint32_t sbase = (smem_addr(smem_raw) + 1023u) & ~1023u;  // the host adds 1 KB of slack
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq = warp & 3, g = lane >> 2, c = lane & 3;
    const int B = P.B, D = P.D, S = P.S;
    const int m_tiles = (B + BM - 1) / BM;
    const int mt = blockIdx.x % m_tiles, split = blockIdx.x / m_tiles;  // same-split CTAs adjacent (L2 reuse)
    const int row0 = mt * BM;
    // Balanced contiguous split of the n-tiles, in 32-bit arithmetic (no 64-bit division subroutine: ptxas must
    // see every loop bound as warp-uniform, or it serialises the wgmma pipeline).
    const int t_q = P.n_tiles / S, t_r = P.n_tiles % S;
    const int t_begin = split * t_q + min(split, t_r);
    const int t_end = t_begin + t_q + (split < t_r ? 1 : 0);
    const int KT = (D + 31) / 32;
    const int total = (t_end - t_begin) * KT;

    // A: this thread's fragment rows rA and rA + 8 (physical k 8c + 0..7 of each k-tile).  Rows past B are zeros
    // (the tensor map's fill): they belong to rows that are never written.
    const int rA = row0 + 64 * wg + 16 * wq + g;
    // B: item u = tile row (tid >> 2) + (NT/4) u, physical k 8c + 0..7.  (tid >> 2) & 7 == g: the row's swizzle.
    // Columns past N are zeros too, masked in the fold.
    const int rB0 = tid >> 2;

    // Copy cursor: thread 0 fills raw stage `stage` with the cursor's k-tile (and every thread advances the cursor).
    int ld_kt = 0, ld_tile = t_begin;
    const uint32_t raw0 = sbase + (uint32_t)(PD * SLOT);  // raw stage s at raw0 + s * (RAW_A + RAW_B)
    const uint32_t full0 = smem_addr(&s_full[0]);
    auto tma_issue = [&](int stage) {
        const uint32_t dst = raw0 + (uint32_t)(stage * (RAW_A + RAW_B)), bar = full0 + 8u * (uint32_t)stage;
        if (tid == 0) {
            mbar_arrive_expect_tx(bar, (uint32_t)(RAW_A + RAW_B));
            tma_load_2d(dst, &tmA, ld_kt * 32, row0, bar);
            tma_load_2d(dst + RAW_A, &tmB, ld_kt * 32, ld_tile * BN, bar);
        }
        if (++ld_kt == KT) ld_kt = 0, ++ld_tile;
    };
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < PD; ++s) mbar_init(full0 + 8u * (uint32_t)s, 1u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
#pragma unroll
    for (int s = 0; s < PD; ++s)
        if (s < total) tma_issue(s);

    // Positive term for the rows of this m-tile with row % S == split, while the first copies are in flight.
    positive_cosines(P, row0, BM, split, warp, NT / 32, lane);
    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
    float run_m[2] = {-INFINITY, -INFINITY}, run_s[2] = {0.f, 0.f};

    // Fold the finished n-tile into the running (max, sum of exp2) of rows rA and rA + 8.
    auto fold = [&](int tile) { fold_tile<BN>(P, acc, run_m, run_s, rA, tile * BN + 2 * c); };

    // B store address of item u, chunk i: b_st0 + slot + u rows, ^ (i << 4) (bits 4-6 of the row address are
    // zero, so after | (g << 4) the xor gives + ((i ^ g) << 4)).
    const uint32_t b_st0 = (sbase + (uint32_t)(rB0 * 128 + (c << 2))) | (uint32_t)(g << 4);
    const uint64_t desc0 = sw128_desc(sbase);
    int rd_kt = 0, rd_tile = t_begin;
    for (int it0 = 0; it0 < total; it0 += PD) {
#pragma unroll
        for (int s = 0; s < PD; ++s) {
            if (it0 + s < total) {
                Stage<BPER> st;  // this iteration's pieces, read back from raw stage s
                const uint32_t bar = full0 + 8u * (uint32_t)s, par = (uint32_t)(it0 / PD) & 1u;
                while (!mbar_try(bar, par)) {  // unbounded
                }
                // 128-byte swizzle: 16-byte chunk j of tile row r sits at r * 128 + ((j ^ (r & 7)) << 4); the
                // thread's A rows (rl, rl + 8) and B rows (rB0 + 64 u) all have r & 7 == g.
                const uint32_t ra = raw0 + (uint32_t)(s * (RAW_A + RAW_B));
                const int rl = 64 * wg + 16 * wq + g;
#pragma unroll
                for (int v = 0; v < 2; ++v) {
                    const uint32_t cof = (uint32_t)(((2 * c + v) ^ g) << 4);
                    st.x[v] = lds4(ra + (uint32_t)(rl * 128) + cof);
                    st.y[v] = lds4(ra + (uint32_t)((rl + 8) * 128) + cof);
#pragma unroll
                    for (int u = 0; u < BPER; ++u)  // items past the tile's BN rows read row BN-1 (never stored)
                        st.b[u][v] = lds4(ra + (uint32_t)(RAW_A + min(rB0 + (NT / 4) * u, BN - 1) * 128) + cof);
                }
                // 1. A hi/lo fragments (registers, wgmma's A operand)
                uint32_t ahi[16], alo[16];
                split_a_fragments<4>(st.x, st.y, ahi, alo);
                // 2. B hi/lo into slot s
                store_b_hilo<NT, BITEMS, BUF>(st.b, b_st0 + (uint32_t)(s * SLOT), 0u, tid);
                // 3. make the generic-proxy stores visible to wgmma (async proxy), then to every warp
                fence_proxy_async_smem();
                __syncthreads();
                // every thread has read raw stage s (before the barrier): refill it for iteration it + PD
                if (it0 + s + PD < total) tma_issue(s);
                // 4. 4 k8-steps x 3 products
                issue_3xtf32_batch<BN, 4>(acc, ahi, alo, desc0 + (uint64_t)((s * SLOT) >> 4), 0, (uint64_t)(BUF >> 4),
                                          rd_kt == 0);
                wg_wait<1>();  // the batch of the previous iteration is done (its A fragments are free)
#pragma unroll
                for (int i = 0; i < NACC; ++i) reg_fence(acc[i]);
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
    wg_wait<0>();  // (already done by the last fold; keeps the wgmma pipeline closed on every path)

    finish_cta<NT>(P, run_m, run_s, rA, c == 0 ? 3 : 0, split, s_wsum, &s_flag);
}

// ------------------------------------------------------------------------------------------------------------
// The B-resident kernel (small problems: one n-tile per cluster, one wave; the seed shape).
//
// A cluster of two CTAs (a K-split pair) owns one 128 x BN tile of the logits: CTA (cluster rank) r takes the r-th
// half of K, so each CTA holds its BN x D/2 slice of the negatives resident in shared memory as 3xFP16 hi/lo and
// streams only its half of the query rows.  The CTA splits its B slice once (its first FG k-tiles before the loop,
// the rest at the first iteration that reads them: two CTA barriers in all), so the K loop has no B work and no
// CTA-wide barrier: each warpgroup streams its own 64 query rows through its own ring of PD raw TMA stages (KPI
// k-tiles per stage and iteration, one 3-D tensor copy per stage: D % 32 == 0, the plan checks), splits them in
// registers, syncs its own 128 threads (after which its copy thread may refill the stage) and issues its batch of
// 3 x 2 KPI wgmma.m64nBNk16 (issue_3xf16_batch).  The two warpgroups run free of each other.
// After the loop the pair adds its two halves of every dot product through distributed shared memory: of its two
// rows rA + 8h each thread keeps h = rank and sends the other row's BN / 4 sums to the same thread of the peer by
// st.async (counted on the peer's mbarrier), so every thread of both CTAs folds one row; each row gets one partial
// per cluster.  The positive cosines of the cluster's rows are computed by the sending warpgroup after its loop,
// from rows staged in shared memory where the launch has room (P.cos_stage), while the keeper waits for the peer.
// ------------------------------------------------------------------------------------------------------------
template <int BN, int PD, int KPI, int FG>
__global__ void __launch_bounds__(256, 1)
    infonce_wgmma_bres_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                              const WgParams P) {
    constexpr int KS = 2;  // CTAs per cluster splitting K
    constexpr int NT = 256, BM = 128, NACC = BN / 2;
    // A resident k-tile: one BN x 128-byte slot holding the hi and lo halves, where the raw copy lands
    // (issue_3xf16_batch has the layout).
    constexpr int KT_BYTES = BN * 128;
    constexpr int KS16 = 2 * KPI, AREGS = 4 * KS16;  // k16-steps per iteration; A registers
    constexpr int RAW_K = 64 * 128;   // one warpgroup's raw 64 x 32 query k-tile
    constexpr int RAW_A = KPI * RAW_K;  // one stage: KPI k-tiles
    static_assert(BN % 8 == 0 && BN >= 8 && BN <= 256, "wgmma N");
    static_assert(PD >= 2 && (KPI == 1 || KPI == 2), "stages, k-tiles per stage");
    static_assert(FG % KPI == 0 && FG > 0, "B group 0 is a whole number of iterations");
    extern __shared__ unsigned char smem_raw[];
    __shared__ double s_wsum[NT / 32];
    __shared__ int s_flag;
    __shared__ alignas(8) unsigned long long s_full[2 * PD];  // warpgroup w's stage s: s_full[w * PD + s]
    __shared__ alignas(8) unsigned long long s_bfull[2];  // the raw B tile's copies: k-tiles [0, FG), [FG, KTR)
    __shared__ alignas(8) unsigned long long s_xfull[2];  // the peer's sums for warpgroup w have landed
    __shared__ alignas(8) unsigned long long s_cfull;     // the staged positive rows have landed

    const uint32_t sbase = (smem_addr(smem_raw) + 1023u) & ~1023u;  // the host adds 1 KB of slack
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq = warp & 3, g = lane >> 2, c = lane & 3;
    const int B = P.B, D = P.D, S = P.S;
    const int m_tiles = (B + BM - 1) / BM;
    const int rank = (int)(blockIdx.x % KS), cl = (int)(blockIdx.x / KS);  // 1-D grid, clusters of (KS, 1, 1)
    const int mt = cl % m_tiles, split = cl / m_tiles;  // split: the cluster's partial (S clusters per m-tile)
    // The positive cosines of the m-tile's rows, shared out over its S clusters: its rows [64 rank, 64 rank + 64)
    // to CTA rank of each cluster.
    const int cos_row0 = mt * BM + 64 * rank, cos_rows = BM / KS;
    const int wrow0 = mt * BM + 64 * wg;  // the first of the warpgroup's 64 rows
    const int t_q = P.n_tiles / S, t_r = P.n_tiles % S;  // 32-bit, warp-uniform (see infonce_wgmma_kernel)
    const int t_begin = split * t_q + min(split, t_r);
    const int t_end = t_begin + t_q + (split < t_r ? 1 : 0);
    const int KI = ((D + 32 * KPI - 1) / (32 * KPI) + KS - 1) / KS;  // iterations per n-tile (of this CTA's K range)
    const int KTR = KI * KPI;                         // k-tiles of the resident B tile (past D: zeros)
    const int kofs = rank * KTR;                      // the first k-tile of this CTA's K range
    const int total = (t_end - t_begin) * KI;         // iterations of each warpgroup
    const int rA = wrow0 + 16 * wq + g;
    // Each warpgroup receives half of its accumulator from the peer, XBYTES, into an exchange buffer of its own.
    constexpr int XBYTES = 128 * (BN / 4) * 4;

    // Shared memory: the A rings (warpgroup w's stage s at sbase + (w * PD + s) * RAW_A, k-tile h of the stage
    // RAW_K further per h), then the resident B tile (k-tile kt at b_res + kt * KT_BYTES), then the two exchange
    // buffers, then (P.cos_stage) the staged positive rows.
    const uint32_t a_ring = sbase + (uint32_t)(wg * PD * RAW_A);
    const uint32_t b_res = sbase + (uint32_t)(2 * PD * RAW_A);
    const uint32_t full0 = smem_addr(&s_full[wg * PD]);

    // The BN x D/2 negatives slice of n-tile `tile` into b_res as hi/lo, in two steps.  (1) Thread 0 copies k-tile
    // kt's raw BN x 32 box (tensor map, 128-byte swizzle: float 4j + e of row n in 16-byte chunk j at position
    // j ^ (n & 7); zeros past N and past D) into kt's slot, one mbarrier per group: k-tiles [0, FG) and [FG, KTR).
    // (2) Each thread takes items q = (k-tile, row q % BN) of a group: reads the row's 8 raw chunks, then writes its
    // hi and lo chunks in place, so a thread rewrites only the 128 bytes it has read.  Consecutive threads take
    // consecutive rows: the 8 lanes of each 16-byte access phase hit 8 different positions of 8 rows, no bank
    // conflicts.  Group 0 is split in the prologue, group 1 at the start of the first iteration that reads it (a CTA
    // barrier), by which time its copies have landed: most of the tile's memory stream runs under the loop instead
    // of in front of it.
    const int NG = KTR > FG ? 2 : 1;
    auto bbar = [&](int grp) { return smem_addr(&s_bfull[grp]); };
    auto b_copy = [&](int tile, int grp) {  // the copies of one group (thread 0)
        if (tid == 0 && grp < NG) {
            const int k0 = grp == 0 ? 0 : FG, k1 = grp == 0 ? min(FG, KTR) : KTR;
            mbar_arrive_expect_tx(bbar(grp), (uint32_t)((k1 - k0) * KT_BYTES));
#pragma unroll 1
            for (int kt = k0; kt < k1; ++kt)
                tma_load_2d(b_res + (uint32_t)(kt * KT_BYTES), &tmB, (kofs + kt) * 32, tile * BN, bbar(grp));
        }
    };
    // Split group grp (parity: the tile's use of the group's barrier).  With cos_warp0 >= 0 the warps from cos_warp0
    // on first compute the positive cosines.
    auto b_split = [&](int grp, uint32_t parity, int cos_warp0) {
        const int k0 = grp == 0 ? 0 : FG, items = BN * ((grp == 0 ? min(FG, KTR) : KTR) - k0);
        if (cos_warp0 >= 0 && warp >= cos_warp0)
            positive_cosines(P, cos_row0, cos_rows, split, warp - cos_warp0, NT / 32 - cos_warp0, lane);
        while (!mbar_try(bbar(grp), parity)) {  // unbounded, as the A stages
        }
        // One item per thread at a time (more in flight make ptxas spill).
#pragma unroll 1
        for (int q = tid; q < items; q += NT) {
            const int kt = k0 + q / BN, n = q % BN;
            const uint32_t row = b_res + (uint32_t)(kt * KT_BYTES + n * 128);
            float4 f[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) f[j] = lds4(row + (uint32_t)((j ^ (n & 7)) << 4));
            // chunk 2s + h (hi) / 4 + 2s + h (lo), word w: floats 8w + 4s + 2h, +1 = f[2w + s]
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
        }
        fence_proxy_async_smem();  // generic-proxy stores, read by wgmma (async proxy)
        __syncthreads();
    };

    // Warpgroup copy cursor (A does not depend on the n-tile): its thread 0 fills stage `stage` with k-tiles
    // ld_kt .. ld_kt + KPI - 1 of the warpgroup's 64 rows by one 3-D copy (zeros past B and past D, whole boxes
    // included); every thread advances the cursor.
    int ld_kt = 0;
    auto tma_issue = [&](int stage) {
        if ((tid & 127) == 0) {
            const uint32_t bar = full0 + 8u * (uint32_t)stage, dst = a_ring + (uint32_t)(stage * RAW_A);
            mbar_arrive_expect_tx(bar, (uint32_t)RAW_A);
            tma_load_3d(dst, &tmA, 0, wrow0, kofs + ld_kt, bar);
        }
        ld_kt += KPI;
        if (ld_kt == KTR) ld_kt = 0;
    };
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < 2 * PD; ++s) mbar_init(smem_addr(&s_full[0]) + 8u * (uint32_t)s, 1u);
#pragma unroll 1
        for (int grp = 0; grp < 2; ++grp) mbar_init(bbar(grp), 1u);
#pragma unroll
        for (int w = 0; w < 2; ++w) mbar_init(smem_addr(&s_xfull[w]), 1u);
        mbar_init(smem_addr(&s_cfull), 1u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#pragma unroll
        for (int w = 0; w < 2; ++w) mbar_arrive_expect_tx(smem_addr(&s_xfull[w]), (uint32_t)XBYTES);  // the peer's st.async
    }
    __syncthreads();
    // The peer may arrive on s_xfull only once it is initialised; this arrive is waited for after the K loop.
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    b_copy(t_begin, 0);  // in the order they are needed: B group 0, the first A stages, B group 1
#pragma unroll
    for (int s = 0; s < PD; ++s)
        if (s < total) tma_issue(s);
    b_copy(t_begin, 1);
    // This CTA's first positive rows of q and p (cosines_after_loop), behind every copy the loop waits for, into
    // shared memory after the B tile and the exchange buffers (make_plan adds the room and sets P.cos_stage).
    const uint32_t cos_stage = b_res + (uint32_t)(KTR * KT_BYTES + BN * 256);
    if (NG > 1 && P.cos_stage && tid == 0) {
        const uint32_t bar = smem_addr(&s_cfull), rb = (uint32_t)(D * 4);
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
    // The positive cosines: with one B group, by all warps while group 0's copies are in flight; else after the loop,
    // by the warpgroup that sends its sums to the peer (it waits for nothing then, while the keeper waits and folds),
    // from the rows staged above (cosines_after_loop; the others prefetched into L2 now).  Group 1's split, on the
    // loop's critical path, carries no cosines.
    const bool all_staged = P.cos_stage && S * kCosStaged >= cos_rows;  // (then no prefetch is needed)
    if (NG > 1 && !all_staged) positive_cosines<true>(P, cos_row0, cos_rows, split, warp, NT / 32, lane);
    b_split(0, 0u, NG == 1 ? 0 : -1);

    float acc[NACC], acc_x[NACC];  // acc_x sums the hi.lo products (scaled by 2^11)
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc_x[i] = 0.f;
    float run_m[2] = {-INFINITY, -INFINITY}, run_s[2] = {0.f, 0.f};
    float tot[NACC];  // this CTA's half of the n-tile's dot products, handed over after the loop
    const uint64_t descB = sw128_desc(b_res);
    const int rl = 16 * wq + g;  // the thread's A rows in the warpgroup's box: rl, rl + 8 (both with row & 7 == g)
    int rd_ki = 0, rd_tile = t_begin;
    // Unrolled by two (PD when odd): consecutive iterations' A fragments live in different registers; the stage index
    // is known at run time only.  (Unrolling by PD doubles the loop's code at PD = 4 for no gain.)
    constexpr int UNR = PD % 2 == 0 ? 2 : PD;
    for (int it0 = 0; it0 < total; it0 += UNR) {
#pragma unroll
        for (int s0 = 0; s0 < UNR; ++s0) {
            const int it = it0 + s0, s = it % PD;  // the iteration, its stage
            if (it < total) {
                // The iteration reads B group 1 first: split it.  With one n-tile per cluster that is iteration
                // FG / KPI, so only that unrolled copy carries the split's code: the loop's code is fetched cold after
                // an L2 flush, and every copy of code that never runs is bytes in the way.
                if (s0 == (FG / KPI) % UNR && rd_ki * KPI == FG && NG == 2)
                    b_split(1, (uint32_t)((rd_tile - t_begin) & 1), -1);
                const uint32_t bar = full0 + 8u * (uint32_t)s, par = (uint32_t)(it / PD) & 1u;
                while (!mbar_try(bar, par)) {  // unbounded, as the TMA kernel's
                }
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
                split_a_fragments_f16<KS16>(x, y, ahi, alo);
                bar_sync_named(1 + wg, 128);  // the warpgroup's 128 threads have read stage s
                // the iteration's KPI resident k-tiles, KT_BYTES apart
                const uint64_t dh0 = descB + (uint64_t)((rd_ki * KPI * KT_BYTES) >> 4);
                issue_3xf16_batch<BN, KS16>(acc, acc_x, ahi, alo, dh0, (uint64_t)(KT_BYTES >> 4), rd_ki == 0);
                if (it + PD < total) tma_issue(s);  // refill stage s for iteration it + PD, behind the batch
                wg_wait<1>();  // the previous batch is done (its A fragments are free)
#pragma unroll
                for (int i = 0; i < NACC; ++i) reg_fence(acc[i]);
#pragma unroll
                for (int i = 0; i < NACC; ++i) reg_fence(acc_x[i]);
                if (++rd_ki == KI) {
                    wg_wait<0>();
#pragma unroll
                    for (int i = 0; i < NACC; ++i) reg_fence(acc[i]);
                    // the dot products into tot (a new array: no instruction but a wgmma may define an accumulator
                    // register, or ptxas serialises the wgmma); folded after the loop
#pragma unroll
                    for (int i = 0; i < NACC; ++i) {
                        reg_fence(acc_x[i]);
                        tot[i] = fmaf(acc_x[i], 1.f / 2048.f, acc[i]);
                    }
                    rd_ki = 0;
                    ++rd_tile;
                }
            }
        }
    }
    wg_wait<0>();

    // The pair's sum of its n-tile (one per cluster), folded by rows: of its two rows rA + 8h every thread keeps
    // h = rank and sends the other's BN / 4 dot products to the same thread of the peer (the same rows, the other
    // half of K), which keeps that one.  So both warpgroups of both CTAs fold, one row per thread, and each row
    // has one partial per cluster.  16 bytes per st.async into the exchange buffer of the peer's warpgroup, each
    // store counting its bytes on the peer's s_xfull[wg], whose thread 0 expected all XBYTES at the start.  The
    // receiver waits there (acquire at cluster scope), adds the peer's sums to its own (the same sum of the same two
    // numbers in either CTA) and folds.
    // This warpgroup's exchange buffer (at the same offset in both CTAs), after the B tile; the thread's 16-byte
    // piece v at + v * 128 * 16.
    const uint32_t xbuf = b_res + (uint32_t)(KTR * KT_BYTES + wg * XBYTES) + (uint32_t)((tid & 127) * 16);
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");  // the peer's s_xfull is initialised
    // element 4j + 2h + e of the accumulator is row h's value i = 2j + e
    auto row_dot = [&](int h, int i) -> float { return tot[4 * (i >> 1) + 2 * h + (i & 1)]; };
    const uint32_t dst = cluster_peer_addr(xbuf, 1u - rank);
    const uint32_t pbar = cluster_peer_addr(smem_addr(&s_xfull[wg]), 1u - rank);
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
    if (NG > 1 && wg != rank)  // the sender (with one B group the cosines were computed in the prologue)
        cosines_after_loop(P, cos_row0, cos_rows, split, wq, lane, cos_stage, smem_addr(&s_cfull));
    while (!mbar_try_cluster(smem_addr(&s_xfull[wg]), 0u)) {
    }
#pragma unroll
    for (int v = 0; v < NACC / 8; ++v) {
        const float4 r = lds4(xbuf + (uint32_t)(v * 128 * 16));
        mine[4 * v] += r.x, mine[4 * v + 1] += r.y, mine[4 * v + 2] += r.z, mine[4 * v + 3] += r.w;
    }
    const int colb = t_begin * BN + 2 * c;
    fix_nonfinite_row<BN>(P, mine, rank, rA, colb, D);
    float m = -INFINITY, sum = 0.f;
    fold_row<BN>(P, mine, m, sum, colb);
    run_m[0] = rank == 0 ? m : -INFINITY, run_s[0] = rank == 0 ? sum : 0.f;
    run_m[1] = rank == 0 ? -INFINITY : m, run_s[1] = rank == 0 ? 0.f : sum;
    finish_cta<NT>(P, run_m, run_s, rA, c != 0 ? 0 : 1 << rank, split, s_wsum, &s_flag);
}

// ------------------------------------------------------------------------------------------------------------
// Host side (CUDA runtime only): the tiles, the plan (path, tile, split count, workspace layout), the launch.
// ------------------------------------------------------------------------------------------------------------
typedef void (*WgKernel)(const CUtensorMap, const CUtensorMap, const WgParams);

// The wgmma tiles (BM = 128 query rows, 2 warpgroups), in the plan's order: on a near-tie (within 3%) the earlier
// one and the fewer splits win.  128 x 40 and 128 x 128 TMA tiles (big problems take 128 x 128: less L2 traffic
// per flop), and the B-resident K-split pair of 128 x 80 (one n-tile per cluster, one wave: small problems).
struct WgTile {
    const char* name;
    int bn, pd;     // tile N; raw stages (the TMA kernel: also its hi/lo B slots; the B-resident kernel: per warpgroup)
    bool resident;  // the B-resident K-split pair kernel (clusters of 2 CTAs), else the TMA kernel
    WgKernel kern;
    double eff;     // relative efficiency per output element in the wave model (narrow wgmma N assumed slower)
};
static const WgTile kWgTiles[] = {
    {"tma_n40", 40, 4, false, infonce_wgmma_kernel<40, 4>, 0.85},
    {"tma_n128", 128, 3, false, infonce_wgmma_kernel<128, 3>, 1.00},
    {"resident_pair_n80", 80, 4, true, infonce_wgmma_bres_kernel<80, 4, 1, 2>, 1.00},
};
constexpr int kNumWgTiles = (int)(sizeof(kWgTiles) / sizeof(kWgTiles[0]));
constexpr int kPairCtas = 2;  // CTAs per cluster of the B-resident kernel (they split K)

// TMA kernel: hi/lo B slots and raw A/B stages, one each per stage.  B-resident kernel: two A rings of 64-row
// stages, the CTA's half of the BN x D tile as 3xFP16 hi/lo (a whole number of k-tiles), the two exchange buffers.
// Both: 1 KB of alignment slack.
inline long long wg_smem_bytes(const WgTile& v, int D) {
    if (v.resident) {
        const long long ktr = ((D + 31) / 32 + kPairCtas - 1) / kPairCtas;
        return 2LL * v.pd * 64 * 128 + ktr * v.bn * 128 + v.bn * 256LL + 1024;
    }
    return v.pd * 2 * v.bn * 128 + v.pd * (128 + v.bn) * 128 + 1024;
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

enum { PATH_WGMMA = 0, PATH_MMA_SYNC = 1 };

struct Plan {
    int path = PATH_MMA_SYNC;
    int tile = 0;       // PATH_WGMMA: index into kWgTiles
    int S = 1, m_tiles = 1, n_tiles = 1, grid = 1, threads = 0, smem = 0;  // S: partials per row
    size_t off_pos = 0, off_part = 0, ws_bytes = 0;  // workspace layout (bytes)
    bool cos_stage = false;  // B-resident: shared memory holds this CTA's first kCosStaged positive rows of q and p
};

inline size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

// The mma.sync kernel's launch shape and its cost per tile in the wave model.
constexpr int kMmaSyncThreads = mma_sync::TileCfg::kThreads;
constexpr int kMmaSyncSmem =
    (mma_sync::kStages * mma_sync::TileCfg::kStageFloats + mma_sync::TileCfg::kRedFloats) * (int)sizeof(float);
constexpr double kMmaSyncTileCost = (double)mma_sync::TileCfg::BM * mma_sync::TileCfg::BN / 0.7;

// The launch shape, shared memory and workspace of a path, a tile and a split count S (partials per row: CTAs per
// m-tile, or clusters per m-tile for the B-resident kernel, whose S must be its n-tile count).  make_plan chooses
// them; the standalone bench also forces others.
inline Plan plan_for(int B, int D, int N, int path, int tile, int S) {
    Plan pl;
    pl.path = path;
    pl.S = S;
    int ks = 1;
    if (path == PATH_WGMMA) {
        const WgTile& v = kWgTiles[tile];
        pl.tile = tile;
        pl.m_tiles = (B + 127) / 128;
        pl.n_tiles = (N + v.bn - 1) / v.bn;
        pl.threads = 256;
        pl.smem = (int)wg_smem_bytes(v, D);
        if (v.resident) {
            ks = kPairCtas;
            // room for the positive rows that the sending warpgroup reads after its loop, where it fits
            const long long cos_bytes = (long long)kCosStaged * 2 * D * (long long)sizeof(float);
            if (pl.smem + cos_bytes <= kMaxDynSmem) pl.smem += (int)cos_bytes, pl.cos_stage = true;
        }
    } else {
        pl.m_tiles = (B + mma_sync::TileCfg::BM - 1) / mma_sync::TileCfg::BM;
        pl.n_tiles = (N + mma_sync::TileCfg::BN - 1) / mma_sync::TileCfg::BN;
        pl.threads = kMmaSyncThreads;
        pl.smem = kMmaSyncSmem;
    }
    pl.grid = (int)std::min<long long>((long long)pl.m_tiles * pl.S * ks, 0x7fffffffLL);
    pl.off_pos = 0;
    pl.off_part = align256((size_t)B * sizeof(double));
    pl.ws_bytes = pl.off_part + align256((size_t)pl.S * B * sizeof(float2));
    return pl;
}

// The wave model: for each candidate tile and split count s (CTAs, or clusters, per m-tile), time = waves x
// n-tiles per CTA x tile area / efficiency; a candidate must beat the best so far by more than 3%.  vec4 (16-byte
// loads possible: D % 4 == 0 and 16-byte aligned bases) selects the wgmma path, else the mma.sync kernel.
inline Plan make_plan(int B, int D, int N, bool vec4, int sms) {
    int tile = 0, S = 1;
    double best_t = 1e300;
    if (vec4) {
        for (int vi = 0; vi < kNumWgTiles; ++vi) {
            const WgTile& v = kWgTiles[vi];
            const int ks = v.resident ? kPairCtas : 1;
            const long long mt = (B + 127) / 128, nt = (N + v.bn - 1) / v.bn;
            if (wg_smem_bytes(v, D) > kMaxDynSmem) continue;
            // B resident: one n-tile per cluster of 2 CTAs, all in one wave; the pair's K split pays for its exchange
            // only with 2 or more k-tiles per CTA; its A stages are 3-D copies of whole k-tiles (D % 32 == 0).
            if (v.resident && (mt * nt * ks > sms || (D + 31) / 32 < 2 * ks || D % 32 != 0)) continue;
            const long long s_max = std::min<long long>(nt, 1024);
            for (long long s = 1; s <= s_max; ++s) {
                if (v.resident && s != nt) continue;
                if (mt * s * ks > 0x7fffffffLL) break;
                const long long waves = (mt * s * ks + sms - 1) / sms;
                const long long per_cta = (nt + s - 1) / s;
                const double t = (double)waves * (double)per_cta * 128 * v.bn / ks / v.eff;
                if (t < best_t * 0.97) best_t = t, tile = vi, S = (int)s;  // > 3% better: else fewer splits and
                                                                           // earlier tiles win near-ties
            }
        }
        return plan_for(B, D, N, PATH_WGMMA, tile, S);
    }
    const long long mt = (B + mma_sync::TileCfg::BM - 1) / mma_sync::TileCfg::BM;
    const long long nt = (N + mma_sync::TileCfg::BN - 1) / mma_sync::TileCfg::BN;
    const long long s_max = std::min<long long>(nt, 1024);
    for (long long s = 1; s <= s_max; ++s) {
        if (mt * s > 0x7fffffffLL) break;
        const long long waves = (mt * s + sms - 1) / sms, per_cta = (nt + s - 1) / s;
        const double t = (double)waves * (double)per_cta * kMmaSyncTileCost;
        if (t < best_t * 0.97) best_t = t, S = (int)s;
    }
    return plan_for(B, D, N, PATH_MMA_SYNC, 0, S);
}

inline const char* plan_name(const Plan& pl) {
    return pl.path == PATH_WGMMA ? kWgTiles[pl.tile].name : "mma_sync_64x80";
}

// The launch of the B-resident kernel: clusters of kPairCtas CTAs along x.  `cluster` is the attribute the
// configuration points at (so it must outlive it).
inline cudaLaunchConfig_t cluster_launch_config(const Plan& pl, cudaStream_t stream, cudaLaunchAttribute* cluster) {
    cluster->id = cudaLaunchAttributeClusterDimension;
    cluster->val.clusterDim.x = (unsigned)kPairCtas, cluster->val.clusterDim.y = 1, cluster->val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)pl.grid), cfg.blockDim = dim3((unsigned)pl.threads);
    cfg.dynamicSmemBytes = (size_t)pl.smem, cfg.stream = stream;
    cfg.attrs = cluster, cfg.numAttrs = 1;
    return cfg;
}

// Raise a kernel's dynamic shared memory limit to `smem` once per device (done[dev] = the largest set so far: the
// B-resident kernel's smem grows with D).
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

// counters: one zeroed unsigned int (each launch leaves it zero); ws: >= pl.ws_bytes bytes, 256-byte aligned.
inline cudaError_t launch(const Plan& pl, const float* q, const float* p, const float* n, int B, int D, int N,
                          double temperature, unsigned* counters, void* ws, float* out, cudaStream_t stream) {
    char* w = static_cast<char*>(ws);
    double* pos = reinterpret_cast<double*>(w + pl.off_pos);
    float2* part = reinterpret_cast<float2*>(w + pl.off_part);
    const double inv_t = 1.0 / temperature;
    const float scale2 = (float)(1.4426950408889634074 / temperature);  // log2(e) / T
    if (pl.path == PATH_WGMMA) {
        static int done[kNumWgTiles][64] = {};
        const WgTile& v = kWgTiles[pl.tile];
        cudaError_t e = set_smem_once(v.kern, pl.smem, done[pl.tile]);
        if (e != cudaSuccess) return e;
        WgParams P;
        P.q = q, P.p = p, P.n = n;
        P.B = B, P.D = D, P.N = N, P.S = pl.S, P.n_tiles = pl.n_tiles;
        P.scale2 = scale2, P.inv_t = inv_t, P.inv_b = 1.0 / B;
        P.part = part, P.pos = pos, P.counters = counters, P.out = out;
        P.cos_stage = pl.cos_stage ? 1 : 0;
        CUtensorMap tmA = {}, tmB = {};
        // B resident: a box of one k-tile per warpgroup (64 rows) by 3-D copies; TMA kernel: the CTA's 128 rows
        e = v.resident ? encode_rows_map_3d(&tmA, q, B, D, 64, 1) : encode_rows_map(&tmA, q, B, D, 128);
        if (e == cudaSuccess) e = encode_rows_map(&tmB, n, N, D, v.bn);
        if (e != cudaSuccess) return e;
        if (!v.resident) {
            v.kern<<<pl.grid, pl.threads, pl.smem, stream>>>(tmA, tmB, P);
            return cudaGetLastError();
        }
        cudaLaunchAttribute cluster;
        const cudaLaunchConfig_t cfg = cluster_launch_config(pl, stream, &cluster);
        return cudaLaunchKernelEx(&cfg, v.kern, tmA, tmB, P);
    }
    using namespace mma_sync;
    auto kern = infonce_fused_kernel<kWM, kWN, kMF, kNF, kKSplit, kStages>;
    static int done[64] = {};
    cudaError_t e = set_smem_once(kern, pl.smem, done);
    if (e != cudaSuccess) return e;
    kern<<<pl.grid, pl.threads, pl.smem, stream>>>(q, p, n, B, D, N, pl.S, pl.n_tiles, scale2, inv_t, part, pos,
                                                   counters, out);
    return cudaGetLastError();
}

inline bool can_vec4(const void* q, const void* p, const void* n, int D) {
    return D % 4 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(n) % 16 == 0;
}

}  // namespace wgmma_fused
"""

_host_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <vector>

namespace {

// Per-device workspace (leaked on purpose: it must outlive static destruction at interpreter exit).
// counter: zeroed once at allocation; every launch leaves it zero again.  ws: per-launch scratch.
struct DevWorkspace {
    torch::Tensor* counter = nullptr;
    torch::Tensor* ws = nullptr;
};
std::vector<DevWorkspace> g_workspaces;

struct PlanKey {
    int B, D, N, vec4, sms;
    bool operator==(const PlanKey& o) const {
        return B == o.B && D == o.D && N == o.N && vec4 == o.vec4 && sms == o.sms;
    }
};
PlanKey g_plan_key{-1, -1, -1, -1, -1};
wgmma_fused::Plan g_plan;

}  // namespace

torch::Tensor infonce_wgmma_fused(torch::Tensor query, torch::Tensor positive, torch::Tensor negatives,
                                  double temperature) {
    for (torch::Tensor* t : {&query, &positive, &negatives}) {
        TORCH_CHECK(t->is_cuda() && t->scalar_type() == torch::kFloat32 && t->dim() == 2,
                    "inputs must be 2-D float32 CUDA tensors");
        TORCH_CHECK(t->numel() > 0 && t->size(0) < (1LL << 30) && t->size(1) < (1LL << 30),
                    "inputs must be non-empty, each size below 2^30");
    }
    TORCH_CHECK(positive.sizes() == query.sizes() && negatives.size(1) == query.size(1),
                "positive must have the query's shape and negatives its feature dim");
    const c10::cuda::CUDAGuard device_guard(query.device());
    for (torch::Tensor* t : {&query, &positive, &negatives}) *t = t->contiguous();
    const int B = (int)query.size(0), D = (int)query.size(1), N = (int)negatives.size(0);
    const float *qp = query.data_ptr<float>(), *pp = positive.data_ptr<float>(), *np = negatives.data_ptr<float>();

    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const PlanKey key{B, D, N, (int)wgmma_fused::can_vec4(qp, pp, np, D), sms};
    if (!(key == g_plan_key)) {
        g_plan = wgmma_fused::make_plan(B, D, N, key.vec4 != 0, sms);
        g_plan_key = key;
    }
    const wgmma_fused::Plan& pl = g_plan;

    const int dev = query.get_device();
    if ((int)g_workspaces.size() <= dev) g_workspaces.resize(dev + 1);
    DevWorkspace& w = g_workspaces[dev];
    auto opts = query.options();
    if (w.counter == nullptr) w.counter = new torch::Tensor(torch::zeros({1}, opts.dtype(torch::kInt32)));
    if (w.ws == nullptr || (size_t)w.ws->numel() < pl.ws_bytes) {
        const int64_t n = (int64_t)std::max<size_t>(pl.ws_bytes, (size_t)1 << 16);
        delete w.ws;  // stream-ordered reuse by the caching allocator: launches are on one stream
        w.ws = new torch::Tensor(torch::empty({n}, opts.dtype(torch::kUInt8)));
    }

    auto out = torch::empty({}, opts);
    const cudaError_t err = wgmma_fused::launch(pl, qp, pp, np, B, D, N, temperature,
                                                reinterpret_cast<unsigned*>(w.counter->data_ptr<int>()),
                                                w.ws->data_ptr(), out.data_ptr<float>(),
                                                at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "infonce_wgmma_fused launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="infonce_wgmma_fused",
    cpp_sources=_cpp_src,
    cuda_sources=_ptx_src + _kernel_src + _host_src,
    functions=["infonce_wgmma_fused"],
    # wgmma needs the arch-specific sm_90a target; with an arch flag here torch adds none of its own.
    extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"],
    verbose=False,
)


class ModelNew(nn.Module):
    """The loss with the module's TEMPERATURE as it is when the model is built (the harness sets it per shape)."""

    def __init__(self):
        super().__init__()
        self.temperature = float(TEMPERATURE)

    def forward(self, query: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        return _ext.infonce_wgmma_fused(query, positive, negatives, self.temperature)
