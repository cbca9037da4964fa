"""Row-wise softmax at the HBM bandwidth limit (H200, sm_90), version 4: rows that fit one SM.

Targets the timing shapes with rows <= 64 KB (8192x16384 fp32, 32768x4096 bf16, 16384x32768 bf16).
Every row lives in REGISTERS of one CTA (no clusters, no shared-memory copy of the row):
  * thread t holds units u = i*THREADS + t (16-byte loads, coalesced), all issued back to back;
  * thread max -> e = 2^(x*log2e - ref_t) (one ex2 per element; for bf16 rows, e is kept as fp16 pairs in
    the packed row's registers (HALF_E), or, RECOMP, recomputed from the packed row at the end: two ex2 per
    element) -> one block reduction of (max, sum) pairs (max by shuffles first, then a single rescale and
    a plain sum) -> scaled stores;
  * PERSISTENT variants: grid = the CTAs that fit; each CTA strides over rows and issues the next
    row's loads (STAGES rows ahead) before the current row's reduction and stores, so per-row fixed
    costs and load latency overlap (matters most for 8 KB rows);
  * cache hints (plain vs ld.global.cs / st.global.cs), threads per row, CTAs per SM are knobs:
    softmax_fast_v4(x, variant, hint, ctas_per_sm), 0 = auto. benchmarks/bench_softmax_v4.py sweeps them.
Rows longer than 64 KB (4096x393216) are cut into segments of one CTA's registers (fp32: 128 threads x 36
16-byte units = 72 KB, 3 CTAs/SM): each CTA publishes its segment's (max, sum) pair, counts itself in, waits
for the row's other segments (their CTAs run beside it) and writes its part; no clusters. Misaligned / odd
widths and narrow rows run v1's kernels (solutions/softmax/fast.py), copied verbatim.
Tried and removed (docs/perf-notes/softmax.md; the code is in git history at c1d0edf): rows split over 2- or
4-CTA clusters (quack's structure), and long rows in two passes with the second read from L2.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# v1 (solutions/softmax/fast.py) kernels, copied verbatim (plus <type_traits>).
_v1_kernels_src = r"""
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cstdint>
#include <type_traits>

namespace cg = cooperative_groups;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMaxThreads = 512;
constexpr int kMaxChunks = 8;

// ---------------------------------------------------------------- small PTX helpers
__device__ __forceinline__ float ex2(float x) {  // 2^x, MUFU; ~2 ulp, well inside the fp32 tolerance
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    } while (!done);
}
// TMA 1-D bulk copy global -> own CTA's smem; completion is signalled on `bar` (tx bytes).
// x is read exactly once, so ask L2 to evict it first.
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
                 : "memory");
}
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }

// ---------------------------------------------------------------- N elements <-> N floats
// kVec units are 16 bytes (4 fp32 / 8 bf16); otherwise one element.
template <typename T, bool kVec> struct Unit { static constexpr int N = kVec ? 16 / (int)sizeof(T) : 1; };

__device__ __forceinline__ void load_unit(const float* p, float (&f)[4]) {
    float4 v = *reinterpret_cast<const float4*>(p);
    f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w;
}
__device__ __forceinline__ void load_unit(const __nv_bfloat16* p, float (&f)[8]) {
    uint4 v = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // bf16 -> fp32 is a 16-bit shift
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ void load_unit(const float* p, float (&f)[1]) { f[0] = *p; }
__device__ __forceinline__ void load_unit(const __nv_bfloat16* p, float (&f)[1]) { f[0] = __bfloat162float(*p); }

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}
// Streaming (evict-first) stores: y is not read again by this kernel.
__device__ __forceinline__ void store_unit(float* p, const float (&f)[4]) {
    __stcs(reinterpret_cast<float4*>(p), make_float4(f[0], f[1], f[2], f[3]));
}
__device__ __forceinline__ void store_unit(__nv_bfloat16* p, const float (&f)[8]) {
    __stcs(reinterpret_cast<uint4*>(p), make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]),
                                                  pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7])));
}
__device__ __forceinline__ void store_unit(float* p, const float (&f)[1]) { __stcs(p, f[0]); }
__device__ __forceinline__ void store_unit(__nv_bfloat16* p, const float (&f)[1]) {
    __stcs(reinterpret_cast<unsigned short*>(p), __bfloat16_as_ushort(__float2bfloat16_rn(f[0])));
}

// ---------------------------------------------------------------- (max, sum) pairs
// m is in the log2 domain (row max * log2e, rounded once), s = sum 2^(x*log2e - m).
// The same rounded m is used for the sum and for the output, so its rounding cancels.
struct MS { float m, s; };

