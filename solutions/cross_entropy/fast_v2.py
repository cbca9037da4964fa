"""Cross-entropy (mean reduction), v2: one warp per row, loads staged through a cp.async shared-memory ring.

Design (details in docs/perf-notes/cross_entropy.md, section "fast_v2"):
- One warp owns a contiguous block of rows (rows-per-warp balanced: every active warp gets the same
  count when M allows); a 256-thread CTA is 8 independent warps, no block barriers in the main loop.
- Bytes in flight are held in shared memory, not registers: each thread has a private ring of
  kStages x kU 16-byte slots and keeps kStages-1..kStages stages of cp.async.cg (L1 bypass, L2
  evict_first) outstanding, crossing row boundaries, so the warp's row-end reduction runs while the
  next row's data is already on its way. Each thread reads back only what it copied itself, so
  cp.async.wait_group is the only synchronisation (no mbarriers, no cross-thread hand-off).
- Single-pass online log-sum-exp per stage (max of the stage, one rescale, ex2.approx of each value),
  unaligned heads/tails as scalars, tiny-loss guard and the fused deterministic mean as in fast.py.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_cpp_src = r"""
#include <torch/extension.h>
torch::Tensor cross_entropy_fast_v2(torch::Tensor logits, torch::Tensor targets, torch::Tensor counter,
                                    int64_t ctas_override);
"""

# Device code only (no torch headers), so it can also be compiled alone with nvcc for -Xptxas -v.
_kernel_src = r"""
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>

