"""Cross-entropy (mean reduction) at the HBM read limit: one launch, each logit read once.

Design (details in docs/perf-notes/cross_entropy.md):
- A row is owned by one warp when there are rows for half of the resident warps or more, else by a group of `wpr`
  warps (2, 4 or 8, picked from the row length so each thread makes several 8 x 16-byte steps per
  row); a 256-thread CTA holds 8/wpr groups.
- Single-pass online log-sum-exp: each step issues 8 independent 16-byte L1-bypassing loads, takes the
  step's max, rescales the running sum once, then adds exp2 of the step's values (pairwise tree).
- Grid = just enough resident CTAs; rows are dealt round-robin to groups with the rows-per-group count
  balanced (every group gets the same number of rows when M allows), so all CTAs finish together.
- At a row's end the next row's first step is loaded before the finished row is reduced, so warps keep
  loads in flight through the reduction.
- Unaligned rows (odd widths): a scalar head up to the first 16-byte boundary, vectors, a scalar tail.
- Mean fused in the launch: each CTA sums its rows' losses in a fixed order into partials[cta]; the last
  CTA to arrive (threadfence + atomic ticket) sums the partials in a fixed order and resets the ticket,
  so the result is deterministic.
- If the target is the row max and the rest of the sum is < 1 the loss is tiny and log(sum) would lose
  its digits; such a row is re-read and computed as log1p(sum of the others) (only tiny rows hit this).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_cpp_src = r"""
#include <torch/extension.h>
torch::Tensor cross_entropy_fast(torch::Tensor logits, torch::Tensor targets, torch::Tensor counter,
                                 int64_t wpr_override, int64_t ctas_override);
"""

# Device code only (no torch headers), so it can also be compiled alone with nvcc for -Xptxas -v.
_kernel_src = r"""
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>