__device__ __forceinline__ MS combine(MS a, MS b) {
    const float m = fmaxf(a.m, b.m);
    // a.m == m also covers -inf == -inf (empty parts), where 2^(a.m - m) would be NaN.
    const float fa = a.m == m ? 1.f : ex2(a.m - m);
    const float fb = b.m == m ? 1.f : ex2(b.m - m);
    return {m, a.s * fa + b.s * fb};
}
__device__ __forceinline__ MS warp_reduce(MS v) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
        MS o{__shfl_xor_sync(0xffffffffu, v.m, off), __shfl_xor_sync(0xffffffffu, v.s, off)};
        v = combine(v, o);
    }
    return v;
}
// Every thread gets the block's pair. One __syncthreads; `scratch` is used once per kernel.
__device__ __forceinline__ MS block_reduce(MS v, MS* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_reduce(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_reduce(lane < nwarps ? scratch[lane] : MS{-INFINITY, 0.f});
}

// Per-thread online accumulator. The rescale exp only runs when the max grows.
struct Acc {
    float m = -INFINITY;  // max seen (x domain)
    float ref = 0.f;      // m*log2e, or 0 while m == -inf so that 2^(-inf - ref) = 0, not NaN
    float s = 0.f;
    template <int N>
    __device__ __forceinline__ void add(const float (&f)[N]) {
        float vm = f[0];
#pragma unroll
        for (int k = 1; k < N; ++k) vm = fmaxf(vm, f[k]);
        if (vm > m) {
            const float nref = vm * kLog2e;
            if (m != -INFINITY) s *= ex2(ref - nref);
            m = vm;
            ref = nref;
        }
#pragma unroll
        for (int k = 0; k < N; ++k) s += ex2(fmaf(f[k], kLog2e, -ref));
    }
    __device__ __forceinline__ MS pair() const { return {m == -INFINITY ? -INFINITY : ref, s}; }
};

// ---------------------------------------------------------------- main kernel
// One cluster of `csize` CTAs per row; CTA `rank` owns units [rank*upc, (rank+1)*upc) of the row,
// kept in dynamic smem between the two passes.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kMaxThreads, 3)
softmax_smem_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t cols, int csize, int upc,
                    int nchunks, int upchunk) {
    constexpr int N = Unit<T, kVec>::N;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    T* buf = reinterpret_cast<T*>(smem_raw);
    __shared__ uint64_t bars[kMaxChunks];
    __shared__ MS warp_ms[kMaxThreads / 32];
    __shared__ MS cta_ms, row_ms;

    const int64_t row = blockIdx.x / csize;
    const int rank = blockIdx.x % csize;  // == cluster block rank for a (csize,1,1) cluster
    const int64_t nunits = cols / N;
    const int64_t u0 = (int64_t)rank * upc;
    const int nu = (int)max((int64_t)0, min((int64_t)upc, nunits - u0));
    const T* src = x + row * cols + u0 * N;
    T* dst = y + row * cols + u0 * N;

    if constexpr (kVec) {
        if (threadIdx.x == 0) {
            for (int c = 0; c < nchunks; ++c) mbar_init(&bars[c], 1);
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            for (int c = 0; c < nchunks; ++c) {
                const int cu = c * upchunk, cn = min(upchunk, nu - cu);
                if (cn <= 0) break;
                mbar_arrive_expect_tx(&bars[c], (uint32_t)cn * 16u);
                bulk_g2s(buf + (int64_t)cu * N, src + (int64_t)cu * N, (uint32_t)cn * 16u, &bars[c]);
            }
        }
        __syncthreads();  // barrier init visible before anyone waits on it
    } else {
#pragma unroll 4
        for (int i = threadIdx.x; i < nu; i += blockDim.x) buf[i] = src[i];
        __syncthreads();
    }

    // Pass 1: online (max, sum) per thread, chunk by chunk as the TMA copies land.
    Acc acc;
    for (int c = 0; c < nchunks; ++c) {
        const int cu = c * upchunk, ce = min(cu + upchunk, nu);
        if (cu >= ce) break;
        if constexpr (kVec) mbar_wait(&bars[c], 0);
#pragma unroll 2
        for (int u = cu + threadIdx.x; u < ce; u += blockDim.x) {
            float f[N];
            load_unit(buf + (int64_t)u * N, f);
            acc.add(f);
        }
    }
    MS r = block_reduce(acc.pair(), warp_ms);

    if (csize > 1) {  // merge the CTAs' pairs through DSMEM
        cg::cluster_group cluster = cg::this_cluster();
        if (threadIdx.x == 0) cta_ms = r;
        cluster.sync();
        if (threadIdx.x < 32) {
            MS p{-INFINITY, 0.f};
            if ((int)threadIdx.x < csize) p = *cluster.map_shared_rank(&cta_ms, (unsigned)threadIdx.x);
            p = warp_reduce(p);
            if (threadIdx.x == 0) row_ms = p;
        }
        __syncthreads();
        r = row_ms;
        cluster_arrive();  // done reading the other CTAs' smem; they may exit once all arrived
    }

    // Pass 2: normalise from smem, stream out.
    const float ml = r.m, inv = 1.f / r.s;
#pragma unroll 2
    for (int u = threadIdx.x; u < nu; u += blockDim.x) {
        float f[N];
        load_unit(buf + (int64_t)u * N, f);
#pragma unroll
        for (int k = 0; k < N; ++k) f[k] = ex2(fmaf(f[k], kLog2e, -ml)) * inv;
        store_unit(dst + (int64_t)u * N, f);
    }
    if (csize > 1) cluster_wait();  // keep cta_ms alive until every CTA has read it
}

// ---------------------------------------------------------------- fallback for huge rows
// Kernel 1: one CTA per (row, chunk) writes the chunk's pair. Kernel 2: merge the row's pairs,
// then write the chunk. x is read twice; only for rows beyond a 16-CTA cluster's smem.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kMaxThreads)
softmax_partial_kernel(const T* __restrict__ x, MS* __restrict__ ws, int64_t cols, int cpr, int upc) {
    constexpr int N = Unit<T, kVec>::N;
    __shared__ MS warp_ms[kMaxThreads / 32];
    const int64_t row = blockIdx.x / cpr;
    const int64_t u0 = (int64_t)(blockIdx.x % cpr) * upc;
    const int nu = (int)max((int64_t)0, min((int64_t)upc, cols / N - u0));
    const T* src = x + row * cols + u0 * N;
    Acc acc;
    for (int u = threadIdx.x; u < nu; u += blockDim.x) {
        float f[N];
        load_unit(src + (int64_t)u * N, f);
        acc.add(f);
    }
    MS r = block_reduce(acc.pair(), warp_ms);
    if (threadIdx.x == 0) ws[blockIdx.x] = r;
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kMaxThreads)
softmax_finalize_kernel(const T* __restrict__ x, T* __restrict__ y, const MS* __restrict__ ws,
                        int64_t cols, int cpr, int upc) {
    constexpr int N = Unit<T, kVec>::N;
    __shared__ MS warp_ms[kMaxThreads / 32];
    const int64_t row = blockIdx.x / cpr;
    MS p{-INFINITY, 0.f};
    for (int i = threadIdx.x; i < cpr; i += blockDim.x) p = combine(p, ws[row * cpr + i]);
    const MS r = block_reduce(p, warp_ms);
    const float ml = r.m, inv = 1.f / r.s;

    const int64_t u0 = (int64_t)(blockIdx.x % cpr) * upc;
    const int nu = (int)max((int64_t)0, min((int64_t)upc, cols / N - u0));
    const T* src = x + row * cols + u0 * N;
    T* dst = y + row * cols + u0 * N;
    for (int u = threadIdx.x; u < nu; u += blockDim.x) {
        float f[N];
        load_unit(src + (int64_t)u * N, f);
#pragma unroll
        for (int k = 0; k < N; ++k) f[k] = ex2(fmaf(f[k], kLog2e, -ml)) * inv;
        store_unit(dst + (int64_t)u * N, f);
    }
}
"""

_v4_kernels_src = r"""
// ================================================================ v4 kernels: rows <= 64 KB in registers
// bit patterns of -inf used to fill predicated-off 16-byte units
template <typename T> struct NegInfBits;
template <> struct NegInfBits<float> { static constexpr uint32_t v = 0xff800000u; };
template <> struct NegInfBits<__nv_bfloat16> { static constexpr uint32_t v = 0xff80ff80u; };

