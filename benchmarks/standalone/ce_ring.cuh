// The persistent per-warp TMA ring: the schedule the pieces (solutions/cross_entropy/tma_pieces.py) replaced, kept
// for the standalone bench to time beside them (ce_stream.cu). Include after ce_v3.cuh (the solution's device code,
// extracted by build.sh): it reuses that file's helpers (mbarriers, bulk copy, per-dtype step math, row geometry).
//
// A persistent grid; each warp streams a contiguous block of `rpw` rows through a PRIVATE ring of `stages` x `chunk`
// bytes in shared memory, one mbarrier per stage. Lane 0 keeps the ring full across row boundaries (a cursor walks the
// warp's (row, chunk) sequence `stages` chunks ahead of the consumer). kStage: every lane copies the whole chunk
// (<= 8 KB) to registers before the math, so the slot refills at once. The mean: per-CTA partials, a fence and an
// atomic ticket, the last CTA sums the partials in a fixed order and resets the ticket (`counter`, 0 between calls).
// Runtime switches (bench only): use_hint, an L2 evict_first policy on the copies; proxy_fence, a
// fence.proxy.async before each refill.
#pragma once
#include <stdint.h>

namespace ce_v3 {

constexpr int kMaxStages = 8;  // ring stages per warp
constexpr int kRegVec = 16;    // vectors per lane a staged chunk fills: chunks <= 8 KB

__device__ __forceinline__ uint64_t evict_first_policy() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
// TMA 1-D bulk copy global -> this CTA's smem; completion counted in bytes on `bar`.
__device__ __forceinline__ void bulk_g2s_hint(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                              uint64_t pol) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(pol) : "memory");
}