namespace ce_fast {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 8;                  // 16-byte loads in flight per thread per step
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Streamed once: don't allocate in L1; ask L2 for 256-byte fetches.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

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
    static __device__ __forceinline__ float step_max(const uint4 (&v)[kUnroll]) {
        float p[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
            p[u] = fmaxf(fmaxf(__uint_as_float(v[u].x), __uint_as_float(v[u].y)),
                         fmaxf(__uint_as_float(v[u].z), __uint_as_float(v[u].w)));
#pragma unroll
        for (int st = 1; st < kUnroll; st *= 2)
#pragma unroll
            for (int u = 0; u < kUnroll; u += 2 * st) p[u] = fmaxf(p[u], p[u + st]);
        return p[0];
    }
    // fp32 needs the exact subtraction (x - m) before scaling: folding m*log2e into an FMA would put
    // a per-row rounding error of ~1e-5 into the exponent.
    static __device__ __forceinline__ float step_sum(const uint4 (&v)[kUnroll], float mref) {
        float p[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
            p[u] = (ex2((__uint_as_float(v[u].x) - mref) * kLog2e) + ex2((__uint_as_float(v[u].y) - mref) * kLog2e)) +
                   (ex2((__uint_as_float(v[u].z) - mref) * kLog2e) + ex2((__uint_as_float(v[u].w) - mref) * kLog2e));
#pragma unroll
        for (int st = 1; st < kUnroll; st *= 2)
#pragma unroll
            for (int u = 0; u < kUnroll; u += 2 * st) p[u] += p[u + st];
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
    static __device__ __forceinline__ float step_max(const uint4 (&v)[kUnroll]) {
        uint32_t p[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) p[u] = bmax2(bmax2(v[u].x, v[u].y), bmax2(v[u].z, v[u].w));
#pragma unroll
        for (int st = 1; st < kUnroll; st *= 2)
#pragma unroll
            for (int u = 0; u < kUnroll; u += 2 * st) p[u] = bmax2(p[u], p[u + st]);
        return fmaxf(bf_lo(p[0]), bf_hi(p[0]));
    }
    static __device__ __forceinline__ float pair(uint32_t w, float nb) {
        return ex2(fmaf(bf_lo(w), kLog2e, nb)) + ex2(fmaf(bf_hi(w), kLog2e, nb));
    }
    // bf16 tolerance allows the FMA form (one op less per element).
    static __device__ __forceinline__ float step_sum(const uint4 (&v)[kUnroll], float mref) {
        const float nb = -mref * kLog2e;
        float p[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
            p[u] = (pair(v[u].x, nb) + pair(v[u].y, nb)) + (pair(v[u].z, nb) + pair(v[u].w, nb));
#pragma unroll
        for (int st = 1; st < kUnroll; st *= 2)
#pragma unroll
            for (int u = 0; u < kUnroll; u += 2 * st) p[u] += p[u + st];
        return p[0];
    }
};

// -inf max (nothing seen yet, or an all -inf row) must not turn into (-inf) - (-inf) = NaN.
__device__ __forceinline__ float safe_ref(float m) { return m == -INFINITY ? 0.f : m; }

// (m, s) <- merge with (m2, s2); symmetric, so butterfly partners end with identical values.
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2), r = safe_ref(mn);
    s = s * ex2((m - r) * kLog2e) + s2 * ex2((m2 - r) * kLog2e);
    m = mn;
}

__device__ __forceinline__ void group_sync(int group, int nthreads) {
    if (nthreads == 32) __syncwarp();
    else asm volatile("bar.sync %0, %1;" :: "r"(group + 1), "r"(nthreads) : "memory");
}

template <bool kBf16>
__global__ void __launch_bounds__(kThreads, 4)
ce_fast_kernel(const char* __restrict__ logits, const int64_t* __restrict__ targets, int64_t M, int C,
               int wpr, float* __restrict__ partials, unsigned int* __restrict__ counter, void* __restrict__ out) {
    using Tr = Traits<kBf16>;
    constexpr int V = Tr::kVec, E = Tr::kElem;
    __shared__ float red_m[2][kWarps], red_s[2][kWarps];  // double-buffered: one group barrier per row
    __shared__ float ref_a[kWarps], ref_b[kWarps];
    __shared__ float grp_sum[kWarps];
    __shared__ float warp_tot[kWarps];
    __shared__ bool am_last;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int groups = kWarps / wpr;
    const int g = warp / wpr;
    const int first_warp = g * wpr;
    const int GT = wpr * 32;
    const int gt = threadIdx.x - first_warp * 32;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * groups;
    int parity = 0;
    float acc = 0.f;  // this group's row losses, summed in row order

    // Per-row state of the row being streamed.
    const char* row = nullptr;
    const uint4* vp = nullptr;
    int nvec = 0, tail0 = 0;
    float xt = 0.f, ha = 0.f, tb = 0.f;
    uint4 v[kUnroll];

    // Scalar loads (target logit, unaligned head and tail) are issued here and consumed after the
    // vector loop, so their latency hides behind it.
    auto setup = [&](int64_t rr) {
        row = logits + rr * static_cast<int64_t>(C) * E;
        const int64_t t = __ldg(targets + rr);
        xt = (static_cast<uint64_t>(t) < static_cast<uint64_t>(C)) ? Tr::scalar(row, t) : NAN;
        const int mis = static_cast<int>((reinterpret_cast<uintptr_t>(row) & 15) / E);
        const int head = mis ? min(V - mis, C) : 0;
        nvec = (C - head) / V;
        tail0 = head + nvec * V;
        ha = (gt < head) ? Tr::scalar(row, gt) : -INFINITY;
        tb = (gt < C - tail0) ? Tr::scalar(row, tail0 + gt) : -INFINITY;
        vp = reinterpret_cast<const uint4*>(row + head * E);
    };
    auto load_step = [&](int base) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int idx = base + u * GT + gt;
            v[u] = idx < nvec ? ld_stream(vp + idx) : Tr::neg_inf();
        }
    };