__device__ __forceinline__ void unpack_unit(const uint4& v, float (&f)[4]) {
    f[0] = __uint_as_float(v.x); f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z); f[3] = __uint_as_float(v.w);
}
__device__ __forceinline__ void unpack_unit(const uint4& v, float (&f)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // bf16 -> fp32 is a 16-bit shift
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
// Plain (write-back) 16-byte stores; v1's store_unit is the streaming (.cs) flavour.
__device__ __forceinline__ void store_unit_wb(float* p, const float (&f)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
}
__device__ __forceinline__ void store_unit_wb(__nv_bfloat16* p, const float (&f)[8]) {
    *reinterpret_cast<uint4*>(p) = make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]),
                                              pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7]));
}
// Same as unpack_unit, but opaque to the compiler, so that the recompute passes re-derive the floats
// from the packed row instead of the compiler keeping all of them live (which spills).
__device__ __forceinline__ void unpack_unit_rc(const uint4& v, float (&f)[4]) { unpack_unit(v, f); }
__device__ __forceinline__ void unpack_unit_rc(const uint4& v, float (&f)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint32_t lo, hi;
        asm volatile("shl.b32 %0, %2, 16;\n\tand.b32 %1, %2, 0xffff0000;" : "=r"(lo), "=r"(hi) : "r"(w[i]));
        f[2 * i] = __uint_as_float(lo);
        f[2 * i + 1] = __uint_as_float(hi);
    }
}
template <bool kCs, typename T, int N>
__device__ __forceinline__ void store_unit_h(T* p, const float (&f)[N]) {
    if constexpr (kCs) store_unit(p, f); else store_unit_wb(p, f);
}

// Cache-hint flags (a uniform kernel argument): bit 0 = ld.global.cs loads, bit 1 = st.global.cs stores.
constexpr int kLdCs = 1, kStCs = 2;

// One row's VPT 16-byte units per thread, unit u = i*THREADS + tid (coalesced), all issued back to
// back before any use. Predicated, not branched; units >= lim read as -inf. `volatile` keeps a
// prefetch where it is written (ahead of the current row's reduction), not sunk to its first use.
template <typename T, int THREADS, int VPT, bool kCs>
__device__ __forceinline__ void load_row_h(uint4 (&r)[VPT], const uint4* src, int lim) {
    constexpr uint32_t ni = NegInfBits<T>::v;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int u = i * THREADS + (int)threadIdx.x;
        r[i] = make_uint4(ni, ni, ni, ni);
        if constexpr (kCs)
            asm volatile("{\n .reg .pred p;\n setp.lt.s32 p, %4, %5;\n"
                         " @p ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%6];\n}"
                         : "+r"(r[i].x), "+r"(r[i].y), "+r"(r[i].z), "+r"(r[i].w)
                         : "r"(u), "r"(lim), "l"(src + u));
        else
            asm volatile("{\n .reg .pred p;\n setp.lt.s32 p, %4, %5;\n"
                         " @p ld.global.v4.u32 {%0, %1, %2, %3}, [%6];\n}"
                         : "+r"(r[i].x), "+r"(r[i].y), "+r"(r[i].z), "+r"(r[i].w)
                         : "r"(u), "r"(lim), "l"(src + u));
    }
}

// (m, s) reduction over aligned groups of W lanes: max first, then ONE rescale per lane and a
// plain sum (v1's combine() costs two ex2 per level). m == v.m covers (-inf, -inf); NaN in s
// propagates; every lane of the group gets the result.
template <int W>
__device__ __forceinline__ MS group_reduce(MS v) {
    float m = v.m;
#pragma unroll
    for (int off = W / 2; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float s = v.m == m ? v.s : v.s * ex2(v.m - m);
#pragma unroll
    for (int off = W / 2; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    return {m, s};
}
// Block-wide pair; one __syncthreads. `sc` alternates between two buffers from row to row, so a
// warp that runs ahead to row i+1 cannot overwrite what a slower warp still reads for row i
// (and row i+2's writes come after row i+1's barrier, which every warp passes after its reads).
template <int THREADS>
__device__ __forceinline__ MS block_reduce_v4(MS v, MS* sc) {
    constexpr int NW = THREADS / 32;
    v = group_reduce<32>(v);
    if constexpr (NW == 1) {
        return v;
    } else {
        if ((threadIdx.x & 31) == 0) sc[threadIdx.x >> 5] = v;
        __syncthreads();
        return group_reduce<NW>(sc[threadIdx.x & (NW - 1)]);
    }
}

// An unpacked slice (v[i][k], floats): replaced in place by e = 2^(x*log2e - ref), with ref this thread's
// max in the log2 domain; `mine` gets the thread's (max, sum) pair. A thread whose units are all -inf is
// `empty`: ref 0, so that 2^(-inf - ref) = 0, not NaN, and pair (-inf, 0).
struct ThreadExp {
    float ref;
    bool empty;
    MS mine;
};
template <int VPT, int N>
__device__ __forceinline__ ThreadExp exp_pair(float (&v)[VPT][N]) {
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < VPT; ++i)
#pragma unroll
        for (int k = 0; k < N; ++k) m = fmaxf(m, v[i][k]);
    const bool empty = m == -INFINITY;
    const float ref = empty ? 0.f : m * kLog2e;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i)
#pragma unroll
        for (int k = 0; k < N; ++k) {
            v[i][k] = ex2(fmaf(v[i][k], kLog2e, -ref));
            s += v[i][k];
        }
    return ThreadExp{ref, empty, MS{empty ? -INFINITY : ref, s}};
}
// The factor that turns this thread's e (exp_pair) into y, given the row's pair: an empty thread gets 0;
// an all -inf row has S = 0, so 0 * inf = NaN, like torch.
__device__ __forceinline__ float exp_scale(const ThreadExp& e, MS row) {
    return (e.empty ? 0.f : ex2(e.ref - row.m)) * (1.f / row.s);
}
// y = e * scale for this thread's units u < lim of an unpacked slice.
template <typename T, int THREADS, int VPT, int N>
__device__ __forceinline__ void store_scaled(T* dst, const float (&v)[VPT][N], int lim, float scale, bool stcs) {
    auto emit = [&](auto cs) {
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int u = i * THREADS + (int)threadIdx.x;
            if (u < lim) {
                float f[N];
#pragma unroll
                for (int k = 0; k < N; ++k) f[k] = v[i][k] * scale;
                store_unit_h<decltype(cs)::value>(dst + (int64_t)u * N, f);
            }
        }
    };
    if (stcs) emit(std::true_type{}); else emit(std::false_type{});
}

