"""Cross-entropy (mean reduction) in one launch: rows cut into pieces, one TMA bulk copy per warp.

- Pieces: every row's 16-byte-aligned middle is cut into P pieces, one short-lived CTA each, launched in row
  order. A CTA has W warps (8; fewer for short rows); each warp moves its part (at most 8 KB) with one
  `cp.async.bulk` into its own slot of shared memory, waits on its own mbarrier, and runs the online (max, sum)
  over it; thread 0 merges the warps and stores one (max, sum) per piece. Piece CTAs never wait for anything:
  the block scheduler starts the next pieces as CTAs end, so the pieces in flight move through memory as one
  front.
- Odd widths and unaligned rows: the first warp of piece 0 reads the scalar head (the elements before the row's
  first 16-byte boundary) and tail (those after its last) and folds them in; a row too short for an aligned
  middle is all head and tail. The CTA whose bytes hold x[r, t_r] stores it (piece 0 when it lies in the head
  or tail); an out-of-range target gives NaN.
- The end: the grid's last CTAs, one row per lane, at most half of the CTAs the GPU holds at once, so the pieces
  they wait for always find room to run whatever order CTAs start in. They merge each row's pieces in piece
  order, form (max - x_t) + log(sum), and sum their rows in a fixed order; the last end CTA adds the end CTAs'
  sums in index order and writes the mean, in float32 for bfloat16 logits too.
- Slots that say when they are full: every value the end reads sits in a slot holding 0xffffffff until written.
  A writer stores once (relaxed; a (max, sum) pair as one 64-bit store, seen whole or not at all) and exits, with
  no fence and no atomic. A reader polls, takes the value and writes 0xffffffff back, so every call finds the
  slots empty (a per-device buffer filled once, grown on demand). No stored value is 0xffffffff: NaNs are
  stored as the canonical 0x7fffffff.
- Numerics: float32 takes exp2 of the exact (x - m) * log2e; bfloat16 the FMA form x * log2e - m * log2e and
  packed bf16 maxima. An all -inf row never forms -inf - -inf. NaN logits propagate. Where the target is the row
  max and the rest sums to < 1, log(sum) would lose the loss's digits: the warp re-reads the row and takes
  log1p of the rest. Every sum has a fixed order and there are no float atomics, so the loss is bit-identical
  from call to call.
- Waits are bounded (2 s of %globaltimer): a schedule bug gives NaN, not a hung GPU.
- Limits (checked): row bytes < 2^31, M * (P + 1) CTAs < 2^31. Calls that run concurrently on different streams
  of one device are not supported (they would share the slots).
"""
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# PTX helpers shared with other problems' solutions (mbarriers, exp2, clocks): put before _kernel_src.
_ptx_src = (Path(__file__).resolve().parents[1] / "_ptx.cuh").read_text()

_cpp_src = r"""
#include <torch/extension.h>
torch::Tensor cross_entropy_tma_pieces(torch::Tensor logits, torch::Tensor targets);
"""

