"""Cross-entropy (mean reduction), v4: row segments in registers, last-arriver merge, no waiting.

Design (details in docs/perf-notes/cross_entropy.md, section "fast_v4"):
- Aligned rows (row bytes % 16 == 0, 16-byte aligned base): a row of U 16-byte units is cut into
  P = ceil(U / SEG) balanced segments (SEG = threads per segment * VPT). One group of threads (a CTA,
  or 1/ROWS of one) holds one segment in REGISTERS: VPT predicated 16-byte loads per thread, all
  issued back to back before the first use (-inf fill), as softmax/fast_v4.py does.
- Per segment: thread max -> one ex2 per element (fast.py's math: fp32 exact (x - m) * log2e, bf16
  FMA form) -> max-first warp/group reduction to an (m, s) pair. x[row, t] is never loaded: the
  thread holding it picks it out of its registers (the target index is loaded first, beside the row).
- P > 1: lane 0 publishes the pair (and x[t] if its segment holds it), then a release ticket on the
  row's counter. Only the LAST segment to arrive continues: it merges the row's P pairs in index
  order (the same bits whoever is last). Nobody waits: every other CTA exits at once.
- Row loss (target out of range -> NaN; tiny-loss guard: target is the max and the rest < 1 ->
  re-read the row, log1p), then the mean in two fixed-order fp64 levels (chunks of 256 rows, then
  the chunk sums), deterministic, in the same launch. Two ways (flags bits 3-4):
  tickets (default): losses[row], release ticket per chunk; the last row of a chunk sums it,
    a ticket on the chunk count; the last chunk writes the 0-dim output;
  poll (option, not the default: it assumes blocks are dispatched in index order): the loss is published by one relaxed store into a slot that holds an all-ones
    NaN pattern between launches (the value is its own flag): no fence and no ticket round trip, the
    CTA just exits. Only the CTA of each chunk's last row waits for the chunk's (earlier-dispatched)
    rows, and the last row overall for the chunk sums; a 1 s timeout turns a never-expected stall into
    NaN instead of a hang. Readers put the all-ones pattern back.
- Cached per-device buffers (counters all 0, sentinel slots all -1 between launches; each is reset by
  whoever completes / reads it): no fill kernel per call (flags bit 2: fresh ones per call instead).
  As in fast.py / fast_v3.py: one call at a time per device (concurrent streams are not supported).
- Unaligned rows / odd widths: the same kernel with 1-element units (scalar loads), not timed.
- Knobs: `variant` (CE_V4_VARIANTS id; 0 = auto per row class) and `flags` (bits 0-1 load hint:
  1 plain / 2 ld.global.nc.L1::no_allocate / 3 same + .L2::256B, 0 = auto; bit 2 fresh buffers;
  bits 3-4 mean mode: 1 tickets, 2 poll, 0 = auto). benchmarks/bench_ce_v4.py sweeps them.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_cpp_src = r"""
#include <torch/extension.h>
torch::Tensor cross_entropy_fast_v4(torch::Tensor logits, torch::Tensor targets, torch::Tensor counters,
                                    torch::Tensor sentinels, int64_t variant, int64_t flags);
"""

# Device code only (no torch headers), so it can also be compiled alone with nvcc for -Xptxas -v.
_kernel_src = r"""
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>

// Variants: X(id, THREADS, VPT (16-byte units per thread), MINB (min CTAs/SM for launch bounds),
// ROWS (segments per CTA; each held by THREADS/ROWS threads)). Same ids for fp32 and bf16.
#define CE_V4_VARIANTS(X) \
    X(1, 512, 8, 2, 1)    /* 64 KB segments, 2 CTAs/SM */          \
    X(2, 256, 8, 4, 1)    /* 32 KB, 4 CTAs/SM */                   \
    X(3, 512, 6, 3, 1)    /* 48 KB, 3 CTAs/SM */                   \
    X(4, 1024, 4, 2, 1)   /* 64 KB, 1024 threads, 2 CTAs/SM */     \
    X(5, 256, 4, 8, 1)    /* 16 KB, 8 CTAs/SM, 32 registers */     \
    X(6, 128, 8, 8, 1)    /* 16 KB, 8 CTAs/SM */                   \
    X(7, 512, 8, 2, 4)    /* 4 x 16 KB segments per CTA */         \
    X(8, 256, 8, 4, 2)    /* 2 x 16 KB segments per CTA */         \
    X(9, 128, 16, 4, 1)   /* 32 KB, 4 warps, 16 loads per thread */

// Unaligned rows: 1-element units.
#define CE_V4_SCALAR_CFG 256, 16, 4, 1