    int64_t r = static_cast<int64_t>(blockIdx.x) * groups + g;
    if (r < M) { setup(r); load_step(0); }
    while (r < M) {
        float m = -INFINITY, s = 0.f;
        for (int base = 0;;) {
            const float mn = fmaxf(m, Tr::step_max(v));
            const float mr = safe_ref(mn);
            s = s * ex2((m - mr) * kLog2e) + Tr::step_sum(v, mr);
            m = mn;
            base += GT * kUnroll;
            if (base >= nvec) break;
            load_step(base);
        }
        {
            const float mn = fmaxf(m, fmaxf(ha, tb)), mr = safe_ref(mn);
            s = s * ex2((m - mr) * kLog2e) + (ex2((ha - mr) * kLog2e) + ex2((tb - mr) * kLog2e));
            m = mn;
        }
        const char* const row_r = row;
        const float xt_r = xt;

        // Start the next row's loads before the reduction, so no warp idles at a row boundary.
        const int64_t rn = r + stride;
        if (rn < M) { setup(rn); load_step(0); }

        // Row max first, then one rescale and a plain sum: fewer dependent exps than merging pairs.
        // Xor butterflies give every lane the same bits (max and + are commutative).
        float gm = m;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) gm = fmaxf(gm, __shfl_xor_sync(0xffffffffu, gm, o));
        s *= ex2((m - safe_ref(gm)) * kLog2e);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        m = gm;
        if (wpr > 1) {
            if (lane == 0) { red_m[parity][warp] = m; red_s[parity][warp] = s; }
            group_sync(g, GT);
            gm = red_m[parity][first_warp];
            for (int w = 1; w < wpr; ++w) gm = fmaxf(gm, red_m[parity][first_warp + w]);
            const float gr = safe_ref(gm);
            s = 0.f;
            for (int w = 0; w < wpr; ++w)
                s += red_s[parity][first_warp + w] * ex2((red_m[parity][first_warp + w] - gr) * kLog2e);
            m = gm;
            parity ^= 1;
        }

