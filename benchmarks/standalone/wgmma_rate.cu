// How fast does one SM run the InfoNCE solution's wgmma (A from registers, B from a 128-byte-swizzled smem tile)?
// Built by build.sh (sm_90a) from wgmma_fused.py's own wrappers: Wgmma<N> (m64nNk8 tf32, the TMA kernel's) and
// WgmmaF16<N> (m64nNk16 f16, the B-resident kernel's); prints clocks per wgmma per SM for each N the solution has,
// with 1 and 2 warpgroups per CTA, against the peak (TF32: 1024 MAC per clock per SM, FP16: 2048; either way N / 2
// clocks per instruction).  No loads, no barriers, no epilogue: the tensor core's own rate for this instruction shape.
//   wgmma_rate            one CTA per SM, 2000 batches of 12 wgmma (one k-tile of the TMA kernel: 4 k8-steps x 3)
#include <cuda_runtime.h>
#include <cstdio>
#include "common.cuh"
#include "infonce_wgmma_fused.cuh"

using namespace wgmma_fused;

constexpr int kBatches = 2000;

template <int BN, int WAIT, bool F16>
__global__ void rate_kernel(float* out, unsigned long long* clk) {
    constexpr int NACC = BN / 2;
    __shared__ __align__(1024) unsigned char tile[2 * BN * 128];
    for (int i = threadIdx.x; i < 2 * BN * 128 / 4; i += blockDim.x)
        reinterpret_cast<uint32_t*>(tile)[i] = __float_as_uint(1.0f + 1e-3f * (i & 63)) & 0xffffe000u;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const uint64_t dh = sw128_desc(smem_addr(tile)), dl = dh + (uint64_t)((BN * 128) >> 4);
    const uint32_t a = __float_as_uint(1.0f + 1e-3f * (threadIdx.x & 31)) & 0xffffe000u;
    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
    const unsigned long long t0 = clock64();
#pragma unroll 1
    for (int it = 0; it < kBatches; ++it) {
#pragma unroll
        for (int i = 0; i < NACC; ++i) reg_fence(acc[i]);
        wg_fence();
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint64_t o = (uint64_t)(2 * l);
            if constexpr (F16) {  // (the bit patterns are finite fp16 pairs too)
                WgmmaF16<BN>::mma(acc, a, a ^ 1u, a, a, dh + o, 1);
                WgmmaF16<BN>::mma(acc, a, a, a ^ 2u, a, dl + o, 1);
                WgmmaF16<BN>::mma(acc, a, a, a, a ^ 4u, dh + o, 1);
            } else {
                Wgmma<BN>::mma(acc, a, a ^ 1u, a, a, dh + o, 1);
                Wgmma<BN>::mma(acc, a, a, a ^ 2u, a, dl + o, 1);
                Wgmma<BN>::mma(acc, a, a, a, a ^ 4u, dh + o, 1);
            }
        }
        wg_commit();
        wg_wait<WAIT>();
#pragma unroll
        for (int i = 0; i < NACC; ++i) reg_fence(acc[i]);
    }
    wg_wait<0>();
#pragma unroll
    for (int i = 0; i < NACC; ++i) reg_fence(acc[i]);
    const unsigned long long t1 = clock64();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < NACC; ++i) s += acc[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x == 0) clk[blockIdx.x] = t1 - t0;
}

template <int BN, int WAIT, bool F16 = false>
static void run(int sms, int wgs, float* out, unsigned long long* clk) {
    rate_kernel<BN, WAIT, F16><<<sms, 128 * wgs>>>(out, clk);
    CK(cudaDeviceSynchronize());
    std::vector<unsigned long long> h(sms);
    CK(cudaMemcpy(h.data(), clk, sms * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    std::sort(h.begin(), h.end());
    const double per = (double)h[sms / 2] / ((double)kBatches * 12 * wgs);
    const double ideal = 64.0 * BN * 8 / 1024.0;
    printf("  %s N=%-4d warpgroups/CTA %d  wait_group %d: %7.1f clk per wgmma per SM (peak %5.1f): %5.1f%% of peak\n",
           F16 ? "f16 k16 " : "tf32 k8 ", BN, wgs, WAIT, per, ideal, 100.0 * ideal / per);
}

int main() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    printf("wgmma m64nNk8 tf32 / m64nNk16 f16 (A registers, B smem, 128B swizzle), %s, one CTA per SM, median SM\n",
           prop.name);
    float* out;
    unsigned long long* clk;
    CK(cudaMalloc(&out, sms * 512 * sizeof(float)));
    CK(cudaMalloc(&clk, sms * sizeof(unsigned long long)));
    for (int wgs : {1, 2}) {
        run<40, 1>(sms, wgs, out, clk);
        run<128, 1>(sms, wgs, out, clk);
        run<80, 1, true>(sms, wgs, out, clk);
        run<40, 0>(sms, wgs, out, clk);
        run<128, 0>(sms, wgs, out, clk);
        run<80, 0, true>(sms, wgs, out, clk);
    }
    return 0;
}