namespace ce_v4 {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kRowsPerChunk = 256;  // rows per level-2 partial sum of the mean

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ uint32_t bmax2(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// -inf max (nothing seen yet, or an all -inf part) must not turn into (-inf) - (-inf) = NaN.
__device__ __forceinline__ float safe_ref(float m) { return m == -INFINITY ? 0.f : m; }

// Acquire after winning a ticket (the tickets themselves are release atomics). acq_rel, not
// __threadfence's fence.sc: the pattern only needs release/acquire.
__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// Ticket with release semantics (the pair / loss written before it is visible to whoever wins).
__device__ __forceinline__ unsigned atom_add_release(unsigned* p, unsigned v) {
    unsigned old;
    asm volatile("atom.release.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
// Target index: volatile asm, so that it is issued before the segment's loads (it is independent of
// them; x[row, t] itself is taken from the registers of the thread that holds it). ok = false: t = -1.
__device__ __forceinline__ int64_t ld_target(const int64_t* p, bool ok) {
    int64_t t = -1;
    asm volatile("{\n .reg .pred q;\n setp.ne.s32 q, %1, 0;\n @q ld.global.nc.s64 %0, [%2];\n}"
                 : "+l"(t) : "r"(static_cast<int>(ok)), "l"(p));
    return t;
}

__device__ __forceinline__ float ld_scalar(const float* p) { return __ldg(p); }
__device__ __forceinline__ float ld_scalar(const __nv_bfloat16* p) {
    const unsigned short b = __ldg(reinterpret_cast<const unsigned short*>(p));
    return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// ---------------------------------------------------------------- per-thread math (fast.py's)
template <typename T> struct Vec;

template <> struct Vec<float> {
    static constexpr uint32_t kNegInf = 0xff800000u;
    template <int V>
    static __device__ __forceinline__ float tmax(const uint4 (&r)[V]) {
        float p[V];
#pragma unroll
        for (int u = 0; u < V; ++u)
            p[u] = fmaxf(fmaxf(__uint_as_float(r[u].x), __uint_as_float(r[u].y)),
                         fmaxf(__uint_as_float(r[u].z), __uint_as_float(r[u].w)));
#pragma unroll
        for (int st = 1; st < V; st *= 2)
#pragma unroll
            for (int u = 0; u + st < V; u += 2 * st) p[u] = fmaxf(p[u], p[u + st]);
        return p[0];
    }
    // fp32 needs the exact subtraction (x - m) before scaling: folding m*log2e into an FMA would put
    // a per-row rounding error of ~1e-5 into the exponent.
    template <int V>
    static __device__ __forceinline__ float tsum(const uint4 (&r)[V], float mref) {
        float p[V];
#pragma unroll
        for (int u = 0; u < V; ++u)
            p[u] = (ex2((__uint_as_float(r[u].x) - mref) * kLog2e) + ex2((__uint_as_float(r[u].y) - mref) * kLog2e)) +
                   (ex2((__uint_as_float(r[u].z) - mref) * kLog2e) + ex2((__uint_as_float(r[u].w) - mref) * kLog2e));
#pragma unroll
        for (int st = 1; st < V; st *= 2)
#pragma unroll
            for (int u = 0; u + st < V; u += 2 * st) p[u] += p[u + st];
        return p[0];
    }
    static __device__ __forceinline__ float term(float x, float mref) { return ex2((x - mref) * kLog2e); }
    // Element c (0..3) of a unit, by selects (no local-memory indexing).
    static __device__ __forceinline__ float pick(const uint4& w, int c) {
        const uint32_t b = c == 0 ? w.x : c == 1 ? w.y : c == 2 ? w.z : w.w;
        return __uint_as_float(b);
    }
};

template <> struct Vec<__nv_bfloat16> {
    static constexpr uint32_t kNegInf = 0xff80ff80u;
    // Max on packed pairs halves the work; bf16 -> fp32 is exact.
    template <int V>
    static __device__ __forceinline__ float tmax(const uint4 (&r)[V]) {
        uint32_t p[V];
#pragma unroll
        for (int u = 0; u < V; ++u) p[u] = bmax2(bmax2(r[u].x, r[u].y), bmax2(r[u].z, r[u].w));
#pragma unroll
        for (int st = 1; st < V; st *= 2)
#pragma unroll
            for (int u = 0; u + st < V; u += 2 * st) p[u] = bmax2(p[u], p[u + st]);
        return fmaxf(bf_lo(p[0]), bf_hi(p[0]));
    }
    static __device__ __forceinline__ float pair(uint32_t w, float nb) {
        return ex2(fmaf(bf_lo(w), kLog2e, nb)) + ex2(fmaf(bf_hi(w), kLog2e, nb));
    }
    // bf16 tolerance allows the FMA form (one op less per element).
    template <int V>
    static __device__ __forceinline__ float tsum(const uint4 (&r)[V], float mref) {
        const float nb = -mref * kLog2e;
        float p[V];
#pragma unroll
        for (int u = 0; u < V; ++u)
            p[u] = (pair(r[u].x, nb) + pair(r[u].y, nb)) + (pair(r[u].z, nb) + pair(r[u].w, nb));
#pragma unroll
        for (int st = 1; st < V; st *= 2)
#pragma unroll
            for (int u = 0; u + st < V; u += 2 * st) p[u] += p[u + st];
        return p[0];
    }
    static __device__ __forceinline__ float term(float x, float mref) { return ex2(fmaf(x, kLog2e, -mref * kLog2e)); }
    // Element c (0..7) of a unit.
    static __device__ __forceinline__ float pick(const uint4& w, int c) {
        const int k = c >> 1;
        const uint32_t b = k == 0 ? w.x : k == 1 ? w.y : k == 2 ? w.z : w.w;
        return (c & 1) ? bf_hi(b) : bf_lo(b);
    }
};

// VPT predicated 16-byte loads (unit u = i*GT + gt: coalesced), all issued before any use; units
// >= lim read as -inf. `volatile` keeps them together and ahead of the math.
// H: 0 plain ld.global, 1 ld.global.nc.L1::no_allocate, 2 the same with .L2::256B.
template <int H, int GT, int VPT>
__device__ __forceinline__ void load_seg(uint4 (&r)[VPT], const uint4* src, int gt, int lim, uint32_t ni) {
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int u = i * GT + gt;
        r[i] = make_uint4(ni, ni, ni, ni);
        if constexpr (H == 0)
            asm volatile("{\n .reg .pred p;\n setp.lt.s32 p, %4, %5;\n"
                         " @p ld.global.v4.u32 {%0, %1, %2, %3}, [%6];\n}"
                         : "+r"(r[i].x), "+r"(r[i].y), "+r"(r[i].z), "+r"(r[i].w)
                         : "r"(u), "r"(lim), "l"(src + u));
        else if constexpr (H == 1)
            asm volatile("{\n .reg .pred p;\n setp.lt.s32 p, %4, %5;\n"
                         " @p ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%6];\n}"
                         : "+r"(r[i].x), "+r"(r[i].y), "+r"(r[i].z), "+r"(r[i].w)
                         : "r"(u), "r"(lim), "l"(src + u));
        else
            asm volatile("{\n .reg .pred p;\n setp.lt.s32 p, %4, %5;\n"
                         " @p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%6];\n}"
                         : "+r"(r[i].x), "+r"(r[i].y), "+r"(r[i].z), "+r"(r[i].w)
                         : "r"(u), "r"(lim), "l"(src + u));
    }
}

// (m, s) over aligned groups of W lanes: max first, ONE rescale per lane, plain sum (fast.py's order).
// Xor butterflies give every lane the same bits (max and + are commutative).
template <int W>
__device__ __forceinline__ void lane_reduce(float& m, float& s) {
    float gm = m;
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) gm = fmaxf(gm, __shfl_xor_sync(0xffffffffu, gm, o));
    s *= ex2((m - safe_ref(gm)) * kLog2e);
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    m = gm;
}
// (m, s) <- merge with (m2, s2).
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2), r = safe_ref(mn);
    s = s * ex2((m - r) * kLog2e) + s2 * ex2((m2 - r) * kLog2e);
    m = mn;
}
__device__ __forceinline__ double warp_sum(double a) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    return a;
}

