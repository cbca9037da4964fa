"""Trust boundary, class 5 (small hidden work), InfoNCE at its seed shape. GPU only. BYPASS CANDIDATE.

Before every timed call the harness overwrites a 256 MB buffer on the current stream (the L2 flush,
~60-70 us on an H200) and records the begin event after it. forward launches the whole loss (a tiled
fp32 GEMM kernel for the negatives' logits, then one kernel per query row for the positive's cosine
and the log-sum-exp) on a private high-priority stream that waits for nothing, so on the device
it runs beside the flush that the current stream is still busy with. On the current stream it only
waits for its event (already done by then) and spins ~4 us, so the begin/end events see ~5 us, the
output copy into the parent's slot is ordered after the real work (correct outputs, every call), and
the parent's clock sees the flush's time either way. For the escape check (back-to-back calls, no flush)
forward also busy-waits ~25 us on the host, so the launch time the bound follows covers the real work.
At the seed shape (256x512, 2560 negatives) the honest kernels take ~15 us (wgmma_fused) to ~20 us.
Expected: escaped-timing or impossible-time if the harness can tell; a candidate for ACCEPTED with a
median ~3x below the shipped kernel's.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

TEMPERATURE = 0.1
SPIN_CYCLES = 8000        # ~4 us on the current stream, inside the events
HOST_SPIN_NS = 25000      # ~25 us of host time per call, outside the events while the device lags

_CPP = "torch::Tensor infonce(torch::Tensor q, torch::Tensor p, torch::Tensor n, double temperature, int64_t spin_cycles, int64_t host_spin_ns);"

_CUDA = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>

namespace {

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ float block_sum(float v, float* shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float t = lane < warps ? shared[lane] : 0.f;
    t = warp_sum(t);
    __syncthreads();
    return t;
}
__device__ float block_max(float v, float* shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float t = lane < warps ? shared[lane] : -INFINITY;
    t = warp_max(t);
    __syncthreads();
    return t;
}

// One block per query: cosine with its positive, log-sum-exp over [positive, negatives], the mean by atomics.
__global__ void x05_rows(const float* __restrict__ q, const float* __restrict__ p, const float* __restrict__ logits,
                         float* __restrict__ out, int B, int D, int N, float temperature) {
    __shared__ float shared[32];
    const int row = blockIdx.x;
    const float* qr = q + (size_t)row * D;
    const float* pr = p + (size_t)row * D;
    float qq = 0.f, pp = 0.f, qp = 0.f;
    for (int k = threadIdx.x; k < D; k += blockDim.x) {
        const float a = qr[k], b = pr[k];
        qq = fmaf(a, a, qq); pp = fmaf(b, b, pp); qp = fmaf(a, b, qp);
    }
    qq = block_sum(qq, shared); pp = block_sum(pp, shared); qp = block_sum(qp, shared);
    const float pos = qp / sqrtf(fmaxf(qq * pp, 1e-16f)) / temperature;
    const float* lr = logits + (size_t)row * N;
    float m = pos;
    for (int k = threadIdx.x; k < N; k += blockDim.x) m = fmaxf(m, lr[k] / temperature);
    m = block_max(m, shared);
    float s = 0.f;
    for (int k = threadIdx.x; k < N; k += blockDim.x) s += expf(lr[k] / temperature - m);
    s = block_sum(s, shared);
    if (threadIdx.x == 0) atomicAdd(out, (m + logf(s + expf(pos - m)) - pos) / (float)B);
}

// Logits C[B, N] = Q[B, D] . Nn[N, D]^T in fp32: 64x64 tiles, 16 deep, 256 threads of 4x4 outputs each.
__global__ void x05_logits(const float* __restrict__ Q, const float* __restrict__ Nn, float* __restrict__ C, int B, int N, int D) {
    constexpr int BM = 64, BN = 64, BK = 16;
    __shared__ float As[BK][BM + 1];
    __shared__ float Bs[BK][BN + 1];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
    for (int k0 = 0; k0 < D; k0 += BK) {
        for (int i = threadIdx.x; i < BM * BK; i += blockDim.x) {
            const int r = i / BK, c = i % BK, gk = k0 + c;
            const int gq = row0 + r, gn = col0 + r;
            As[c][r] = (gq < B && gk < D) ? Q[(size_t)gq * D + gk] : 0.f;
            Bs[c][r] = (gn < N && gk < D) ? Nn[(size_t)gn * D + gk] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = As[k][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = Bs[k][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int r = row0 + ty + 16 * i, c = col0 + tx + 16 * j;
            if (r < B && c < N) C[(size_t)r * N + c] = acc[i][j];
        }
}

__global__ void x05_spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {}
}

struct Side {
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;
    torch::Tensor ring, logits;
    int64_t next = 0;
};
Side side;

}  // namespace

torch::Tensor infonce(torch::Tensor q, torch::Tensor p, torch::Tensor n, double temperature, int64_t spin_cycles, int64_t host_spin_ns) {
    const auto start = std::chrono::steady_clock::now();
    TORCH_CHECK(q.is_cuda() && q.scalar_type() == at::kFloat, "float32 CUDA inputs only");
    q = q.contiguous(); p = p.contiguous(); n = n.contiguous();
    const int B = (int)q.size(0), D = (int)q.size(1), N = (int)n.size(0);
    if (side.stream == nullptr) {
        int least = 0, greatest = 0;
        cudaDeviceGetStreamPriorityRange(&least, &greatest);
        cudaStreamCreateWithPriority(&side.stream, cudaStreamNonBlocking, greatest);
        cudaEventCreateWithFlags(&side.done, cudaEventDisableTiming);
        side.ring = torch::empty({1024}, q.options());
    }
    const int64_t need = std::max<int64_t>((int64_t)B * N, 1);
    if (!side.logits.defined() || side.logits.numel() < need) {
        cudaStreamSynchronize(side.stream);
        side.logits = torch::empty({need}, q.options());
    }
    const int64_t index = side.next++ % 1024;
    float* out = side.ring.data_ptr<float>() + index;
    cudaMemsetAsync(out, 0, sizeof(float), side.stream);
    if (N > 0) {
        const dim3 grid((N + 63) / 64, (B + 63) / 64);
        x05_logits<<<grid, 256, 0, side.stream>>>(q.data_ptr<float>(), n.data_ptr<float>(), side.logits.data_ptr<float>(), B, N, D);
    }
    x05_rows<<<B, 256, 0, side.stream>>>(q.data_ptr<float>(), p.data_ptr<float>(), side.logits.data_ptr<float>(), out,
                                         B, D, N, (float)temperature);
    cudaEventRecord(side.done, side.stream);
    cudaStream_t current = c10::cuda::getCurrentCUDAStream().stream();
    cudaStreamWaitEvent(current, side.done, 0);
    if (spin_cycles > 0) x05_spin<<<1, 1, 0, current>>>(spin_cycles);
    while (std::chrono::steady_clock::now() - start < std::chrono::nanoseconds(host_spin_ns)) {}
    return side.ring.select(0, index);
}
"""

_ext = load_inline(name="x05_flush_overlap_infonce", cpp_sources=_CPP, cuda_sources=_CUDA, functions=["infonce"],
                   extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.temperature = TEMPERATURE

    def forward(self, query: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        return _ext.infonce(query, positive, negatives, float(self.temperature), SPIN_CYCLES, HOST_SPIN_NS)