# Device code only (no torch headers; it follows _ptx_src), so it can also be compiled alone with nvcc.
_kernel_src = r"""
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>

namespace ce_v3 {

constexpr int kMaxWarps = 16;               // warps per CTA: the launch bound (the plan takes at most this)
constexpr int kU = 4;                       // 16-byte vectors per lane per step
constexpr int kStepVec = 32 * kU;           // vectors per warp per step (2 KB)
constexpr float kLog2e = 1.4426950408889634f;
constexpr unsigned long long kWaitLimitNs = 2000000000ull;  // a correct wait is microseconds

// ex2, smem_addr, global_ns and the mbarrier calls are solutions/_ptx.cuh's.
// ---------------------------------------------------------------- bounded mbarrier wait / bulk copy
// false only if the phase did not complete within kWaitLimitNs (a bug): the caller turns that into NaN.
__device__ __forceinline__ bool mbar_wait_slow(uint32_t bar, uint32_t parity) {
    const unsigned long long t0 = global_ns();
    while (true) {
        if (mbar_try(bar, parity)) return true;
        if (global_ns() - t0 > kWaitLimitNs) return false;
    }
}
__device__ __forceinline__ bool mbar_wait(uint32_t bar, uint32_t parity) {
    return mbar_try(bar, parity) || mbar_wait_slow(bar, parity);
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// ---------------------------------------------------------------- per-dtype step math
__device__ __forceinline__ uint32_t bmax2(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

template <bool kBf16> struct Traits;

template <> struct Traits<false> {  // float32
    static constexpr int kVec = 4, kElem = 4;
    static __device__ __forceinline__ uint4 neg_inf() {
        const uint32_t n = 0xff800000u;
        return make_uint4(n, n, n, n);
    }
    static __device__ __forceinline__ float scalar(const char* row, int64_t j) {
        return __ldg(reinterpret_cast<const float*>(row) + j);
    }
    static __device__ __forceinline__ float step_max(const uint4 (&v)[kU]) {
        float p[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u)
            p[u] = fmaxf(fmaxf(__uint_as_float(v[u].x), __uint_as_float(v[u].y)),
                         fmaxf(__uint_as_float(v[u].z), __uint_as_float(v[u].w)));
#pragma unroll
        for (int st = 1; st < kU; st *= 2)
#pragma unroll
            for (int u = 0; u < kU; u += 2 * st) p[u] = fmaxf(p[u], p[u + st]);
        return p[0];
    }
    // fp32 needs the exact subtraction (x - m) before scaling: folding m*log2e into an FMA would put
    // a per-row rounding error of ~1e-5 into the exponent.
    static __device__ __forceinline__ float step_sum(const uint4 (&v)[kU], float mref) {
        float p[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u)
            p[u] = (ex2((__uint_as_float(v[u].x) - mref) * kLog2e) + ex2((__uint_as_float(v[u].y) - mref) * kLog2e)) +
                   (ex2((__uint_as_float(v[u].z) - mref) * kLog2e) + ex2((__uint_as_float(v[u].w) - mref) * kLog2e));
#pragma unroll
        for (int st = 1; st < kU; st *= 2)
#pragma unroll
            for (int u = 0; u < kU; u += 2 * st) p[u] += p[u + st];
        return p[0];
    }
};

template <> struct Traits<true> {  // bfloat16
    static constexpr int kVec = 8, kElem = 2;
    static __device__ __forceinline__ uint4 neg_inf() {
        const uint32_t n = 0xff80ff80u;
        return make_uint4(n, n, n, n);
    }
    static __device__ __forceinline__ float scalar(const char* row, int64_t j) {
        const unsigned short b = __ldg(reinterpret_cast<const unsigned short*>(row) + j);
        return __uint_as_float(static_cast<uint32_t>(b) << 16);
    }
    // Max on packed pairs halves the work; bf16 -> fp32 is exact.
    static __device__ __forceinline__ float step_max(const uint4 (&v)[kU]) {
        uint32_t p[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) p[u] = bmax2(bmax2(v[u].x, v[u].y), bmax2(v[u].z, v[u].w));
#pragma unroll
        for (int st = 1; st < kU; st *= 2)
#pragma unroll
            for (int u = 0; u < kU; u += 2 * st) p[u] = bmax2(p[u], p[u + st]);
        return fmaxf(bf_lo(p[0]), bf_hi(p[0]));
    }
    static __device__ __forceinline__ float pair(uint32_t w, float nb) {
        return ex2(fmaf(bf_lo(w), kLog2e, nb)) + ex2(fmaf(bf_hi(w), kLog2e, nb));
    }
    // bf16 tolerance allows the FMA form (one op less per element).
    static __device__ __forceinline__ float step_sum(const uint4 (&v)[kU], float mref) {
        const float nb = -mref * kLog2e;
        float p[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u)
            p[u] = (pair(v[u].x, nb) + pair(v[u].y, nb)) + (pair(v[u].z, nb) + pair(v[u].w, nb));
#pragma unroll
        for (int st = 1; st < kU; st *= 2)
#pragma unroll
            for (int u = 0; u < kU; u += 2 * st) p[u] += p[u + st];
        return p[0];
    }
};

// -inf max (nothing seen yet, or an all -inf row) must not turn into (-inf) - (-inf) = NaN.
__device__ __forceinline__ float safe_ref(float m) { return m == -INFINITY ? 0.f : m; }

// One step of the online (max, sum): kU vectors per lane.
template <bool kBf16>
__device__ __forceinline__ void online_step(const uint4 (&v)[kU], float& m, float& s) {
    const float mn = fmaxf(m, Traits<kBf16>::step_max(v));
    const float mr = safe_ref(mn);
    s = s * ex2((m - mr) * kLog2e) + Traits<kBf16>::step_sum(v, mr);
    m = mn;
}

// A row: scalar head up to the first 16-byte boundary, `nbytes` of 16-byte-aligned middle (what the
// bulk copies move), scalar tail. Every piece of a row derives the same split from this.
template <bool kBf16>
__device__ __forceinline__ void row_geom(const char* logits, int64_t r, int C, const char*& row, int& head,
                                         uint32_t& nbytes) {
    constexpr int V = Traits<kBf16>::kVec, E = Traits<kBf16>::kElem;
    row = logits + r * static_cast<int64_t>(C) * E;
    const int mis = static_cast<int>((reinterpret_cast<uintptr_t>(row) & 15) / E);
    head = mis ? min(V - mis, C) : 0;
    nbytes = static_cast<uint32_t>((C - head) / V) * 16u;
}

// ---------------------------------------------------------------- pieces: CTAs in row order
// Every row's aligned middle is cut into P pieces, one CTA each (grid M * P, in row order), W warps per CTA,
// each warp one part of `part_bytes` moved by one bulk copy into its own slot of shared memory. A CTA reads
// its piece once, reduces it to one (max, sum) and exits; the block scheduler starts the next pieces as CTAs
// end, so the pieces in flight move through memory as one front. Piece CTAs never wait for each other or for
// anything else: the grid's last CTAs are the end, which takes each row's pieces from slots (below) as they
// are filled, finishes the rows and forms the mean.

// (m, s) pairs in index order -> one (m, s): the max first, then each sum rescaled to it.
__device__ __forceinline__ void merge_pairs(const float2* ms, int n, float& m, float& s) {
    m = -INFINITY;
    for (int i = 0; i < n; ++i) m = fmaxf(m, ms[i].x);
    const float mr = safe_ref(m);
    s = 0.f;
    for (int i = 0; i < n; ++i) s += ms[i].y * ex2((ms[i].x - mr) * kLog2e);
}

// One warp: the summed losses of rows [g0, g1) from their pieces' (max, sum) and target logits, each lane
// its rows in order, then a fixed butterfly (every lane gets the sum). loss = (max - x[t]) + log(sum), or,
// where the target is the max and the rest sums to < 1 (log(sum) would lose a tiny loss's digits), the
// warp re-reads the row for log1p.
// fetch(r, m, s, xt) gives row r's merged (max, sum) and its target logit.
template <bool kBf16, class Fetch>
__device__ __forceinline__ float group_loss(Fetch&& fetch, const char* __restrict__ logits, int C, int64_t g0,
                                            int64_t g1) {
    using Tr = Traits<kBf16>;
    const int lane = threadIdx.x & 31;
    float acc = 0.f;
    for (int64_t base = g0; base < g1; base += 32) {
        const int64_t r = base + lane;
        float loss = 0.f, m = 0.f, s = 2.f, xt = 0.f;
        if (r < g1) {
            fetch(r, m, s, xt);
            loss = (m - xt) + logf(s);
        }
        unsigned int tiny = __ballot_sync(0xffffffffu, r < g1 && xt == m && s < 2.f);
        while (tiny) {
            const int src = __ffs(tiny) - 1;
            tiny &= tiny - 1;
            const int64_t rr = __shfl_sync(0xffffffffu, r, src);
            const float mm = __shfl_sync(0xffffffffu, m, src);
            const char* row = logits + rr * static_cast<int64_t>(C) * Tr::kElem;
            float rest = 0.f, cnt = 0.f;
            for (int j = lane; j < C; j += 32) {
                const float x = Tr::scalar(row, j);
                if (x == mm) cnt += 1.f;
                else rest += expf(x - mm);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                rest += __shfl_xor_sync(0xffffffffu, rest, o);
                cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
            }
            if (lane == src) loss = log1pf(rest + (cnt - 1.f));
        }
        acc += loss;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return acc;
}

// ---------------------------------------------------------------- slots that say when they are full
// The end's inputs travel through slots: a piece's (max, sum), a row's target logit, an end CTA's loss sum.
// A slot holds kEmpty until it is written; its reader waits for a value, takes it and puts kEmpty back, so the
// next call finds every slot empty again. A writer stores and goes on: no fence and no atomic hold its CTA
// (with its shared memory) for a round trip. A 64-bit store is seen whole or not at all, and
// no stored value is kEmpty (NaNs are stored as the canonical 0x7fffffff). Waits are bounded (NaN after
// kWaitLimitNs, a bug). The end CTAs that wait for the pieces are at most half of the CTAs the pieces kernel can
// hold at once, so the pieces they wait for always find room to run, whatever order the CTAs start in.
constexpr uint32_t kEmpty = 0xffffffffu;
constexpr uint64_t kEmpty64 = ~0ull;
constexpr unsigned kPollSleepNs = 32;  // a poll that finds its slot empty sleeps this long before the next
__device__ __forceinline__ uint32_t canon_bits(float v) { return v != v ? 0x7fffffffu : __float_as_uint(v); }
__device__ __forceinline__ void put_b32(uint32_t* p, uint32_t v) {
    asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void put_b64(uint64_t* p, uint64_t v) {
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint32_t get_b32(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ uint64_t get_b64(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ bool empty64(uint64_t v) { return static_cast<uint32_t>(v >> 32) == kEmpty; }
// A (max, sum) pair: max in the low word, sum (the word that is kEmpty while the slot is empty) in the high.
__device__ __forceinline__ uint64_t pack_ms(float m, float s) {
    return (static_cast<uint64_t>(canon_bits(s)) << 32) | __float_as_uint(m);
}
// Row r's pieces, merged four at a time in piece order, and its target logit, each slot waited for and emptied.
// The loads of a round are issued together, and so are the re-reads of the slots that were still empty: a row
// costs one round trip once its last slot is full.
__device__ __forceinline__ void take_row(uint64_t* __restrict__ part, uint32_t* __restrict__ xts, int P, int64_t r,
                                         float& m, float& s, float& xt) {
    constexpr uint64_t kNoPiece = 0xff800000ull;                             // (max -inf, sum 0)
    constexpr uint64_t kLost = static_cast<uint64_t>(0x7fffffffu) << 32;  // (max 0, sum NaN): a wait timed out
    uint32_t xb = get_b32(xts + r);
    m = -INFINITY;
    s = 0.f;
    for (int i = 0; i < P; i += 4) {
        uint64_t* at = part + r * P + i;
        uint64_t v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u)
            v[u] = i + u >= P ? kNoPiece : get_b64(at + u);
        unsigned long long t0 = 0;
        while (xb == kEmpty || empty64(v[0]) || empty64(v[1]) || empty64(v[2]) || empty64(v[3])) {
            if (t0 == 0) t0 = global_ns();
            const bool lost = global_ns() - t0 > kWaitLimitNs;
            if (!lost) __nanosleep(kPollSleepNs);
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (empty64(v[u])) v[u] = lost ? kLost : get_b64(at + u);
            if (xb == kEmpty) xb = lost ? 0x7fffffffu : get_b32(xts + r);
        }
        float cm = m;
#pragma unroll
        for (int u = 0; u < 4; ++u) cm = fmaxf(cm, __uint_as_float(static_cast<uint32_t>(v[u])));
        const float mr = safe_ref(cm);
        float cs = s * ex2((m - mr) * kLog2e);
#pragma unroll
        for (int u = 0; u < 4; ++u)
            cs += __uint_as_float(static_cast<uint32_t>(v[u] >> 32)) *
                  ex2((__uint_as_float(static_cast<uint32_t>(v[u])) - mr) * kLog2e);
        m = cm;
        s = cs;
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (i + u < P) put_b64(at + u, kEmpty64);
    }
    xt = __uint_as_float(xb);
    put_b32(xts + r, kEmpty);
}

// End CTA e of nend, the last CTAs of the pieces grid: its warps take consecutive blocks of rows (group_loss), the
// CTA's loss sum goes to slot sums[e], and the last end CTA adds the sums in order into the mean. The other end
// CTAs hold earlier rows, so they are usually done first: the last one sends the loads of their sums out before
// its own rows and waits for them (all together) after. `scratch`: 2 * nwarps floats. Not inlined, so that the
// pieces' own code (registers, no call frame) is what it would be without the end.
template <bool kBf16>
__device__ __noinline__ void end_cta(uint64_t* __restrict__ part, uint32_t* __restrict__ xts,
                                     uint32_t* __restrict__ sums, const char* __restrict__ logits, int64_t M, int C,
                                     int P, int e, int nend, float* scratch, void* __restrict__ out) {
    constexpr int kB = 8;  // sums per thread per round
    const int nwarps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nt = blockDim.x;
    const bool last = e == nend - 1;
    const int nother = nend - 1;
    uint32_t b[kB];
#pragma unroll
    for (int u = 0; u < kB; ++u) b[u] = last && threadIdx.x + u * nt < nother ? get_b32(sums + threadIdx.x + u * nt) : 0u;

    const int64_t all_warps = static_cast<int64_t>(nend) * nwarps, rpw = (M + all_warps - 1) / all_warps;
    const int64_t g0 = min(M, (static_cast<int64_t>(e) * nwarps + warp) * rpw), g1 = min(M, g0 + rpw);
    auto fetch = [&](int64_t r, float& m, float& s, float& xt) { take_row(part, xts, P, r, m, s, xt); };
    const float wsum = group_loss<kBf16>(fetch, logits, C, g0, g1);

    float others = 0.f;  // the last CTA: the other CTAs' sums, this thread's share in index order, then a butterfly
    if (last) {
        for (int i0 = threadIdx.x; i0 < nother; i0 += kB * nt) {
            if (i0 != static_cast<int>(threadIdx.x)) {
#pragma unroll
                for (int u = 0; u < kB; ++u) b[u] = i0 + u * nt < nother ? get_b32(sums + i0 + u * nt) : 0u;
            }
            unsigned long long t0 = 0;
            while (true) {
                bool pending = false;
#pragma unroll
                for (int u = 0; u < kB; ++u) pending |= i0 + u * nt < nother && b[u] == kEmpty;
                if (!pending) break;
                if (t0 == 0) t0 = global_ns();
                const bool lost = global_ns() - t0 > kWaitLimitNs;
                if (!lost) __nanosleep(kPollSleepNs);
#pragma unroll
                for (int u = 0; u < kB; ++u)
                    if (i0 + u * nt < nother && b[u] == kEmpty) b[u] = lost ? 0x7fffffffu : get_b32(sums + i0 + u * nt);
            }
#pragma unroll
            for (int u = 0; u < kB; ++u) {
                if (i0 + u * nt >= nother) continue;
                others += __uint_as_float(b[u]);
                put_b32(sums + i0 + u * nt, kEmpty);
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) others += __shfl_xor_sync(0xffffffffu, others, o);
    }
    if (lane == 0) {
        scratch[warp] = wsum;
        scratch[nwarps + warp] = others;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    float cta = 0.f;
    for (int w = 0; w < nwarps; ++w) cta += scratch[w];
    if (!last) {
        put_b32(sums + e, canon_bits(cta));
        return;
    }
    float all = 0.f;
    for (int w = 0; w < nwarps; ++w) all += scratch[nwarps + w];
    all += cta;
    const float mean = static_cast<float>(static_cast<double>(all) / static_cast<double>(M));
    *reinterpret_cast<float*>(out) = mean;  // float32 for bf16 logits too (problem.yaml output_dtype)
}

// Slot part[b] = (max, sum) of piece b = r * P + q; slot xts[r] = x[r, t_r] (NaN for an out-of-range target),
// written by the CTA whose piece holds it (piece 0 for the scalar head and tail outside the aligned middle). The
// grid's last nend CTAs are the end (end_cta).
template <bool kBf16>
__global__ void __launch_bounds__(kMaxWarps * 32)
ce_v3_pieces_kernel(const char* __restrict__ logits, const int64_t* __restrict__ targets, int64_t M, int C, int P,
                    uint32_t part_bytes, uint64_t* __restrict__ part, uint32_t* __restrict__ xts,
                    uint32_t* __restrict__ sums, int nend, void* __restrict__ out) {
    using Tr = Traits<kBf16>;
    constexpr int V = Tr::kVec, E = Tr::kElem;
    extern __shared__ __align__(128) unsigned char slots[];  // [warp][part_bytes]
    __shared__ __align__(8) uint64_t bars[kMaxWarps];
    __shared__ float2 warp_ms[kMaxWarps];
    const int64_t e = static_cast<int64_t>(blockIdx.x) - M * P;
    if (e >= 0) {
        end_cta<kBf16>(part, xts, sums, logits, M, C, P, static_cast<int>(e), nend, reinterpret_cast<float*>(warp_ms),
                       out);
        return;
    }
    const int nwarps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r = blockIdx.x / P;
    const int q = static_cast<int>(blockIdx.x - r * P);
    const char* row;
    int head;
    uint32_t nb;
    row_geom<kBf16>(logits, r, C, row, head, nb);
    const uint32_t piece = part_bytes * static_cast<uint32_t>(nwarps);
    const uint32_t p0 = static_cast<uint32_t>(q) * piece;  // < 2^32: checked by the launcher
    const uint32_t off = min(nb, p0 + static_cast<uint32_t>(warp) * part_bytes);
    const uint32_t bytes = min(nb - off, part_bytes);
    const unsigned char* slot = slots + static_cast<uint32_t>(warp) * part_bytes;
    const uint32_t bar = smem_addr(&bars[warp]);
    if (lane == 0 && bytes) {
        mbar_init(bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        mbar_arrive_expect_tx(bar, bytes);
        bulk_g2s(smem_addr(slot), row + head * E + off, bytes, bar);
    }
    const int64_t t = threadIdx.x == 0 ? __ldg(targets + r) : 0;  // used by thread 0 after the reduction
    const int tail0 = head + static_cast<int>(nb / 16u) * V;
    float ha = -INFINITY, tb = -INFINITY;
    if (q == 0 && warp == 0) {
        if (lane < head) ha = Tr::scalar(row, lane);
        if (lane < C - tail0) tb = Tr::scalar(row, tail0 + lane);
    }
    __syncwarp();

    float m = -INFINITY, s = 0.f;
    if (bytes) {
        const bool ok = __all_sync(0xffffffffu, mbar_wait(bar, 0));
        const uint4* v4 = reinterpret_cast<const uint4*>(slot);
        const int nv = static_cast<int>(bytes / 16u);
        if (ok) {
            for (int b = 0; b < nv; b += kStepVec) {
                uint4 v[kU];
#pragma unroll
                for (int u = 0; u < kU; ++u) {
                    const int idx = b + u * 32 + lane;
                    v[u] = idx < nv ? v4[idx] : Tr::neg_inf();
                }
                online_step<kBf16>(v, m, s);
            }
        } else {
            s = NAN;  // a copy never completed (bug): the loss becomes NaN
        }
    }
    {
        const float mn = fmaxf(m, fmaxf(ha, tb)), mr = safe_ref(mn);
        s = s * ex2((m - mr) * kLog2e) + (ex2((ha - mr) * kLog2e) + ex2((tb - mr) * kLog2e));
        m = mn;
    }
    float gm = m;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) gm = fmaxf(gm, __shfl_xor_sync(0xffffffffu, gm, o));
    s *= ex2((m - safe_ref(gm)) * kLog2e);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) warp_ms[warp] = make_float2(gm, s);
    __syncthreads();  // every warp's pair, and every slot's bytes, visible to thread 0
    if (threadIdx.x != 0) return;
    float cm, cs;
    merge_pairs(warp_ms, nwarps, cm, cs);
    auto put_xt = [&](float v) { put_b32(xts + r, canon_bits(v)); };
    put_b64(part + blockIdx.x, pack_ms(cm, cs));
    if (static_cast<uint64_t>(t) >= static_cast<uint64_t>(C)) {
        if (q == 0) put_xt(NAN);
    } else if (t < head || t >= tail0) {
        if (q == 0) put_xt(Tr::scalar(row, t));
    } else {
        const uint32_t bo = static_cast<uint32_t>(t - head) * E;  // byte of x[t] within the aligned middle
        if (bo >= p0 && bo - p0 < piece) {
            const unsigned char* at = slots + (bo - p0);  // slot w holds bytes [w * part_bytes, ...) of the piece
            put_xt(kBf16 ? __uint_as_float(static_cast<uint32_t>(*reinterpret_cast<const unsigned short*>(at)) << 16)
                         : *reinterpret_cast<const float*>(at));
        }
    }
}

// ---------------------------------------------------------------- launch choices (plain host C++, no torch)
// Shared by the extension and benchmarks/standalone/ce_stream.cu, so the bench times what the extension runs.

// The extension's shape of a piece: 8 warps, each one bulk copy of up to 8 KB (64 KB of shared memory per CTA).
constexpr int64_t kPartBytes = 8192;
constexpr int kPieceWarps = 8;

// The pieces schedule's shape: W warps per CTA (fewer for short rows), parts of about `target_part` bytes, P
// pieces per row; part_bytes <= target_part (a multiple of 16), so smem <= warps * target_part. Not applicable
// (p = 0) when the grid would be too large.
struct PiecesPlan {
    int p = 0, warps = 0;
    uint32_t part_bytes = 0;
    int64_t smem = 0;
};
inline PiecesPlan plan_pieces(int64_t M, int64_t C, int elem, int64_t target_part, int warps) {
    PiecesPlan pl;
    const int64_t nb = (C / (16 / elem)) * 16;  // the longest aligned middle a row can have (head 0)
    int64_t w = (nb + target_part - 1) / target_part;
    if (w > warps) w = warps;
    if (w < 1) w = 1;
    int64_t P = (nb + w * target_part - 1) / (w * target_part);
    if (P < 1) P = 1;
    const int64_t per = (nb + P * w - 1) / (P * w);
    if (M < 1 || M * P + M > 0x7fffffffll || nb >= (int64_t(1) << 31)) return pl;  // + M: room for end CTAs
    pl.p = static_cast<int>(P);
    pl.warps = static_cast<int>(w);
    pl.part_bytes = static_cast<uint32_t>(per < 16 ? 16 : (per + 15) / 16 * 16);
    pl.smem = w * static_cast<int64_t>(pl.part_bytes);
    return pl;
}
inline const void* pieces_kernel_fn(bool bf16) {
    return bf16 ? (const void*)ce_v3_pieces_kernel<true> : (const void*)ce_v3_pieces_kernel<false>;
}
// The end's CTAs: one row per lane where that keeps them to at most half of the `resident` CTAs the pieces
// kernel can hold at once (so the pieces they wait for always have room to run).
inline int64_t end_ctas(const PiecesPlan& pl, int64_t M, int64_t resident) {
    const int64_t want = (M + pl.warps * 32 - 1) / (pl.warps * 32), cap = resident / 2 > 0 ? resident / 2 : 1;
    return want < cap ? want : cap;
}
// Slot words the pieces schedule needs: part (M * P 64-bit), xts (M), sums (nend).
inline int64_t slot_words(const PiecesPlan& pl, int64_t M, int64_t nend) { return 2 * M * pl.p + M + nend; }
// One launch: the pieces and, as the grid's last nend CTAs, the end. `slots` holds slot_words words, every one
// kEmpty before the call (the call leaves them so). The caller has raised the kernel's dynamic shared memory
// limit to pl.smem.
inline cudaError_t launch_pieces(const PiecesPlan& pl, bool bf16, cudaStream_t stream, const char* logits,
                                 const int64_t* targets, int64_t M, int C, uint32_t* slots, int64_t nend, void* out) {
    uint64_t* part = reinterpret_cast<uint64_t*>(slots);
    uint32_t* xts = slots + 2 * M * pl.p;
    (bf16 ? ce_v3_pieces_kernel<true> : ce_v3_pieces_kernel<false>)
        <<<static_cast<unsigned>(M * pl.p + nend), pl.warps * 32, static_cast<size_t>(pl.smem), stream>>>(
            logits, targets, M, C, pl.p, pl.part_bytes, part, xts, xts + M, static_cast<int>(nend), out);
    return cudaGetLastError();
}

}  // namespace ce_v3
"""