// ---------------------------------------------------------------- poll mode for the mean
// Row losses (float) and chunk sums (double) are published by plain relaxed stores into a buffer that
// holds all-ones bit patterns (a NaN no arithmetic produces; published NaNs are canonicalised) between
// launches. The value is its own flag: no fence, no ticket, the writer just exits. Only the CTA of a
// chunk's last row waits (for rows of lower index: dispatched before it, and they never wait), and the
// final chunk sum is taken by the last row of all. A wait longer than kPollNs (a dispatch-order
// surprise; never expected) gives NaN instead of a hang. Readers reset the slots to all-ones.
constexpr unsigned long long kPollNs = 1000000000ull;  // 1 s
constexpr uint32_t kSent32 = 0xffffffffu;
constexpr unsigned long long kSent64 = 0xffffffffffffffffull;

__device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ uint32_t ld_relaxed(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long ld_relaxed(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_relaxed(uint32_t* p, uint32_t v) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed(unsigned long long* p, unsigned long long v) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint32_t pub_bits(float v) { return v != v ? 0x7fc00000u : __float_as_uint(v); }
__device__ __forceinline__ unsigned long long pub_bits(double v) {
    return v != v ? 0x7ff8000000000000ull : static_cast<unsigned long long>(__double_as_longlong(v));
}
__device__ __forceinline__ double from_bits(uint32_t b) { return static_cast<double>(__uint_as_float(b)); }
__device__ __forceinline__ double from_bits(unsigned long long b) {
    return __longlong_as_double(static_cast<long long>(b));
}

// Warp: wait for p[0..n) to be published, sum them in a fixed order (lane-strided, then a butterfly),
// reset them. Loads go out K at a time per lane, so a ready chunk costs one round trip per K*32.
template <typename W>
__device__ __forceinline__ double poll_sum(W* p, int n, bool& ok) {
    constexpr int K = 16 / static_cast<int>(sizeof(W));  // 4 x u32 or 2 x u64 per lane: fits 32 registers
    const W sent = static_cast<W>(sizeof(W) == 4 ? kSent32 : kSent64);
    const int lane = threadIdx.x & 31;
    double a = 0.0;
    for (int base = 0; base < n; base += 32 * K) {
        W v[K];
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int i = base + k * 32 + lane;
            v[k] = i < n ? ld_relaxed(p + i) : static_cast<W>(0);
        }
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int i = base + k * 32 + lane;
            if (i >= n) continue;
            unsigned long long t0 = 0;
            for (int it = 0; v[k] == sent && ok; ++it) {
                if (it == 0) t0 = gtimer();
                else if (gtimer() - t0 > kPollNs) ok = false;
                __nanosleep(64);
                v[k] = ld_relaxed(p + i);
            }
            a += v[k] == sent ? static_cast<double>(NAN) : from_bits(v[k]);
            st_relaxed(p + i, sent);
        }
    }
    return warp_sum(a);
}