        float loss = (m - xt_r) + logf(s);
        // Group-uniform: every thread holds the same m, s, xt_r.
        if (xt_r == m && s < 2.f) {
            float rest = 0.f, cnt = 0.f;
            for (int j = gt; j < C; j += GT) {
                const float x = Tr::scalar(row_r, j);
                if (x == m) cnt += 1.f;
                else rest += expf(x - m);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                rest += __shfl_xor_sync(0xffffffffu, rest, o);
                cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
            }
            if (wpr > 1) {
                if (lane == 0) { ref_a[warp] = rest; ref_b[warp] = cnt; }
                group_sync(g, GT);
                rest = ref_a[first_warp];
                cnt = ref_b[first_warp];
                for (int w = 1; w < wpr; ++w) { rest += ref_a[first_warp + w]; cnt += ref_b[first_warp + w]; }
            }
            loss = log1pf(rest + (cnt - 1.f));
        }
        acc += loss;
        r = rn;
    }

    if (gt == 0) grp_sum[g] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float cta = 0.f;
        for (int i = 0; i < groups; ++i) cta += grp_sum[i];
        partials[blockIdx.x] = cta;
        __threadfence();
        am_last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!am_last) return;

    // Last CTA: every other CTA's partial is visible (their fence preceded their ticket).
    __threadfence();
    float part = 0.f;
    for (int i = threadIdx.x; i < static_cast<int>(gridDim.x); i += kThreads) part += __ldcg(partials + i);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
    if (lane == 0) warp_tot[warp] = part;
    __syncthreads();
    if (threadIdx.x == 0) {
        float tot = 0.f;
        for (int w = 0; w < kWarps; ++w) tot += warp_tot[w];
        const float mean = static_cast<float>(static_cast<double>(tot) / static_cast<double>(M));  // M == 0 -> NaN
        *reinterpret_cast<float*>(out) = mean;  // float32 for bf16 logits too (problem.yaml output_dtype)
        *counter = 0u;  // ready for the next launch on this stream
    }
}

}  // namespace ce_fast
"""

_host_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>

// wpr_override / ctas_override: 0 = automatic (tuning hooks for benchmarks only).
torch::Tensor cross_entropy_fast(torch::Tensor logits, torch::Tensor targets, torch::Tensor counter,
                                 int64_t wpr_override, int64_t ctas_override) {
    using namespace ce_fast;
    TORCH_CHECK(logits.is_cuda() && targets.is_cuda(), "cross_entropy: inputs must be CUDA tensors");
    TORCH_CHECK(logits.dim() == 2, "cross_entropy: logits must be 2-D [M, C]");
    TORCH_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0), "cross_entropy: targets must be [M]");
    const bool bf16 = logits.scalar_type() == at::kBFloat16;
    TORCH_CHECK(bf16 || logits.scalar_type() == at::kFloat, "cross_entropy: logits must be float32 or bfloat16");
    TORCH_CHECK(!targets.is_floating_point() && !targets.is_complex(), "cross_entropy: targets must be integer");
    TORCH_CHECK(counter.is_cuda() && counter.scalar_type() == at::kInt && counter.numel() == 1 &&
                counter.device() == logits.device(), "cross_entropy: bad counter workspace");
    const c10::cuda::CUDAGuard guard(logits.device());
    auto x = logits.contiguous();
    auto t = targets.to(at::kLong).contiguous();
    const int64_t M = x.size(0), C = x.size(1);
    TORCH_CHECK(C > 0 || M == 0, "cross_entropy: need at least one class");
    TORCH_CHECK(C < (int64_t(1) << 30), "cross_entropy: row too long for 32-bit indexing");

    static int occ[2] = {0, 0};
    int& o = occ[bf16 ? 1 : 0];
    if (o == 0) {
        C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &o, bf16 ? ce_fast_kernel<true> : ce_fast_kernel<false>, kThreads, 0));
        if (o < 1) o = 1;
    }
    const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;

    // Warps per row: one when there are rows for at least half of the resident warps (measured 2-12%
    // faster than sharing rows on all four timing shapes, 4096 rows included: no group barriers). Otherwise a power of two of warps, so
    // each thread still makes >= 2 steps of 8 vectors.
    const int vec = bf16 ? 8 : 4;
    const int64_t nvec = C / vec;
    int wpr = 1;
    if (2 * M < sms * o * kWarps) {
        wpr = kWarps;
        while (wpr > 1 && nvec < int64_t(32) * wpr * kUnroll * 2) wpr >>= 1;
    }
    if (wpr_override > 0) {
        TORCH_CHECK(wpr_override <= kWarps && (kWarps % wpr_override) == 0, "cross_entropy: bad wpr");
        wpr = static_cast<int>(wpr_override);
    }
    const int groups = kWarps / wpr;
    // Fewest groups that still give each the same (ceil) number of rows as a full resident grid.
    const int64_t max_groups = sms * o * groups;
    const int64_t rows_per_group = std::max<int64_t>(1, (M + max_groups - 1) / max_groups);
    const int64_t need_groups = (M + rows_per_group - 1) / rows_per_group;
    int64_t ctas = std::max<int64_t>(1, (need_groups + groups - 1) / groups);
    if (ctas_override > 0) ctas = std::min<int64_t>(ctas_override, int64_t(1) << 30);

    auto out = torch::empty({}, x.options().dtype(at::kFloat));  // the loss is float32 for bf16 logits too
    auto partials = torch::empty({ctas}, x.options().dtype(at::kFloat));
    auto stream = at::cuda::getCurrentCUDAStream();
    auto kern = bf16 ? ce_fast_kernel<true> : ce_fast_kernel<false>;
    kern<<<static_cast<unsigned>(ctas), kThreads, 0, stream>>>(
        static_cast<const char*>(x.data_ptr()), t.data_ptr<int64_t>(), M, static_cast<int>(C), wpr,
        partials.data_ptr<float>(), reinterpret_cast<unsigned int*>(counter.data_ptr<int>()), out.data_ptr());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(
    name="cross_entropy_fast_v1",
    cpp_sources=_cpp_src,
    cuda_sources=_kernel_src + _host_src,
    functions=["cross_entropy_fast"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)

# One self-resetting ticket per device (the kernel's last CTA sets it back to 0). Calls that run
# concurrently on different streams of one device would share it: not supported.
_counters = {}


def _counter(device: torch.device) -> torch.Tensor:
    key = (device.type, device.index)
    c = _counters.get(key)
    if c is None:
        c = torch.zeros(1, dtype=torch.int32, device=device)
        _counters[key] = c
    return c


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return _ext.cross_entropy_fast(logits, targets, _counter(logits.device), 0, 0)