// A packed row slice (RECOMP form, below): this thread's (max, sum) pair, m in the log2 domain; a thread
// whose units are all -inf gives (-inf, 0) with ref 0, so that 2^(-inf - ref) = 0, not NaN.
template <typename T, int VPT>
__device__ __forceinline__ MS packed_pair(const uint4 (&r)[VPT]) {
    constexpr int N = 16 / (int)sizeof(T);
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        float f[N];
        unpack_unit_rc(r[i], f);
#pragma unroll
        for (int k = 0; k < N; ++k) m = fmaxf(m, f[k]);
    }
    const bool empty = m == -INFINITY;
    const float ref = empty ? 0.f : m * kLog2e;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        float f[N];
        unpack_unit_rc(r[i], f);
#pragma unroll
        for (int k = 0; k < N; ++k) s += ex2(fmaf(f[k], kLog2e, -ref));
    }
    return MS{empty ? -INFINITY : ref, s};
}
// y = 2^(x*log2e - ml) * inv for this thread's units u < lim of a packed slice, recomputed from r.
template <typename T, int THREADS, int VPT>
__device__ __forceinline__ void store_packed(T* dst, const uint4 (&r)[VPT], int lim, float ml, float inv, bool stcs) {
    constexpr int N = 16 / (int)sizeof(T);
    auto emit = [&](auto cs) {
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int u = i * THREADS + (int)threadIdx.x;
            if (u < lim) {
                float f[N];
                unpack_unit_rc(r[i], f);
#pragma unroll
                for (int k = 0; k < N; ++k) f[k] = ex2(fmaf(f[k], kLog2e, -ml)) * inv;
                store_unit_h<decltype(cs)::value>(dst + (int64_t)u * N, f);
            }
        }
    };
    if (stcs) emit(std::true_type{}); else emit(std::false_type{});
}

// bf16 rows, HALF_E form: the packed row r is replaced in place by e = 2^(x*log2e - ref), computed in fp32
// and kept as fp16 pairs (ref = this thread's max in the log2 domain, so 0 < e <= 1). One ex2 per element,
// where RECOMP needs two, in the registers of the packed row. Precision: fp16 keeps 11 significant bits,
// 4x finer than y's bf16, and its subnormals reach 2^-24, so storing e adds at most 2^-12 relative (or
// 3e-8 absolute) to y before y's own bf16 rounding (2^-9). The sum s is taken from the fp32 values.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
    uint32_t h;
    asm volatile("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(hi), "f"(lo));  // volatile as measured; not needed for the spills
    return h;
}
__device__ __forceinline__ void unpack_f16x2(uint32_t h, float& lo, float& hi) {
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}"
        : "=f"(lo), "=f"(hi) : "r"(h));
}
__device__ __forceinline__ __nv_bfloat162 as_bf162(uint32_t w) { return *reinterpret_cast<__nv_bfloat162*>(&w); }
template <int VPT>
__device__ __forceinline__ ThreadExp half_exp_pair(uint4 (&r)[VPT]) {
    // The max on packed pairs (bf16 max is exact): unpacking here as well would let ptxas keep all the
    // unpacked floats for the e pass below, which spills.
    __nv_bfloat162 mx = as_bf162(r[0].x);
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        mx = __hmax2(mx, as_bf162(r[i].x));
        mx = __hmax2(mx, as_bf162(r[i].y));
        mx = __hmax2(mx, as_bf162(r[i].z));
        mx = __hmax2(mx, as_bf162(r[i].w));
    }
    const float m = fmaxf(__low2float(mx), __high2float(mx));
    const bool empty = m == -INFINITY;
    const float ref = empty ? 0.f : m * kLog2e;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        float f[8];
        unpack_unit_rc(r[i], f);
        uint32_t h[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const float a = ex2(fmaf(f[2 * q], kLog2e, -ref)), b = ex2(fmaf(f[2 * q + 1], kLog2e, -ref));
            s += a;
            s += b;
            h[q] = pack_f16x2(a, b);
        }
        r[i] = make_uint4(h[0], h[1], h[2], h[3]);
    }
    return ThreadExp{ref, empty, MS{empty ? -INFINITY : ref, s}};
}
// y = e * scale for this thread's units u < lim, e as fp16 pairs (half_exp_pair).
template <typename T, int THREADS, int VPT>
__device__ __forceinline__ void store_half_e(T* dst, const uint4 (&r)[VPT], int lim, float scale, bool stcs) {
    auto emit = [&](auto cs) {
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int u = i * THREADS + (int)threadIdx.x;
            if (u < lim) {
                const uint32_t w[4] = {r[i].x, r[i].y, r[i].z, r[i].w};
                float f[8];
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    unpack_f16x2(w[q], f[2 * q], f[2 * q + 1]);
                    f[2 * q] *= scale;
                    f[2 * q + 1] *= scale;
                }
                store_unit_h<decltype(cs)::value>(dst + (int64_t)u * 8, f);
            }
        }
    };
    if (stcs) emit(std::true_type{}); else emit(std::false_type{});
}