// Per-call workspace: pairs[M*P] (float2) and xts[M] (x[row, t]) when P > 1; losses[M] and csum[nchunks]
// (double) in ticket mode. Cached counters (all 0 between launches): cnt[0..M) per row, cnt[M..M+nchunks)
// per chunk, cnt[M+nchunks] chunks done. Cached sentinels (poll mode, all-ones between launches):
// sent[0..2*nchunks) chunk sums (double), sent[2*nchunks..+M) row losses.
template <typename T, bool kVec, int THREADS, int VPT, int MINB, int ROWS>
__global__ void __launch_bounds__(THREADS, MINB)
ce_v4_kernel(const T* __restrict__ x, const int64_t* __restrict__ targets, int64_t M, int C, int U, int P,
             int su, float2* __restrict__ pairs, float* __restrict__ xts, float* __restrict__ losses,
             double* __restrict__ csum, unsigned* __restrict__ cnt, int nchunks, int hint, int poll,
             uint32_t* __restrict__ sent, T* __restrict__ out) {
    constexpr int GT = THREADS / ROWS;  // threads per segment
    constexpr int WPG = GT / 32;        // warps per segment
    constexpr int NW = THREADS / 32;
    static_assert(THREADS % ROWS == 0 && GT % 32 == 0 && (WPG & (WPG - 1)) == 0 && WPG <= 32, "bad variant");
    constexpr int N = kVec ? 16 / static_cast<int>(sizeof(T)) : 1;  // elements per unit
    __shared__ float2 red[NW];
    __shared__ float sxt[ROWS];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = warp / WPG;
    const int gt = threadIdx.x - g * GT;
    const bool leader = gt < 32;  // first warp of the segment's group: does the epilogue
    const int64_t q = static_cast<int64_t>(blockIdx.x) * ROWS + g;  // segment index = row * P + seg
    const bool active = q < M * static_cast<int64_t>(P);
    const int64_t row = active ? q / P : 0;
    const int seg = active ? static_cast<int>(q - row * P) : 0;
    const int u0 = seg * su;
    const int lim = active ? max(0, min(su, U - u0)) : 0;
    const T* xrow = x + row * static_cast<int64_t>(C);

    // The target index, issued first. x[row, t] is not loaded: the thread whose registers hold it
    // picks it out and hands it to the group's leader warp (shared memory).
    const int64_t tgt64 = ld_target(targets + row, active);
    const bool t_ok = active && static_cast<uint64_t>(tgt64) < static_cast<uint64_t>(C);
    const int tgt = t_ok ? static_cast<int>(tgt64) : 0;  // C < 2^30
    const int ut = t_ok ? tgt / N - u0 : -1;            // target's unit within this segment
    const bool seg_owns = ut >= 0 && ut < lim;
    const bool own = seg_owns && (ut % GT) == gt;
    const int own_i = ut / GT;
    const int own_c = tgt % N;
    float m, s, xv = NAN;
    if constexpr (kVec) {
        const uint4* src = reinterpret_cast<const uint4*>(xrow) + u0;
        uint4 r[VPT];
        if (hint == 1) load_seg<1, GT, VPT>(r, src, gt, lim, Vec<T>::kNegInf);
        else if (hint == 2) load_seg<2, GT, VPT>(r, src, gt, lim, Vec<T>::kNegInf);
        else load_seg<0, GT, VPT>(r, src, gt, lim, Vec<T>::kNegInf);
        if (own) {
            uint4 w = r[0];
#pragma unroll
            for (int i = 1; i < VPT; ++i)
                if (own_i == i) w = r[i];
            xv = Vec<T>::pick(w, own_c);
        }
        m = Vec<T>::tmax(r);
        s = Vec<T>::tsum(r, safe_ref(m));
    } else {
        float r[VPT];
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int u = i * GT + gt;
            r[i] = u < lim ? ld_scalar(xrow + u0 + u) : -INFINITY;
        }
        if (own) {
            xv = r[0];
#pragma unroll
            for (int i = 1; i < VPT; ++i)
                if (own_i == i) xv = r[i];
        }
        m = r[0];
#pragma unroll
        for (int i = 1; i < VPT; ++i) m = fmaxf(m, r[i]);
        const float mr = safe_ref(m);
        s = 0.f;
#pragma unroll
        for (int i = 0; i < VPT; ++i) s += Vec<T>::term(r[i], mr);
    }

    lane_reduce<32>(m, s);
    float xt;  // x[row, t] if this segment holds it (leader warp)
    if constexpr (WPG > 1) {
        if (lane == 0) red[warp] = make_float2(m, s);
        if (own) sxt[g] = xv;
        __syncthreads();  // the only block barrier: from here on only leader warps run
        if (!leader) return;
        const float2 p = red[g * WPG + (lane & (WPG - 1))];
        m = p.x;
        s = p.y;
        lane_reduce<WPG>(m, s);
        xt = seg_owns ? sxt[g] : NAN;
    } else {
        xt = __shfl_sync(0xffffffffu, xv, static_cast<int>(ut & 31));
        if (!seg_owns) xt = NAN;
    }
    if (!active) return;

    if (P > 1) {
        unsigned ticket = 0;
        if (lane == 0) {
            pairs[q] = make_float2(m, s);
            if (seg_owns) xts[row] = xt;
            ticket = atom_add_release(cnt + row, 1u);
        }
        ticket = __shfl_sync(0xffffffffu, ticket, 0);
        if (ticket != static_cast<unsigned>(P - 1)) return;  // not the last segment of the row: done
        fence_acq_rel();
        // Merge in index order (the same bits whichever segment arrives last).
        m = -INFINITY;
        s = 0.f;
        const float2* pr = pairs + row * P;
        for (int i = lane; i < P; i += 32) {
            const float2 p = __ldcg(pr + i);
            lse_merge(m, s, p.x, p.y);
        }
        lane_reduce<32>(m, s);
        xt = t_ok ? __ldcg(xts + row) : NAN;  // written by the segment that holds it
        if (lane == 0) cnt[row] = 0u;  // every segment has counted: ready for the next launch
    }

    float loss = (m - xt) + logf(s);
    // Warp-uniform. The target is the max and the rest sums to < 1: log(s) would lose the digits of
    // a tiny loss, so re-read the row for log1p (rare: dominant targets in short rows).
    if (xt == m && s < 2.f) {
        float rest = 0.f, c = 0.f;
        for (int j = lane; j < C; j += 32) {
            const float v = ld_scalar(xrow + j);
            if (v == m) c += 1.f;
            else rest += expf(v - m);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            rest += __shfl_xor_sync(0xffffffffu, rest, o);
            c += __shfl_xor_sync(0xffffffffu, c, o);
        }
        loss = log1pf(rest + (c - 1.f));
    }

    // Mean, level 1: the last row of a chunk of kRowsPerChunk rows sums the chunk in row order.
    const int chunk = static_cast<int>(row / kRowsPerChunk);
    const int64_t c0 = static_cast<int64_t>(chunk) * kRowsPerChunk;
    const int nrows = static_cast<int>(min(static_cast<int64_t>(kRowsPerChunk), M - c0));
    if (poll) {
        // sent: [0, 2*nchunks) chunk sums (double), [2*nchunks, +M) row losses.
        unsigned long long* psum = reinterpret_cast<unsigned long long*>(sent);
        uint32_t* ploss = sent + 2 * nchunks;
        if (lane == 0) st_relaxed(ploss + row, pub_bits(loss));
        if (row != c0 + nrows - 1) return;
        bool ok = true;
        double a = poll_sum(ploss + c0, nrows, ok);
        if (!__all_sync(0xffffffffu, ok)) a = NAN;
        if (lane == 0) st_relaxed(psum + chunk, pub_bits(a));
        if (chunk != nchunks - 1) return;
        double tot = poll_sum(psum, nchunks, ok);
        if (!__all_sync(0xffffffffu, ok)) tot = NAN;
        if (lane == 0) {
            const float mean = static_cast<float>(tot / static_cast<double>(M));
            if constexpr (sizeof(T) == 2) *out = __float2bfloat16_rn(mean);
            else *out = mean;
        }
        return;
    }
    unsigned t2 = 0;
    if (lane == 0) {
        losses[row] = loss;
        t2 = atom_add_release(cnt + M + chunk, 1u);
    }
    t2 = __shfl_sync(0xffffffffu, t2, 0);
    if (t2 != static_cast<unsigned>(nrows - 1)) return;
    fence_acq_rel();
    double a = 0.0;
    for (int i = lane; i < nrows; i += 32) a += static_cast<double>(__ldcg(losses + c0 + i));
    a = warp_sum(a);

    // Level 2: the last chunk sums the chunk sums in chunk order.
    unsigned t3 = 0;
    if (lane == 0) {
        csum[chunk] = a;
        cnt[M + chunk] = 0u;
        t3 = atom_add_release(cnt + M + nchunks, 1u);
    }
    t3 = __shfl_sync(0xffffffffu, t3, 0);
    if (t3 != static_cast<unsigned>(nchunks - 1)) return;
    fence_acq_rel();
    double tot = 0.0;
    for (int i = lane; i < nchunks; i += 32) tot += __ldcg(csum + i);
    tot = warp_sum(tot);
    if (lane == 0) {
        const float mean = static_cast<float>(tot / static_cast<double>(M));
        if constexpr (sizeof(T) == 2) *out = __float2bfloat16_rn(mean);
        else *out = mean;
        cnt[M + nchunks] = 0u;
    }
}

}  // namespace ce_v4
"""

_host_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
#include <algorithm>
#include <limits>

namespace ce_v4 {

struct Cfg { int threads, vpt, rows; };

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static bool cfg_of(int v, Cfg& c) {
    switch (v) {
#define CE_V4_CFG(id, TH, VP, MB, RW) case id: c = Cfg{TH, VP, RW}; return true;
        CE_V4_VARIANTS(CE_V4_CFG)
#undef CE_V4_CFG
        default: return false;
    }
}

template <typename T, bool kVec, int TH, int VP, int MB, int RW>
static void launch_one(int64_t grid, cudaStream_t st, const T* x, const int64_t* t, int64_t M, int C, int U, int P,
                       int su, float2* pairs, float* xts, float* losses, double* csum, unsigned* cnt, int nchunks,
                       int hint, int poll, uint32_t* sent, T* out) {
    ce_v4_kernel<T, kVec, TH, VP, MB, RW><<<static_cast<unsigned>(grid), TH, 0, st>>>(
        x, t, M, C, U, P, su, pairs, xts, losses, csum, cnt, nchunks, hint, poll, sent, out);
}

template <typename T>
static void launch_variant(int v, int64_t grid, cudaStream_t st, const T* x, const int64_t* t, int64_t M, int C,
                           int U, int P, int su, float2* pairs, float* xts, float* losses, double* csum,
                           unsigned* cnt, int nchunks, int hint, int poll, uint32_t* sent, T* out) {
    switch (v) {
#define CE_V4_LAUNCH(id, TH, VP, MB, RW) \
        case id: launch_one<T, true, TH, VP, MB, RW>(grid, st, x, t, M, C, U, P, su, pairs, xts, losses, csum, cnt, nchunks, hint, poll, sent, out); break;
        CE_V4_VARIANTS(CE_V4_LAUNCH)
#undef CE_V4_LAUNCH
        default:  // unaligned rows: 1-element units
            launch_one<T, false, CE_V4_SCALAR_CFG>(grid, st, x, t, M, C, U, P, su, pairs, xts, losses, csum, cnt, nchunks, hint, poll, sent, out);
    }
}

// Auto choices (variant 0, flags 0) per row class: predictions (docs/perf-notes/cross_entropy.md), to
// be set from the bench sweep (benchmarks/bench_ce_v4.py).
constexpr int kAutoF32Short = 6;   // fp32, rows <= 2048 units (32 KB): 32768x4096 -> 128 x 8, 1 segment
constexpr int kAutoF32Long = 2;    // fp32, longer rows: 8192x32000 -> 256 x 8, 4 segments of 31 KB
constexpr int kAutoBf16Mid = 2;    // bf16, rows <= 4096 units (64 KB): 32768x32000 -> 256 x 8, 2 segments
constexpr int kAutoBf16Long = 2;   // bf16, longer rows: 4096x128256 -> 256 x 8, 8 segments
constexpr int kAutoHint = 1;       // 1 plain, 2 ld.global.nc.L1::no_allocate, 3 same + .L2::256B
constexpr int kAutoMean = 1;       // 1 tickets (atomics) for the mean, 2 poll mode (published values; assumes in-order dispatch)

}  // namespace ce_v4

// counters: int32, >= M + ceil(M/256) + 1 elements, all zero (the kernel leaves them zero again).
// sentinels: int32, >= M + 2*ceil(M/256) elements, all -1 (poll mode leaves them -1 again).
// variant: 0 = auto, else a CE_V4_VARIANTS id (aligned rows only; unaligned rows always use the
// 1-element path). flags: bits 0-1 load hint (0 auto, 1 plain, 2 nc, 3 nc + L2::256B); bit 2 fresh
// counters / sentinels allocated for this call (plus fill kernels) instead of the cached ones; bits 3-4
// mean mode (0 auto, 1 tickets, 2 poll).
torch::Tensor cross_entropy_fast_v4(torch::Tensor logits, torch::Tensor targets, torch::Tensor counters,
                                    torch::Tensor sentinels, int64_t variant, int64_t flags) {
    using namespace ce_v4;
    TORCH_CHECK(logits.is_cuda() && targets.is_cuda(), "cross_entropy: inputs must be CUDA tensors");
    TORCH_CHECK(logits.dim() == 2, "cross_entropy: logits must be 2-D [M, C]");
    TORCH_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0), "cross_entropy: targets must be [M]");
    const bool bf16 = logits.scalar_type() == at::kBFloat16;
    TORCH_CHECK(bf16 || logits.scalar_type() == at::kFloat, "cross_entropy: logits must be float32 or bfloat16");
    TORCH_CHECK(!targets.is_floating_point() && !targets.is_complex(), "cross_entropy: targets must be integer");
    TORCH_CHECK(targets.device() == logits.device(), "cross_entropy: inputs on different devices");
    const c10::cuda::CUDAGuard guard(logits.device());
    auto x = logits.contiguous();
    auto t = targets.to(at::kLong).contiguous();
    const int64_t M = x.size(0), C = x.size(1);
    const int64_t E = x.element_size();
    if (M == 0) return torch::full({}, std::numeric_limits<double>::quiet_NaN(), x.options());  // mean of nothing
    TORCH_CHECK(C > 0, "cross_entropy: need at least one class");
    TORCH_CHECK(C * E < (int64_t(1) << 30), "cross_entropy: row too long for 32-bit indexing");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(x.data_ptr()) % E == 0, "cross_entropy: logits not element-aligned");

    const bool vec = (C * E) % 16 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
    const int64_t U = vec ? C * E / 16 : C;
    int v = 0;
#define CE_V4_CFG_OF(TH, VP, MB, RW) Cfg{TH, VP, RW}
#define CE_V4_APPLY(m, ...) m(__VA_ARGS__)
    Cfg cfg = CE_V4_APPLY(CE_V4_CFG_OF, CE_V4_SCALAR_CFG);  // unaligned rows
    if (vec) {
        v = static_cast<int>(variant);
        if (v == 0) {
            if (bf16) v = U <= 4096 ? kAutoBf16Mid : kAutoBf16Long;
            else v = U <= 2048 ? kAutoF32Short : kAutoF32Long;
        }
        TORCH_CHECK(cfg_of(v, cfg), "cross_entropy: unknown variant ", v);
    }
    const int64_t SEG = static_cast<int64_t>(cfg.threads / cfg.rows) * cfg.vpt;
    const int64_t P = cdiv(U, SEG);
    const int64_t su = cdiv(U, P);  // balanced segments (each <= SEG)
    const int64_t nseg = M * P;
    const int64_t grid = cdiv(nseg, cfg.rows);
    TORCH_CHECK(grid <= std::numeric_limits<int32_t>::max() && P <= std::numeric_limits<int32_t>::max(),
                "cross_entropy: too many rows");
    const int64_t nchunks = cdiv(M, 256);
    const int64_t ncnt = M + nchunks + 1;

    int hint = static_cast<int>(flags & 3);
    if (hint == 0) hint = kAutoHint;
    hint -= 1;  // kernel: 0 plain, 1 nc, 2 nc + L2::256B

    int mean_mode = static_cast<int>((flags >> 3) & 3);
    if (mean_mode == 0) mean_mode = kAutoMean;
    const int poll = mean_mode == 2 ? 1 : 0;
    const int64_t nsent = M + 2 * nchunks;

    torch::Tensor cnt, sent;
    if (flags & 4) {
        cnt = torch::zeros({ncnt}, x.options().dtype(at::kInt));
        if (poll) sent = torch::full({nsent}, -1, x.options().dtype(at::kInt));
    } else {
        TORCH_CHECK(counters.is_cuda() && counters.device() == x.device() && counters.scalar_type() == at::kInt &&
                    counters.is_contiguous() && counters.numel() >= ncnt,
                    "cross_entropy: counters must be a zeroed int32 CUDA tensor of >= ", ncnt, " elements");
        cnt = counters;
        if (poll) {
            TORCH_CHECK(sentinels.is_cuda() && sentinels.device() == x.device() &&
                        sentinels.scalar_type() == at::kInt && sentinels.is_contiguous() &&
                        sentinels.numel() >= nsent && reinterpret_cast<uintptr_t>(sentinels.data_ptr()) % 8 == 0,
                        "cross_entropy: sentinels must be an all -1 int32 CUDA tensor of >= ", nsent, " elements");
            sent = sentinels;
        }
    }
    uint32_t* sentp = poll ? reinterpret_cast<uint32_t*>(sent.data_ptr<int>()) : nullptr;
    // One float workspace: csum (double, first: 8-byte aligned) | pairs (float2) | xts | losses
    // (csum and losses only in ticket mode).
    const int64_t npair = P > 1 ? nseg : 0, nxt = P > 1 ? M : 0;
    const int64_t ncs = poll ? 0 : nchunks, nls = poll ? 0 : M;
    auto ws = torch::empty({std::max<int64_t>(1, 2 * ncs + 2 * npair + nxt + nls)}, x.options().dtype(at::kFloat));
    float* wsp = ws.data_ptr<float>();
    double* csum = reinterpret_cast<double*>(wsp);
    float2* pairs = reinterpret_cast<float2*>(wsp + 2 * ncs);
    float* xts = wsp + 2 * ncs + 2 * npair;
    float* losses = xts + nxt;
    unsigned* cntp = reinterpret_cast<unsigned*>(cnt.data_ptr<int>());

    auto out = torch::empty({}, x.options());
    auto stream = at::cuda::getCurrentCUDAStream();
    const int64_t* tp = t.data_ptr<int64_t>();
    if (bf16) {
        using B = __nv_bfloat16;
        launch_variant<B>(v, grid, stream, reinterpret_cast<const B*>(x.data_ptr()), tp, M, static_cast<int>(C),
                          static_cast<int>(U), static_cast<int>(P), static_cast<int>(su), pairs, xts, losses, csum, cntp,
                          static_cast<int>(nchunks), hint, poll, sentp, reinterpret_cast<B*>(out.data_ptr()));
    } else {
        launch_variant<float>(v, grid, stream, x.data_ptr<float>(), tp, M, static_cast<int>(C), static_cast<int>(U),
                              static_cast<int>(P), static_cast<int>(su), pairs, xts, losses, csum, cntp,
                              static_cast<int>(nchunks), hint, poll, sentp, out.data_ptr<float>());
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(
    name="cross_entropy_fast_v4",
    cpp_sources=_cpp_src,
    cuda_sources=_kernel_src + _host_src,
    functions=["cross_entropy_fast_v4"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)

# Per device: a cached int32 counter block (all 0 between launches: each counter is reset by the
# arrival that completes it) and a cached sentinel block for poll mode (all -1 between launches: each
# slot is reset by its reader). Grown on demand. One call at a time per device, as fast.py / fast_v3.py.
_counters = {}
_sentinels = {}


def _cached(store, device, need, fill):
    key = (device.type, device.index)
    c = store.get(key)
    if c is None or c.numel() < need:
        n = max(need, 2 * (c.numel() if c is not None else 0), 4096)
        c = torch.full((n,), fill, dtype=torch.int32, device=device)
        store[key] = c
    return c


def _counter(device: torch.device, M: int) -> torch.Tensor:
    return _cached(_counters, device, M + (M + 255) // 256 + 1, 0)


def _sentinel(device: torch.device, M: int) -> torch.Tensor:
    return _cached(_sentinels, device, M + 2 * ((M + 255) // 256), -1)


def run(logits: torch.Tensor, targets: torch.Tensor, variant: int = 0, flags: int = 0) -> torch.Tensor:
    M = logits.shape[0] if logits.dim() > 0 else 0
    return _ext.cross_entropy_fast_v4(logits, targets, _counter(logits.device, M), _sentinel(logits.device, M),
                                      variant, flags)


# Knobs (0 = auto, see kAuto* in the host code): thread-group variant id; flags bits 0-1 load hint,
# bit 2 fresh counters per call, bits 3-4 mean mode (8 = tickets, 16 = poll). bench_ce_v4.py sweeps them.
VARIANT = 0
FLAGS = 0


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return run(logits, targets, VARIANT, FLAGS)
