"""Row-wise softmax at the HBM bandwidth limit (H200, sm_90).

Each row is read from HBM exactly once and written exactly once:
  * A row (or, for long rows, a slice of it) is copied into shared memory by the TMA bulk-copy
    engine (cp.async.bulk + mbarrier), in up to 8 chunks so that the first pass starts while
    the rest is still in flight. Misaligned rows use plain per-element loads into shared memory.
  * Pass 1 (from smem): every thread keeps an online (max, sum) pair in the log2 domain:
    s = sum 2^(x*log2e - m). Pairs are merged with warp shuffles, then across warps.
  * Rows longer than 64 KB are split over a thread-block cluster of 2..16 CTAs; the per-CTA pairs
    are merged through distributed shared memory (DSMEM).
  * Pass 2 (from smem): y = 2^(x*log2e - M) / S, one FFMA + ex2 + FMUL per element, written
    with 16-byte streaming stores (st.global.cs).
  * Rows too long even for a 16-CTA cluster (> 1.75 MB) take a two-kernel fallback:
    per-chunk (max, sum) partials in global memory, then combine and write (x is read twice).
Sizing: slices <= 64 KB per CTA -> 3 CTAs/SM, slices <= 112 KB -> 2 CTAs/SM, so one CTA's
loads overlap another's stores.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_kernels_src = r"""
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cstdint>

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

_host_src = r"""
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

torch::Tensor softmax_fast(torch::Tensor x, int64_t target_slice_bytes) {
    TORCH_CHECK(x.is_cuda(), "softmax_fast: x must be a CUDA tensor");
    TORCH_CHECK(x.dim() >= 1, "softmax_fast: x must have at least one dimension");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16,
                "softmax_fast: x must be float32 or bfloat16");
    TORCH_CHECK(target_slice_bytes >= 16, "softmax_fast: target_slice_bytes too small");
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
    if (x.scalar_type() == torch::kFloat32) {
        const float* xp = x.data_ptr<float>();
        float* yp = y.data_ptr<float>();
        if (vec) launch<float, true>(xp, yp, rows, cols, target_slice_bytes, stream);
        else     launch<float, false>(xp, yp, rows, cols, target_slice_bytes, stream);
    } else {
        auto xp = reinterpret_cast<const __nv_bfloat16*>(x.data_ptr<at::BFloat16>());
        auto yp = reinterpret_cast<__nv_bfloat16*>(y.data_ptr<at::BFloat16>());
        if (vec) launch<__nv_bfloat16, true>(xp, yp, rows, cols, target_slice_bytes, stream);
        else     launch<__nv_bfloat16, false>(xp, yp, rows, cols, target_slice_bytes, stream);
    }
    return y;
}
"""

_cpp_src = "torch::Tensor softmax_fast(torch::Tensor x, int64_t target_slice_bytes);"

_ext = load_inline(
    name="softmax_fast_v1",
    cpp_sources=_cpp_src,
    cuda_sources=_kernels_src + _host_src,
    functions=["softmax_fast"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)

# Per-CTA slice target in bytes: rows above it are split over a cluster (tuning knob: 64 KB gives
# 3 CTAs/SM; benchmarks/check_softmax.py also times 16 KB and 32 KB).
TARGET_SLICE_BYTES = 64 * 1024


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.softmax_fast(x, TARGET_SLICE_BYTES)