// kStage: move each chunk to registers before the math (see the loop). Its 16 vectors per lane need more
// than the 64 registers that two CTAs of 512 threads would leave.
template <bool kBf16, bool kStage>
__global__ void __launch_bounds__(kMaxWarps * 32, kStage ? 1 : 2)
ce_v3_kernel(const char* __restrict__ logits, const int64_t* __restrict__ targets, int64_t M, int C,
             int64_t rpw, int stages, uint32_t chunk, int use_hint, int proxy_fence, float* __restrict__ partials,
             unsigned int* __restrict__ counter, void* __restrict__ out) {
    using Tr = Traits<kBf16>;
    constexpr int V = Tr::kVec;
    extern __shared__ __align__(128) unsigned char ring_raw[];     // [warp][stage][chunk bytes]
    __shared__ __align__(8) uint64_t bars[kMaxWarps * kMaxStages];  // [warp][stage]
    __shared__ float warp_acc[kMaxWarps];
    __shared__ float warp_tot[kMaxWarps];
    __shared__ bool am_last;

    const int nwarps = blockDim.x >> 5;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t gw = static_cast<int64_t>(blockIdx.x) * nwarps + warp;
    const int64_t r0 = min(M, gw * rpw);
    const int64_t r1 = min(M, r0 + rpw);
    const unsigned char* ring_g = ring_raw + static_cast<uint32_t>(warp * stages) * chunk;  // for ld.shared
    const uint32_t ring_s = smem_addr(ring_g);                                             // for the copies
    const uint32_t bar0 = smem_addr(&bars[warp * kMaxStages]);                              // stage s: bar0 + 8s

    // ---- producer state: lane 0 only. Walks the warp's (row, chunk) sequence `stages` chunks ahead
    // of the consumer; rows with no aligned middle have no chunks.
    int64_t pr = r0 - 1;
    uint32_t poff = 0, pnb = 0;
    const char* pmid = nullptr;
    int pslot = 0;
    uint64_t pol = 0;
    auto pseek = [&]() {
        while (poff >= pnb && pr < r1) {
            ++pr;
            poff = 0;
            pnb = 0;
            if (pr < r1) {
                const char* row;
                int head;
                row_geom<kBf16>(logits, pr, C, row, head, pnb);
                pmid = row + head * Tr::kElem;
            }
        }
    };
    // Fill the slot `pslot` with the next chunk, if any. Byte count for expect_tx and the copy are the
    // same variable, a multiple of 16, source and destination 16-byte aligned.
    auto produce = [&]() {
        if (pr < r1) {
            const uint32_t nb = min(chunk, pnb - poff);
            const uint32_t bar = bar0 + 8u * pslot;
            const uint32_t dst = ring_s + static_cast<uint32_t>(pslot) * chunk;
            // Order this warp's generic reads of the slot (fenced by __syncwarp) before the async write.
            if (proxy_fence) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            mbar_arrive_expect_tx(bar, nb);
            if (use_hint) bulk_g2s_hint(dst, pmid + poff, nb, bar, pol);
            else bulk_g2s(dst, pmid + poff, nb, bar);
            poff += nb;
            pslot = (pslot + 1 == stages) ? 0 : pslot + 1;
            pseek();
        }
    };

    if (lane == 0) {
        for (int s = 0; s < stages; ++s) mbar_init(bar0 + 8u * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        pol = evict_first_policy();
        pseek();
        for (int s = 0; s < stages; ++s) produce();
    }
    __syncwarp();

    // ---- consumer: all lanes, same sequence. Chunk k of the warp sits in slot k % stages and is that
    // slot's (k / stages)-th use, i.e. phase parity (k / stages) & 1.
    int cslot = 0;
    uint32_t cpar = 0;
    bool dead = false;  // a wait timed out (bug): stop touching the ring, the result becomes NaN
    float acc = 0.f;    // this warp's row losses, summed in row order
    int64_t t_next = (r0 < r1) ? __ldg(targets + r0) : 0;
    for (int64_t r = r0; r < r1; ++r) {
        const char* row;
        int head;
        uint32_t nb;
        row_geom<kBf16>(logits, r, C, row, head, nb);
        const int tail0 = head + static_cast<int>(nb / 16u) * V;
        // Scalar loads now, used after the chunk loop (latency hidden); the target index one row ahead.
        const int64_t t = t_next;
        if (r + 1 < r1) t_next = __ldg(targets + r + 1);
        const float xt = (static_cast<uint64_t>(t) < static_cast<uint64_t>(C)) ? Tr::scalar(row, t) : NAN;
        const float ha = (lane < head) ? Tr::scalar(row, lane) : -INFINITY;
        const float tb = (lane < C - tail0) ? Tr::scalar(row, tail0 + lane) : -INFINITY;

        float m = -INFINITY, s = 0.f;
        for (uint32_t off = 0; off < nb; off += chunk) {
            const int nv = static_cast<int>(min(chunk, nb - off) / 16u);
            if (!dead) dead = !__all_sync(0xffffffffu, mbar_wait(bar0 + 8u * cslot, cpar));
            const uint4* slot = reinterpret_cast<const uint4*>(ring_g + static_cast<uint32_t>(cslot) * chunk);
            if constexpr (kStage) {
                // The whole chunk to registers first, so the slot is refilled before the math and the copy
                // engine keeps `stages` chunks in flight while this warp computes. Same math, same order.
                uint4 v[kRegVec];
                if (!dead) {
#pragma unroll
                    for (int k = 0; k < kRegVec; ++k) {
                        const int idx = k * 32 + lane;
                        v[k] = idx < nv ? slot[idx] : Tr::neg_inf();
                    }
                }
                __syncwarp();  // every lane holds its part of the slot before lane 0 refills it
                if (lane == 0 && !dead) produce();
                if (!dead) {
#pragma unroll
                    for (int b = 0; b < kRegVec; b += kU) {
                        uint4 w[kU];
#pragma unroll
                        for (int u = 0; u < kU; ++u) w[u] = v[b + u];
                        online_step<kBf16>(w, m, s);
                    }
                }
            } else {
                if (!dead) {
                    for (int base = 0; base < nv; base += kStepVec) {
                        uint4 v[kU];
#pragma unroll
                        for (int u = 0; u < kU; ++u) {
                            const int idx = base + u * 32 + lane;
                            v[u] = idx < nv ? slot[idx] : Tr::neg_inf();
                        }
                        online_step<kBf16>(v, m, s);
                    }
                }
                __syncwarp();  // every lane is done reading this slot before lane 0 refills it
                if (lane == 0 && !dead) produce();
            }
            if (++cslot == stages) { cslot = 0; cpar ^= 1u; }
        }
        {
            const float mn = fmaxf(m, fmaxf(ha, tb)), mr = safe_ref(mn);
            s = s * ex2((m - mr) * kLog2e) + (ex2((ha - mr) * kLog2e) + ex2((tb - mr) * kLog2e));
            m = mn;
        }

        // Row max first, then one rescale and a plain sum. Xor butterflies give every lane the same
        // bits (max and + are commutative).
        float gm = m;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) gm = fmaxf(gm, __shfl_xor_sync(0xffffffffu, gm, o));
        s *= ex2((m - safe_ref(gm)) * kLog2e);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        m = gm;

        float loss = (m - xt) + logf(s);
        // Warp-uniform: every lane holds the same m, s, xt. The target is the max and the rest sums
        // to < 1: log(s) would lose the digits of a tiny loss, so re-read the row for log1p.
        if (xt == m && s < 2.f) {
            float rest = 0.f, cnt = 0.f;
            for (int j = lane; j < C; j += 32) {
                const float x = Tr::scalar(row, j);
                if (x == m) cnt += 1.f;
                else rest += expf(x - m);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                rest += __shfl_xor_sync(0xffffffffu, rest, o);
                cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
            }
            loss = log1pf(rest + (cnt - 1.f));
        }
        acc += dead ? NAN : loss;
    }

    if (lane == 0) warp_acc[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float cta = 0.f;
        for (int i = 0; i < nwarps; ++i) cta += warp_acc[i];
        partials[blockIdx.x] = cta;
        __threadfence();
        am_last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!am_last) return;

    // Last CTA: every other CTA's partial is visible (their fence preceded their ticket).
    __threadfence();
    float part = 0.f;
    for (int i = threadIdx.x; i < static_cast<int>(gridDim.x); i += blockDim.x) part += __ldcg(partials + i);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
    if (lane == 0) warp_tot[warp] = part;
    __syncthreads();
    if (threadIdx.x == 0) {
        float tot = 0.f;
        for (int w = 0; w < nwarps; ++w) tot += warp_tot[w];
        const float mean = static_cast<float>(static_cast<double>(tot) / static_cast<double>(M));  // M == 0 -> NaN
        *reinterpret_cast<float*>(out) = mean;  // float32 for bf16 logits too (problem.yaml output_dtype)
        *counter = 0u;  // ready for the next launch on this stream
    }
}