// Row-per-CTA softmax with the row in registers; CTA b handles rows b, b+G, b+2G, ... (G = grid;
// grid = rows gives the classic one-row-per-CTA launch).
//   STAGES = 0: load a row, process it.
//   STAGES > 0 (persistent): STAGES register buffers; the load of row k+STAGES is issued into row
//     k's buffer as soon as that buffer is free, so up to STAGES rows are in flight while row k is
//     reduced and stored.
//   RECOMP = false: e = 2^(x*log2e - ref_thread) kept as floats (1 ex2/element); the buffer is free
//     right after unpacking, so the refill goes out before the reduction.
//   RECOMP = true (for bf16: keeps only the packed row, half the registers): y = 2^(x*log2e - M) / S
//     recomputed from the packed row (2 ex2/element); the refill goes out after the stores.
//   HALF_E = true (bf16 only, STAGES = 0): e kept as fp16 pairs in the packed row's registers
//     (half_exp_pair): one ex2 per element in RECOMP's registers.
// Numerics as v1/v2: log2-domain max and sum; an all -inf row gives NaN (S = 0), NaN / +inf propagate.
template <typename T, int THREADS, int VPT, int MINB, int STAGES, bool RECOMP, bool HALF_E = false>
__global__ void __launch_bounds__(THREADS, MINB)
softmax_v4_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols, int flags) {
    static_assert(!HALF_E || (sizeof(T) == 2 && STAGES == 0 && !RECOMP), "HALF_E: bf16, one row at a time");
    constexpr int N = 16 / (int)sizeof(T);
    constexpr int NB = STAGES > 0 ? STAGES : 1;
    constexpr int NW = THREADS / 32;
    __shared__ MS red[2][NW];

    const int nu = (int)(cols / N);  // host guarantees nu <= THREADS * VPT
    const int64_t G = gridDim.x;
    const bool ldcs = (flags & kLdCs) != 0, stcs = (flags & kStCs) != 0;
    int par = 0;

    auto issue = [&](uint4 (&r)[VPT], int64_t row) {
        const bool ok = row < rows;
        const uint4* src = reinterpret_cast<const uint4*>(x + (ok ? row : 0) * cols);
        if (ldcs) load_row_h<T, THREADS, VPT, true>(r, src, ok ? nu : 0);
        else      load_row_h<T, THREADS, VPT, false>(r, src, ok ? nu : 0);
    };

    auto process = [&](uint4 (&r)[VPT], int64_t row, int64_t next) {
        T* dst = y + row * cols;
        MS* sc = red[par];
        par ^= 1;
        if constexpr (HALF_E) {
            const ThreadExp e = half_exp_pair(r);
            const MS t = block_reduce_v4<THREADS>(e.mine, sc);
            store_half_e<T, THREADS, VPT>(dst, r, nu, exp_scale(e, t), stcs);
        } else if constexpr (!RECOMP) {
            float v[VPT][N];
#pragma unroll
            for (int i = 0; i < VPT; ++i) unpack_unit(r[i], v[i]);
            if constexpr (STAGES > 0) issue(r, next);
            const ThreadExp e = exp_pair(v);
            const MS t = block_reduce_v4<THREADS>(e.mine, sc);
            store_scaled<T, THREADS, VPT>(dst, v, nu, exp_scale(e, t), stcs);
        } else {
            const MS t = block_reduce_v4<THREADS>(packed_pair<T, VPT>(r), sc);
            // all -inf row: 2^(-inf + inf) = NaN, like torch
            store_packed<T, THREADS, VPT>(dst, r, nu, t.m, 1.f / t.s, stcs);
            if constexpr (STAGES > 0) issue(r, next);
        }
    };

    uint4 buf[NB][VPT];
    const int64_t r0 = blockIdx.x;
    if constexpr (STAGES == 0) {
        for (int64_t row = r0; row < rows; row += G) {
            issue(buf[0], row);
            process(buf[0], row, rows);
        }
    } else {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) issue(buf[s], r0 + s * G);
        for (int64_t base = r0; base < rows; base += STAGES * G) {
#pragma unroll
            for (int st = 0; st < STAGES; ++st) {
                const int64_t row = base + st * G;
                if (row >= rows) break;
                process(buf[st], row, row + STAGES * G);
            }
        }
    }
}

// ================================================================ long rows: register segments + a handshake
// A row longer than one CTA's registers is cut into P segments of THREADS*VPT units; CTA b holds segment
// b % P of row b / P in registers (one read of x, as for short rows), reduces it to a (max, sum) pair,
// publishes the pair and bumps the row's counter, then waits until all P pairs of its row are in,
// merges them and writes its segment. No clusters and no cross-CTA barrier: a CTA only waits for the
// other segments of its own row, whose CTAs the hardware dispatches right beside it (blocks go out in
// index order), so the wait is about one load latency.
// Progress does not depend on that order: a CTA that waits longer than kSegWaitNs (never seen: it would
// take a peer that was not dispatched) computes its row's pair itself from x (read-only input), so a
// scheduling surprise costs time, never a hang or a wrong answer.
constexpr unsigned long long kSegWaitNs = 500000ull;  // 0.5 ms; a normal wait is a few microseconds

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// True once *c >= target (acquire: the pairs published before each increment are visible), false on timeout.
__device__ __forceinline__ bool wait_count(const unsigned* c, unsigned target) {
    unsigned long long t0 = 0;
    for (int it = 0;; ++it) {
        unsigned v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
        if (v >= target) return true;
        if (it == 0) t0 = global_ns();
        else if (global_ns() - t0 > kSegWaitNs) return false;
        __nanosleep(100);
    }
}