namespace ce_v2 {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kU = 4;                        // 16-byte vectors per thread per stage
constexpr int kStages = 6;                   // ring depth per thread
constexpr int kStep = 32 * kU;               // vectors per warp per stage
constexpr int kSmemBytes = kStages * kU * kThreads * 16;  // 96 KB: 2 CTAs per SM
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint64_t evict_first_policy() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
// 16-byte global -> shared copy, L1 bypassed; streamed once, so evict first from L2.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, uint64_t pol) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;"
                 :: "r"(dst), "l"(src), "l"(pol) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

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

// Where a row's 16-byte-aligned middle starts and how many vectors it has (scalar head before it).
template <bool kBf16>
__device__ __forceinline__ void row_geom(const char* logits, int64_t r, int C, const char*& row, int& head,
                                         int& nvec) {
    constexpr int V = Traits<kBf16>::kVec, E = Traits<kBf16>::kElem;
    row = logits + r * static_cast<int64_t>(C) * E;
    const int mis = static_cast<int>((reinterpret_cast<uintptr_t>(row) & 15) / E);
    head = mis ? min(V - mis, C) : 0;
    nvec = (C - head) / V;
}

template <bool kBf16>
__global__ void __launch_bounds__(kThreads, 2)
ce_v2_kernel(const char* __restrict__ logits, const int64_t* __restrict__ targets, int64_t M, int C,
             int64_t rpw, float* __restrict__ partials, unsigned int* __restrict__ counter,
             void* __restrict__ out) {
    using Tr = Traits<kBf16>;
    constexpr int V = Tr::kVec, E = Tr::kElem;
    // ring[stage][u][thread]: a thread's slots are private; consecutive threads hit consecutive
    // 16-byte words (conflict-free cp.async writes and ld.shared.v4 reads).
    extern __shared__ uint4 ring[];
    __shared__ float warp_acc[kWarps];
    __shared__ float warp_tot[kWarps];
    __shared__ bool am_last;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
    const int64_t r0 = min(M, gw * rpw);
    const int64_t r1 = min(M, r0 + rpw);
    const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring)) + threadIdx.x * 16u;
    const uint64_t pol = evict_first_policy();

    // Producer cursor: walks the same (row, stage) sequence as the consumer, kStages-1 stages ahead.
    // Rows without aligned vectors have no stages. All of it is warp-uniform.
    int64_t pr = r0 - 1;
    int pbase = 0, pnvec = 0;
    const uint4* pvp = nullptr;
    auto pseek = [&]() {
        while (pr < r1 && pbase >= pnvec) {
            ++pr;
            pbase = 0;
            pnvec = 0;
            if (pr < r1) {
                const char* row;
                int head;
                row_geom<kBf16>(logits, pr, C, row, head, pnvec);
                pvp = reinterpret_cast<const uint4*>(row + head * E);
            }
        }
    };
    int pslot = 0;
    // One commit group per call, empty once the warp's rows are all issued, so group k is stage k.
    auto produce = [&]() {
        if (pr < r1) {
            const uint32_t dst = ring_s + static_cast<uint32_t>(pslot * kU * kThreads * 16);
#pragma unroll
            for (int u = 0; u < kU; ++u) {
                const int idx = pbase + u * 32 + lane;
                if (idx < pnvec) cp_async16(dst + u * kThreads * 16, pvp + idx, pol);
            }
            pbase += kStep;
            pseek();
        }
        cp_async_commit();
        pslot = (pslot + 1 == kStages) ? 0 : pslot + 1;
    };

    pseek();
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) produce();

    int cslot = 0;
    float acc = 0.f;  // this warp's row losses, summed in row order
    for (int64_t r = r0; r < r1; ++r) {
        const char* row;
        int head, nvec;
        row_geom<kBf16>(logits, r, C, row, head, nvec);
        const int tail0 = head + nvec * V;
        // Scalar loads issued now, consumed after the stage loop (latency hidden behind it).
        const int64_t t = __ldg(targets + r);
        const float xt = (static_cast<uint64_t>(t) < static_cast<uint64_t>(C)) ? Tr::scalar(row, t) : NAN;
        const float ha = (lane < head) ? Tr::scalar(row, lane) : -INFINITY;
        const float tb = (lane < C - tail0) ? Tr::scalar(row, tail0 + lane) : -INFINITY;

        float m = -INFINITY, s = 0.f;
        for (int base = 0; base < nvec; base += kStep) {
            produce();                        // refills the slot read in the previous step
            cp_async_wait<kStages - 1>();     // this thread's copies for this stage have landed
            const uint4* slot = ring + cslot * kU * kThreads + threadIdx.x;
            uint4 v[kU];
#pragma unroll
            for (int u = 0; u < kU; ++u) v[u] = (base + u * 32 + lane < nvec) ? slot[u * kThreads] : Tr::neg_inf();
            cslot = (cslot + 1 == kStages) ? 0 : cslot + 1;
            const float mn = fmaxf(m, Tr::step_max(v));
            const float mr = safe_ref(mn);
            s = s * ex2((m - mr) * kLog2e) + Tr::step_sum(v, mr);
            m = mn;
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
        acc += loss;
    }
    cp_async_wait<0>();  // only empty groups can remain; drain anyway before the CTA exits

    if (lane == 0) warp_acc[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float cta = 0.f;
        for (int i = 0; i < kWarps; ++i) cta += warp_acc[i];
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
        if (kBf16) *reinterpret_cast<__nv_bfloat16*>(out) = __float2bfloat16_rn(mean);
        else *reinterpret_cast<float*>(out) = mean;
        *counter = 0u;  // ready for the next launch on this stream
    }
}

}  // namespace ce_v2
"""

_host_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>

// ctas_override: 0 = automatic (tuning hook for benchmarks only).
torch::Tensor cross_entropy_fast_v2(torch::Tensor logits, torch::Tensor targets, torch::Tensor counter,
                                    int64_t ctas_override) {
    using namespace ce_v2;
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

    auto kern = bf16 ? ce_v2_kernel<true> : ce_v2_kernel<false>;
    // Per device and dtype: opt in to 96 KB of dynamic shared memory, then ask how many CTAs fit.
    constexpr int kMaxDev = 64;
    static int occ[kMaxDev][2] = {};
    const int dev = x.get_device();
    TORCH_CHECK(dev >= 0 && dev < kMaxDev, "cross_entropy: device index out of range");
    int& o = occ[dev][bf16 ? 1 : 0];
    if (o == 0) {
        C10_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
        // All of L1 as shared memory: only the few scalar loads use L1, and 2 x 96 KB must fit.
        C10_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            cudaSharedmemCarveoutMaxShared));
        int n = 0;
        C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, kThreads, kSmemBytes));
        o = n < 1 ? 1 : n;
    }
    const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    // Fewest warps that still give each the same (ceil) number of rows as a full resident grid, so
    // every active warp streams the same number of rows and all finish together.
    int64_t max_warps = sms * o * kWarps;
    if (ctas_override > 0) max_warps = std::min<int64_t>(ctas_override, int64_t(1) << 24) * kWarps;
    const int64_t rpw = std::max<int64_t>(1, (M + max_warps - 1) / max_warps);
    const int64_t need_warps = (M + rpw - 1) / rpw;
    const int64_t ctas = std::max<int64_t>(1, (need_warps + kWarps - 1) / kWarps);

    auto out = torch::empty({}, x.options());
    auto partials = torch::empty({ctas}, x.options().dtype(at::kFloat));
    auto stream = at::cuda::getCurrentCUDAStream();
    kern<<<static_cast<unsigned>(ctas), kThreads, kSmemBytes, stream>>>(
        static_cast<const char*>(x.data_ptr()), t.data_ptr<int64_t>(), M, static_cast<int>(C), rpw,
        partials.data_ptr<float>(), reinterpret_cast<unsigned int*>(counter.data_ptr<int>()), out.data_ptr());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(
    name="cross_entropy_fast_v2",
    cpp_sources=_cpp_src,
    cuda_sources=_kernel_src + _host_src,
    functions=["cross_entropy_fast_v2"],
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
        return _ext.cross_entropy_fast_v2(logits, targets, _counter(logits.device), 0)