_host_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
#include <map>
#include <tuple>

// The slots, per device: every word kEmpty (0xffffffff) between calls (the end CTAs empty what they read). Grown,
// never shrunk, kept for the process (leaked on purpose: no CUDA free after the runtime is gone). One per device:
// calls that run concurrently on different streams of one device are not supported.
static at::Tensor& pieces_slots(int dev, int64_t words, const at::TensorOptions& opt) {
    static std::map<int, at::Tensor*> slots;
    at::Tensor*& s = slots[dev];
    if (s == nullptr || s->numel() < words) {
        delete s;  // the caching allocator reuses the memory only for this stream's later work
        s = new at::Tensor(torch::full({words}, -1, opt.dtype(at::kInt)));
    }
    return *s;
}

torch::Tensor cross_entropy_tma_pieces(torch::Tensor logits, torch::Tensor targets) {
    using namespace ce_v3;
    TORCH_CHECK(logits.is_cuda() && targets.is_cuda(), "cross_entropy: inputs must be CUDA tensors");
    TORCH_CHECK(logits.dim() == 2, "cross_entropy: logits must be 2-D [M, C]");
    TORCH_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0), "cross_entropy: targets must be [M]");
    const bool bf16 = logits.scalar_type() == at::kBFloat16;
    TORCH_CHECK(bf16 || logits.scalar_type() == at::kFloat, "cross_entropy: logits must be float32 or bfloat16");
    TORCH_CHECK(!targets.is_floating_point() && !targets.is_complex(), "cross_entropy: targets must be integer");
    const c10::cuda::CUDAGuard guard(logits.device());
    auto x = logits.contiguous();
    auto t = targets.to(at::kLong).contiguous();
    const int64_t M = x.size(0), C = x.size(1);
    TORCH_CHECK(M > 0 && C > 0, "cross_entropy: need at least one row and one class");
    // Row bytes must fit the kernel's 32-bit byte offsets.
    TORCH_CHECK(C * x.element_size() < (int64_t(1) << 31), "cross_entropy: row too long for 32-bit offsets");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(x.data_ptr()) % x.element_size() == 0,
                "cross_entropy: logits not element-aligned");

    const int dev = x.get_device();
    const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
    // Headroom for the kernel's static shared memory.
    const int64_t max_dyn = static_cast<int64_t>(prop->sharedMemPerBlockOptin) - 2048;
    auto stream = at::cuda::getCurrentCUDAStream();
    auto out = torch::empty({}, x.options().dtype(at::kFloat));  // the loss is float32 for bf16 logits too

    const PiecesPlan pp = plan_pieces(M, C, x.element_size(), kPartBytes, kPieceWarps);
    TORCH_CHECK(pp.p > 0, "cross_entropy: ", M, " rows of ", C, " classes need more than 2^31 - 1 CTAs");
    TORCH_CHECK(pp.smem <= max_dyn, "cross_entropy: a piece needs more shared memory than a CTA can have");
    const void* k = pieces_kernel_fn(bf16);
    // Per (device, dtype): opt in to the largest dynamic shared memory once, all of L1 as shared memory (only the
    // few scalar loads use L1). Per (device, dtype, warps, shared memory): the occupancy the end's size rests on.
    static std::map<std::pair<int, bool>, bool> pieces_configured;
    if (!pieces_configured[std::make_pair(dev, bf16)]) {
        C10_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(max_dyn)));
        C10_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            cudaSharedmemCarveoutMaxShared));
        pieces_configured[std::make_pair(dev, bf16)] = true;
    }
    static std::map<std::tuple<int, bool, int, int64_t>, int> pieces_occ;
    int& n = pieces_occ[std::make_tuple(dev, bf16, pp.warps, pp.smem)];
    if (n == 0) {
        C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, pp.warps * 32, static_cast<size_t>(pp.smem)));
        TORCH_CHECK(n >= 1, "cross_entropy: pieces do not fit on an SM");
    }
    const int64_t nend = end_ctas(pp, M, static_cast<int64_t>(n) * prop->multiProcessorCount);
    at::Tensor& sl = pieces_slots(dev, slot_words(pp, M, nend), x.options());
    C10_CUDA_CHECK(launch_pieces(pp, bf16, stream, static_cast<const char*>(x.data_ptr()), t.data_ptr<int64_t>(), M,
                                 static_cast<int>(C), reinterpret_cast<uint32_t*>(sl.data_ptr<int32_t>()), nend,
                                 out.data_ptr()));
    return out;
}
"""

_ext = load_inline(
    name="cross_entropy_tma_pieces",
    cpp_sources=_cpp_src,
    cuda_sources=_ptx_src + _kernel_src + _host_src,
    functions=["cross_entropy_tma_pieces"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return _ext.cross_entropy_tma_pieces(logits, targets)