template <typename T, int THREADS, int VPT, int MINB>
__global__ void __launch_bounds__(THREADS, MINB)
softmax_seg_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t cols, int P, MS* __restrict__ ws,
                   unsigned* __restrict__ cnt, int flags) {
    constexpr int N = 16 / (int)sizeof(T);
    constexpr int NW = THREADS / 32;
    __shared__ MS red[NW];
    __shared__ int rescue;

    const int64_t row = blockIdx.x / P;
    const int64_t nu_row = cols / N;
    const int64_t u0 = (int64_t)(blockIdx.x % P) * (THREADS * VPT);
    const int nu = (int)min((int64_t)(THREADS * VPT), nu_row - u0);
    const uint4* src = reinterpret_cast<const uint4*>(x + row * cols) + u0;

    uint4 r[VPT];
    if (flags & kLdCs) load_row_h<T, THREADS, VPT, true>(r, src, nu);
    else               load_row_h<T, THREADS, VPT, false>(r, src, nu);
    float v[VPT][N];
#pragma unroll
    for (int i = 0; i < VPT; ++i) unpack_unit(r[i], v[i]);
    const ThreadExp e = exp_pair(v);
    const MS part = block_reduce_v4<THREADS>(e.mine, red);

    if (threadIdx.x == 0) {
        ws[blockIdx.x] = part;  // == ws[row * P + segment]
        __threadfence();        // the pair is visible before the count that announces it
        atomicAdd(cnt + row, 1u);
        rescue = wait_count(cnt + row, (unsigned)P) ? 0 : 1;
    }
    __syncthreads();  // also ends every read of `red` by the block reduction above
    MS t;
    if (!rescue) {  // every warp merges the P pairs itself (L2 reads, no further barrier)
        const MS* wr = ws + row * P;
        MS p{-INFINITY, 0.f};
        for (int i = threadIdx.x & 31; i < P; i += 32) {
            const float2 q = __ldcg(reinterpret_cast<const float2*>(wr + i));
            p = combine(p, MS{q.x, q.y});
        }
        t = group_reduce<32>(p);
    } else {
        const T* xr = x + row * cols;
        Acc acc;
        for (int64_t u = threadIdx.x; u < nu_row; u += THREADS) {
            float f[N];
            load_unit(xr + u * N, f);
            acc.add(f);
        }
        t = block_reduce_v4<THREADS>(acc.pair(), red);
    }
    store_scaled<T, THREADS, VPT>(y + row * cols + u0 * N, v, nu, exp_scale(e, t), (flags & kStCs) != 0);
}
"""

# v1 host code (launch<T, kVec>) verbatim, minus its entry point.
_v1_host_src = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <algorithm>
#include <map>
#include <tuple>

constexpr int64_t kMaxSliceBytes = 112 * 1024;  // 2 CTAs/SM: 2*(112K + static + 1K reserved) <= 228K
constexpr int64_t kChunkBytes = 16 * 1024;      // TMA chunk; pass 1 starts after the first lands
constexpr int64_t kFallbackChunkBytes = 64 * 1024;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int pick_threads(int64_t units) {  // ~4+ units per thread, 64..512 threads
    int t = 64;
    while (t < kMaxThreads && (int64_t)t * 4 < units) t *= 2;
    return t;
}

template <typename T, bool kVec>
static void launch(const T* x, T* y, int64_t rows, int64_t cols, int64_t target_slice, cudaStream_t stream) {
    constexpr int N = Unit<T, kVec>::N;
    constexpr int64_t unit_bytes = N * sizeof(T);
    const int64_t nunits = cols / N;

    // Smallest power-of-two cluster whose slice fits the target (64 KB by default, i.e. 3 CTAs/SM).
    int csize = 1;
    while (csize < 16 && ceil_div(nunits, csize) * unit_bytes > target_slice) csize *= 2;
    const int64_t upc = ceil_div(nunits, csize);
    const int64_t slice_bytes = upc * unit_bytes;

    if (slice_bytes <= kMaxSliceBytes) {
        auto kernel = softmax_smem_kernel<T, kVec>;
        static bool configured = false;  // one flag per template instance
        if (!configured) {
            C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kMaxSliceBytes));
            C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                (int)cudaSharedmemCarveoutMaxShared));
            C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
            configured = true;
        }
        const int threads = pick_threads(upc);
        int nchunks = 1;
        if (kVec) nchunks = (int)std::min<int64_t>(kMaxChunks, std::max<int64_t>(1, ceil_div(slice_bytes, kChunkBytes)));
        const int upchunk = (int)ceil_div(upc, nchunks);
        TORCH_CHECK(rows * csize <= INT32_MAX, "softmax_fast: too many rows");

        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((unsigned)(rows * csize));
        cfg.blockDim = dim3(threads);
        cfg.dynamicSmemBytes = (size_t)slice_bytes;
        cfg.stream = stream;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = csize;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = csize > 1 ? 1 : 0;
        bool fits = true;
        if (csize > 8) {  // non-portable size: make sure the GPU can place such a cluster at all
            static std::map<std::tuple<int, int, int64_t>, bool> cache;
            const auto key = std::make_tuple(csize, threads, slice_bytes);
            auto it = cache.find(key);
            if (it == cache.end()) {
                int nclusters = 0;
                const bool ok = cudaOccupancyMaxActiveClusters(&nclusters, kernel, &cfg) == cudaSuccess && nclusters > 0;
                (void)cudaGetLastError();
                it = cache.emplace(key, ok).first;
            }
            fits = it->second;
        }
        if (fits) {
            C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, x, y, cols, csize, (int)upc, nchunks, upchunk));
            C10_CUDA_KERNEL_LAUNCH_CHECK();
            return;
        }
    }

    // Fallback: two kernels through a tiny global workspace of per-chunk pairs.
    const int64_t upc_fb = std::max<int64_t>(1, kFallbackChunkBytes / unit_bytes);
    const int64_t cpr = ceil_div(nunits, upc_fb);
    TORCH_CHECK(rows * cpr <= INT32_MAX, "softmax_fast: too many rows");
    auto ws = torch::empty({rows * cpr * 2}, torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCUDA));
    MS* wsp = reinterpret_cast<MS*>(ws.data_ptr<float>());
    const int threads = pick_threads(upc_fb);
    softmax_partial_kernel<T, kVec><<<(unsigned)(rows * cpr), threads, 0, stream>>>(x, wsp, cols, (int)cpr, (int)upc_fb);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    softmax_finalize_kernel<T, kVec><<<(unsigned)(rows * cpr), threads, 0, stream>>>(x, y, wsp, cols, (int)cpr, (int)upc_fb);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

"""