// ---- host side (plain C++): which instantiation, and the grid.
using CeKernel = void (*)(const char*, const int64_t*, int64_t, int, int64_t, int, uint32_t, int, int, float*,
                          unsigned int*, void*);
constexpr int64_t kMaxStagedChunk = kRegVec * 32 * 16;

// The bench's flags: bit 2, never stage; bit 3, stage bfloat16 too. Otherwise float32 chunks (<= 8 KB) are staged.
inline bool stage_chunks(bool bf16, int64_t chunk_bytes, int64_t flags) {
    return (flags & 4) ? false : ((flags & 8) || !bf16) && chunk_bytes <= kMaxStagedChunk;
}
inline CeKernel pick_kernel(bool bf16, bool stage) {
    return bf16 ? (stage ? ce_v3_kernel<true, true> : ce_v3_kernel<true, false>)
                : (stage ? ce_v3_kernel<false, true> : ce_v3_kernel<false, false>);
}

// Persistent grid: the fewest warps that still give each the same (ceil) number of rows as a full resident
// grid (or `ctas_override` CTAs), so every active warp streams the same number of rows and all finish together.
struct Grid {
    int64_t rpw, ctas;
};
inline Grid plan_grid(int64_t M, int W, int occ, int64_t sms, int64_t ctas_override) {
    int64_t max_warps = sms * occ * W;
    if (ctas_override > 0) max_warps = (ctas_override < (int64_t(1) << 24) ? ctas_override : int64_t(1) << 24) * W;
    Grid g;
    g.rpw = (M + max_warps - 1) / max_warps;
    if (g.rpw < 1) g.rpw = 1;
    const int64_t need_warps = (M + g.rpw - 1) / g.rpw;
    g.ctas = (need_warps + W - 1) / W;
    if (g.ctas < 1) g.ctas = 1;
    return g;
}

}  // namespace ce_v3