_v4_host_src = r"""
// ================================================================ v4 host side
// Variants (the `variant` knob; 0 = auto). Each is one instantiation of softmax_v4_kernel:
//   id: dtype, THREADS, VPT (16-byte units per thread), MINB (launch-bounds min CTAs/SM), STAGES, RECOMP,
//       HALF_E, persistent (grid = CTAs that fit, rows strided) or one CTA per row.
// A variant covers rows of up to THREADS*VPT units; it refuses (TORCH_CHECK) anything else.
template <typename T, int THREADS, int VPT, int MINB, int STAGES, bool RECOMP, bool HALF_E = false>
static void launch_v4_t(const T* x, T* y, int64_t rows, int64_t cols, bool persist, int ctas_per_sm, int flags,
                        cudaStream_t stream) {
    constexpr int N = 16 / (int)sizeof(T);
    TORCH_CHECK(cols % N == 0 && cols / N <= (int64_t)THREADS * VPT, "softmax_fast_v4: variant does not cover this row");
    auto kernel = softmax_v4_kernel<T, THREADS, VPT, MINB, STAGES, RECOMP, HALF_E>;
    int64_t grid = rows;
    if (persist) {
        static int occ = -1;  // CTAs per SM, per instantiation (queried once)
        if (occ < 0) {
            int n = 0;
            if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, THREADS, 0) != cudaSuccess) n = 1;
            (void)cudaGetLastError();
            occ = std::max(n, 1);
        }
        const int per = ctas_per_sm > 0 ? std::min(ctas_per_sm, occ) : occ;
        static int sms = 0;
        if (sms <= 0) {
            int dev = 0;
            C10_CUDA_CHECK(cudaGetDevice(&dev));
            C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        }
        const int64_t slots = (int64_t)per * std::max(sms, 1);
        const int64_t rpc = ceil_div(rows, slots);  // rows per CTA; then as few CTAs as give that
        grid = ceil_div(rows, rpc);
    }
    TORCH_CHECK(grid <= INT32_MAX, "softmax_fast_v4: too many rows");
    kernel<<<(unsigned)grid, THREADS, 0, stream>>>(x, y, rows, cols, flags);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Long rows: P = ceil(units / (THREADS*VPT)) segments per row, one CTA each (softmax_seg_kernel). The
// pairs and per-row counters live in a small workspace from torch's allocator (stream-ordered, so calls on
// one stream never share it while running); the counters start at zero for every call.
template <typename T, int THREADS, int VPT, int MINB>
static void launch_seg_t(const T* x, T* y, int64_t rows, int64_t cols, int flags, const torch::TensorOptions& opt,
                         cudaStream_t stream) {
    constexpr int N = 16 / (int)sizeof(T);
    TORCH_CHECK(cols % N == 0, "softmax_fast_v4: segment variants need rows of whole 16-byte units");
    const int64_t P = ceil_div(cols / N, (int64_t)THREADS * VPT);
    TORCH_CHECK(rows * P <= INT32_MAX, "softmax_fast_v4: too many row segments");
    auto ws = torch::empty({rows * P * 2}, opt.dtype(torch::kFloat32));
    auto cnt = torch::zeros({rows}, opt.dtype(torch::kInt32));
    softmax_seg_kernel<T, THREADS, VPT, MINB><<<(unsigned)(rows * P), THREADS, 0, stream>>>(
        x, y, cols, (int)P, reinterpret_cast<MS*>(ws.data_ptr<float>()),
        reinterpret_cast<unsigned*>(cnt.data_ptr<int32_t>()), flags);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Auto choices (variant 0 / hint 0), per row class. Edit after the bench sweep.
// Measured best on the H200 (benchmarks/bench_softmax_v4.py --quick, 2026-11-30): 0.2625 / 0.1344 / 0.5326 ms.
// bf16 rows with e kept as fp16 (one ex2 per element; benchmarks/standalone/softmax_regs.cu, H200,
// 2026-12-01): 64 KB rows in 1024-thread CTAs, 2 per SM, 0.5192 ms where variant 23 took 0.5353; 8 KB rows
// in one-warp CTAs (no block barrier), 24 per SM, 0.1302 ms where variant 12 took 0.1331.
constexpr int kAutoF32_16K = 1, kAutoBf16_4K = 17, kAutoBf16_32K = 18;
// Rows > 64 KB: register segments, with streaming (.cs) stores unless a hint is given: plain stores were
// 1.6x slower at 4096x393216 (bench, H200, 2026-11-30: variant 33 .cs 3.66 ms, 31 .cs 3.82 ms, fast_v3 3.90 ms).
// Few threads with many registers each hold a segment best (benchmarks/standalone/softmax_regs.cu, H200,
// 2026-12-01, 4096x393216 fp32: 37 3.18 ms, 38 3.23, 33 3.66; bf16 4096x393216: 43 1.95, 41 2.37).
constexpr int kAutoF32_Long = 37, kAutoBf16_Long = 43, kAutoHintLong = 3;
constexpr int kAutoHint = 1;  // 1 = plain loads + plain stores (Liger's choice)

// hint knob: 0 = auto, 1 = plain/plain, 2 = ld.cs/plain, 3 = plain/st.cs, 4 = ld.cs/st.cs
static int hint_flags(int hint) {
    if (hint <= 0 || hint > 4) hint = kAutoHint;
    return hint - 1;  // bit 0 = ld.cs, bit 1 = st.cs
}

// Returns false if the variant id is unknown for this dtype.
static bool run_variant_f32(int v, const float* x, float* y, int64_t rows, int64_t cols, int cps, int fl,
                            const torch::TensorOptions& o, cudaStream_t s) {
    switch (v) {
        case 1: launch_v4_t<float, 512, 8, 2, 0, false>(x, y, rows, cols, false, cps, fl, s); return true;   // v2's shape, 2 CTA/SM
        case 2: launch_v4_t<float, 256, 16, 3, 0, false>(x, y, rows, cols, false, cps, fl, s); return true;  // 3 rows/SM
        case 3: launch_v4_t<float, 1024, 4, 1, 0, false>(x, y, rows, cols, false, cps, fl, s); return true;  // 1024 thr/row
        case 4: launch_v4_t<float, 512, 8, 1, 1, false>(x, y, rows, cols, true, cps, fl, s); return true;    // persistent, 1 ahead
        case 5: launch_v4_t<float, 512, 8, 1, 2, false>(x, y, rows, cols, true, cps, fl, s); return true;    // persistent, 2 ahead
        case 6: launch_v4_t<float, 1024, 4, 1, 1, false>(x, y, rows, cols, true, cps, fl, s); return true;   // persistent 1024 thr
        // rows > 16384 fp32: segments of THREADS*VPT*4 floats
        case 31: launch_seg_t<float, 512, 8, 2>(x, y, rows, cols, fl, o, s); return true;   // 64 KB, 2 CTA/SM
        case 32: launch_seg_t<float, 256, 8, 4>(x, y, rows, cols, fl, o, s); return true;   // 32 KB, 4 CTA/SM
        case 33: launch_seg_t<float, 512, 6, 3>(x, y, rows, cols, fl, o, s); return true;   // 48 KB, 3 CTA/SM (40 regs: spills)
        case 37: launch_seg_t<float, 128, 36, 3>(x, y, rows, cols, fl, o, s); return true;  // 72 KB, 3 CTA/SM (auto)
        case 38: launch_seg_t<float, 128, 24, 4>(x, y, rows, cols, fl, o, s); return true;  // 48 KB, 4 CTA/SM
        default: return false;
    }
}
static bool run_variant_bf16(int v, const __nv_bfloat16* x, __nv_bfloat16* y, int64_t rows, int64_t cols, int cps, int fl,
                             const torch::TensorOptions& o, cudaStream_t s) {
    using B = __nv_bfloat16;
    switch (v) {
        // rows <= 4096 bf16 (8 KB)
        case 11: launch_v4_t<B, 128, 4, 8, 0, false>(x, y, rows, cols, false, cps, fl, s); return true;   // v2's shape
        case 12: launch_v4_t<B, 64, 8, 10, 0, false>(x, y, rows, cols, false, cps, fl, s); return true;   // 2 warps/row
        case 13: launch_v4_t<B, 128, 4, 8, 1, false>(x, y, rows, cols, true, cps, fl, s); return true;    // persistent, 1 ahead
        case 14: launch_v4_t<B, 128, 4, 6, 2, false>(x, y, rows, cols, true, cps, fl, s); return true;    // persistent, 2 ahead
        case 15: launch_v4_t<B, 256, 2, 4, 2, false>(x, y, rows, cols, true, cps, fl, s); return true;    // persistent, 8 warps
        case 16: launch_v4_t<B, 128, 4, 8, 2, true>(x, y, rows, cols, true, cps, fl, s); return true;     // persistent, recompute
        case 17: launch_v4_t<B, 32, 16, 24, 0, false, true>(x, y, rows, cols, false, cps, fl, s); return true;  // 1 warp/row, fp16 e (auto)
        // rows <= 32768 bf16 (64 KB)
        case 21: launch_v4_t<B, 1024, 4, 1, 0, false>(x, y, rows, cols, false, cps, fl, s); return true;  // 1024 thr/row
        case 22: launch_v4_t<B, 1024, 4, 1, 2, true>(x, y, rows, cols, true, cps, fl, s); return true;    // persistent, recompute, 1 ahead
        case 23: launch_v4_t<B, 512, 8, 2, 0, true>(x, y, rows, cols, false, cps, fl, s); return true;    // 2 CTA/SM, recompute
        case 24: launch_v4_t<B, 512, 8, 1, 1, false>(x, y, rows, cols, true, cps, fl, s); return true;    // persistent, 1 ahead
        case 25: launch_v4_t<B, 512, 8, 1, 2, true>(x, y, rows, cols, true, cps, fl, s); return true;     // persistent, recompute
        case 26: launch_v4_t<B, 1024, 4, 1, 1, false>(x, y, rows, cols, true, cps, fl, s); return true;   // persistent 1024 thr
        case 18: launch_v4_t<B, 1024, 4, 2, 0, false, true>(x, y, rows, cols, false, cps, fl, s); return true;  // fp16 e, 2 CTA/SM (auto)
        case 19: launch_v4_t<B, 512, 8, 2, 0, false, true>(x, y, rows, cols, false, cps, fl, s); return true;   // fp16 e, 2 CTA/SM
        // rows > 32768 bf16: segments of THREADS*VPT*8 bf16 (kept as floats: 32 per thread)
        case 41: launch_seg_t<B, 512, 4, 2>(x, y, rows, cols, fl, o, s); return true;   // 32 KB, 2 CTA/SM
        case 42: launch_seg_t<B, 256, 4, 4>(x, y, rows, cols, fl, o, s); return true;   // 16 KB, 4 CTA/SM
        case 43: launch_seg_t<B, 128, 12, 4>(x, y, rows, cols, fl, o, s); return true;  // 24 KB, 4 CTA/SM (auto)
        default: return false;
    }
}

// variant 0: register kernels only for the row classes they were built for (more than half of the
// covered width: narrower rows would leave most threads idle); everything else -> v1.
torch::Tensor softmax_fast_v4(torch::Tensor x, int64_t variant, int64_t hint, int64_t ctas_per_sm) {
    TORCH_CHECK(x.is_cuda(), "softmax_fast_v4: x must be a CUDA tensor");
    TORCH_CHECK(x.dim() >= 1, "softmax_fast_v4: x must have at least one dimension");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16,
                "softmax_fast_v4: x must be float32 or bfloat16");
    c10::cuda::CUDAGuard guard(x.device());
    x = x.contiguous();
    auto y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
    const int64_t cols = x.size(-1);
    if (x.numel() == 0) return y;
    const int64_t rows = x.numel() / cols;
    auto stream = c10::cuda::getCurrentCUDAStream();
    // 16-byte units only when every row start is 16-byte aligned in x and in y.
    const bool vec = (cols * x.element_size()) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(y.data_ptr()) % 16 == 0;
    const bool long_rows = vec && cols * x.element_size() > 64 * 1024;  // register segments
    const int fl = hint_flags(hint <= 0 && long_rows ? kAutoHintLong : (int)hint);
    const int cps = (int)std::max<int64_t>(0, std::min<int64_t>(ctas_per_sm, 64));
    if (x.scalar_type() == torch::kFloat32) {
        const float* xp = x.data_ptr<float>();
        float* yp = y.data_ptr<float>();
        const int64_t nu = cols / 4;
        int v = (int)variant;
        if (v == 0 && vec && nu > 2048 && nu <= 4096) v = kAutoF32_16K;
        if (v == 0 && vec && nu > 4096) v = kAutoF32_Long;
        if (v != 0) {
            TORCH_CHECK(vec, "softmax_fast_v4: register variants need 16-byte aligned rows");
            TORCH_CHECK(run_variant_f32(v, xp, yp, rows, cols, cps, fl, x.options(), stream), "softmax_fast_v4: no fp32 variant ", v);
        } else if (vec) {
            launch<float, true>(xp, yp, rows, cols, 64 * 1024, stream);
        } else {
            launch<float, false>(xp, yp, rows, cols, 64 * 1024, stream);
        }
    } else {
        auto xp = reinterpret_cast<const __nv_bfloat16*>(x.data_ptr<at::BFloat16>());
        auto yp = reinterpret_cast<__nv_bfloat16*>(y.data_ptr<at::BFloat16>());
        const int64_t nu = cols / 8;
        int v = (int)variant;
        if (v == 0 && vec && nu > 256 && nu <= 512) v = kAutoBf16_4K;
        if (v == 0 && vec && nu > 2048 && nu <= 4096) v = kAutoBf16_32K;
        if (v == 0 && vec && nu > 4096) v = kAutoBf16_Long;
        if (v != 0) {
            TORCH_CHECK(vec, "softmax_fast_v4: register variants need 16-byte aligned rows");
            TORCH_CHECK(run_variant_bf16(v, xp, yp, rows, cols, cps, fl, x.options(), stream), "softmax_fast_v4: no bf16 variant ", v);
        } else if (vec) {
            launch<__nv_bfloat16, true>(xp, yp, rows, cols, 64 * 1024, stream);
        } else {
            launch<__nv_bfloat16, false>(xp, yp, rows, cols, 64 * 1024, stream);
        }
    }
    return y;
}
"""

_cpp_src = "torch::Tensor softmax_fast_v4(torch::Tensor x, int64_t variant, int64_t hint, int64_t ctas_per_sm);"

_ext = load_inline(
    name="softmax_fast_v4",
    cpp_sources=_cpp_src,
    cuda_sources=_v1_kernels_src + _v4_kernels_src + _v1_host_src + _v4_host_src,
    functions=["softmax_fast_v4"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)

# Knobs (0 = auto, see kAuto* in the host code): register-kernel variant id, cache-hint mode, CTAs per SM
# for the persistent variants.
VARIANT = 0
HINT = 0
CTAS_PER_SM = 0


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.softmax_fast_v4(x, VARIANT, HINT, CTAS_PER_SM)
