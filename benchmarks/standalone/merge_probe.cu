// Where do the 3.2-3.6 us of the InfoNCE seed shape's ticket tail go?
// tail_probe.cu measured the ticket tail as a whole; this probe stamps its steps with %globaltimer, in the layout of
// the shipped K-split kernel: 128 CTAs of 256 threads (200 KB of shared memory, one per SM), CTA c spins for a fixed
// number of clocks (the K loop), then writes the (max, sum) partials of 64 rows (rows 64 (c % 4) ..., split c / 4, so
// S = 32 partials per row of 256), takes an acq_rel ticket, and the last CTA merges: thread t loads row t's positive
// logit and its 32 partials (one round), folds them, forms the row loss, and the block writes the mean.
// Stamps (thread 0 of each CTA): partials stored; ticket taken.  In the merging CTA, behind a CTA barrier each (so
// that they mark the slowest thread): loads landed; row losses formed; output stored.  All are relative to a
// one-thread stamp kernel launched just before (after the flush).  The stamped build's event time is printed beside
// the unstamped one (the barriers cost a little), and the spin kernel alone beside both.
// A second stand-in ends with the solution's own end, `wgmma_fused::finish_cta` from wgmma_fused.py (event time only:
// the solution carries no stamps).
#include <cuda_runtime.h>
#include <cmath>
#include <cstdio>
#include <vector>
#include <algorithm>
#include "common.cuh"
#include "infonce_wgmma_fused.cuh"  // the solution's device code (build.sh: extracted from wgmma_fused.py, sm_90a)

namespace {
constexpr int B_ROWS = 256, S = 32, GRID = 128, NT = 256, ROWS = 64, SMEM = 200 * 1024, NSTAMP = 5;
constexpr double LN2 = 0.69314718055994530942;

struct Args {
    float2* part;       // [S][B_ROWS]
    const double* pos;  // [B_ROWS]
    unsigned* counter;  // the ticket (zeroed again by the merger)
    float* out;
    long long spin;
    unsigned long long* stamps;  // [GRID][NSTAMP]
};

__device__ unsigned long long g_ref;
__device__ __forceinline__ unsigned long long now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    return t;
}
__global__ void ref_stamp_kernel() { g_ref = now(); }

__device__ __forceinline__ float2 partial(int split, int row) {  // m in [4, 12), s in [1, 31)
    const uint32_t h = hash32((uint64_t)split * B_ROWS + row, 21u);
    return make_float2(4.f + 8.f * (h >> 16) * (1.f / 65536.f), 1.f + 30.f * (h & 0xffffu) * (1.f / 65536.f));
}

template <bool STAMPS>
__global__ void __launch_bounds__(NT, 1) ticket_kernel(const Args A) {
    const int split = blockIdx.x / 4, row0 = (blockIdx.x % 4) * ROWS, tid = threadIdx.x;
    unsigned long long* st = A.stamps + (size_t)blockIdx.x * NSTAMP;
    const long long t0 = clock64();
    while (clock64() - t0 < A.spin) {
    }
    if (tid < ROWS) A.part[(size_t)split * B_ROWS + row0 + tid] = partial(split, row0 + tid);
    if (STAMPS && tid == 0) st[0] = now();
    __shared__ int s_last;
    __shared__ double s_w[NT / 32];
    __syncthreads();
    if (tid == 0) {
        unsigned old;
        asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;" : "=r"(old) : "l"(A.counter) : "memory");
        s_last = old == gridDim.x - 1;
    }
    __syncthreads();
    if (STAMPS && tid == 0) st[1] = now();
    if (!s_last) return;
    const double pv = __ldcg(A.pos + tid);
    float2 v[S];
#pragma unroll
    for (int u = 0; u < S; ++u) v[u] = __ldcg(A.part + (size_t)u * B_ROWS + tid);
    float m = -INFINITY;
#pragma unroll
    for (int u = 0; u < S; ++u) m = fmaxf(m, v[u].x);
    if (STAMPS) {
        __syncthreads();
        if (tid == 0) st[2] = now() + (m > 0.f ? 0 : 1);  // uses m: the stamp waits for the loads
    }
    float s = 0.f;
#pragma unroll
    for (int u = 0; u < S; ++u) s = fmaf(v[u].y, exp2f(v[u].x - m), s);
    double loss = ((double)m + (double)log2f(s)) * LN2 - pv;
    if (STAMPS) {
        __syncthreads();
        if (tid == 0) st[3] = now() + (loss > -1e30 ? 0 : 1);
    }
    for (int off = 16; off > 0; off >>= 1) loss += __shfl_xor_sync(0xffffffffu, loss, off);
    if ((tid & 31) == 0) s_w[tid >> 5] = loss;
    __syncthreads();
    if (tid == 0) {
        double t = 0.0;
        for (int w = 0; w < NT / 32; ++w) t += s_w[w];
        A.out[0] = (float)(t / B_ROWS);
        A.counter[0] = 0u;
        if (STAMPS) st[4] = now();
    }
}

// The same stand-in ending with the solution's finish_cta: warpgroup 0 holds the CTA's 64 rows in the wgmma layout (thread
// (warp w, lane l) rows row0 + 16 w + l / 4 and + 8), lane l % 4 == 0 of each quad carries the row's sum.
__global__ void __launch_bounds__(NT, 1) shipped_end_kernel(const Args A, const wgmma_fused::WgParams P) {
    const int split = blockIdx.x / 4, row0 = (blockIdx.x % 4) * ROWS, tid = threadIdx.x, lane = tid & 31;
    const long long t0 = clock64();
    while (clock64() - t0 < A.spin) {
    }
    const int rA = row0 + 16 * ((tid >> 5) & 3) + (lane >> 2);
    float run_m[2], run_s[2];
    for (int h = 0; h < 2; ++h) {
        const float2 v = partial(split, rA + 8 * h);
        run_m[h] = v.x, run_s[h] = (lane & 3) == 0 ? v.y : 0.f;
    }
    if (tid == 0) A.stamps[(size_t)blockIdx.x * NSTAMP] = now();
    __shared__ double s_wsum[NT / 32];
    __shared__ int s_flag;
    wgmma_fused::finish_cta<NT>(P, run_m, run_s, rA, tid < 128 && (lane & 3) == 0 ? 3 : 0, split, s_wsum, &s_flag);
}

__global__ void __launch_bounds__(NT, 1) spin_kernel(const Args A) {  // the stand-in K loop and its stores alone
    const int split = blockIdx.x / 4, row0 = (blockIdx.x % 4) * ROWS;
    const long long t0 = clock64();
    while (clock64() - t0 < A.spin) {
    }
    if (threadIdx.x < ROWS) A.part[(size_t)split * B_ROWS + row0 + threadIdx.x] = partial(split, row0 + threadIdx.x);
}

double pct(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v[(size_t)(p * (v.size() - 1) + 0.5)];
}
}  // namespace

int main(int argc, char** argv) {
    CK(cudaMalloc(&g_flush, kFlushBytes));
    Args A = {};
    CK(cudaMalloc(&A.part, sizeof(float2) * S * B_ROWS));
    CK(cudaMalloc(&A.counter, 64));
    CK(cudaMemset(A.counter, 0, 64));
    CK(cudaMalloc(&A.out, 64));
    CK(cudaMalloc(&A.stamps, sizeof(unsigned long long) * GRID * NSTAMP));
    std::vector<double> hpos(B_ROWS);
    for (int r = 0; r < B_ROWS; ++r) hpos[r] = 5.0 + 0.01 * r;
    double* pos;
    CK(cudaMalloc(&pos, sizeof(double) * B_ROWS));
    CK(cudaMemcpy(pos, hpos.data(), sizeof(double) * B_ROWS, cudaMemcpyHostToDevice));
    A.pos = pos;
    A.spin = argc > 1 ? atoll(argv[1]) : 16000;
    CK(cudaFuncSetAttribute(ticket_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    CK(cudaFuncSetAttribute(ticket_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    CK(cudaFuncSetAttribute(spin_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    CK(cudaFuncSetAttribute(shipped_end_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    wgmma_fused::WgParams P = {};
    P.B = B_ROWS, P.S = S, P.part = A.part, P.pos = pos, P.counters = A.counter, P.out = A.out;
    P.inv_b = 1.0 / B_ROWS;

    // the reference loss, from the partials as the spin kernel writes them
    spin_kernel<<<GRID, NT, SMEM>>>(A);
    CK(cudaDeviceSynchronize());
    std::vector<float2> hp((size_t)S * B_ROWS);
    CK(cudaMemcpy(hp.data(), A.part, sizeof(float2) * hp.size(), cudaMemcpyDeviceToHost));
    // (the probe's merge averages x = lse - pos; finish_cta averages softplus(x), as InfoNCE's row loss)
    double ref = 0.0, ref_softplus = 0.0;
    for (int r = 0; r < B_ROWS; ++r) {
        double m = -INFINITY, s = 0.0;
        for (int k = 0; k < S; ++k) m = std::max(m, (double)hp[(size_t)k * B_ROWS + r].x);
        for (int k = 0; k < S; ++k) s += hp[(size_t)k * B_ROWS + r].y * std::exp2(hp[(size_t)k * B_ROWS + r].x - m);
        const double x = (m + std::log2(s)) * LN2 - hpos[r];
        ref += x;
        ref_softplus += std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x)));
    }
    ref /= B_ROWS;
    ref_softplus /= B_ROWS;

    printf("merge probe: %d CTAs x %d threads, %d KB smem, spin %lld clocks, S = %d partials per row, B = %d\n", GRID,
           NT, SMEM / 1024, A.spin, S, B_ROWS);
    int fails = 0;
    auto timed = [&](const char* name, auto&& call, bool check, double want = 0.0) {
        CK(cudaMemset(A.out, 0xff, 4));
        const double ms = time_median(call, 200);
        float got = 0.f;
        CK(cudaMemcpy(&got, A.out, 4, cudaMemcpyDeviceToHost));
        if (want == 0.0) want = ref;
        const double err = std::fabs(got - want) / std::fabs(want);
        if (check && err >= 1e-5) ++fails;
        printf("  %-28s %8.2f us (events, median of 200, 256 MB memset before each)%s\n", name, 1e3 * ms,
               check ? (err < 1e-5 ? "  loss ok" : "  loss WRONG") : "");
    };
    timed("spin kernel alone", [&] { spin_kernel<<<GRID, NT, SMEM>>>(A); }, false);
    timed("ticket + merge", [&] { ticket_kernel<false><<<GRID, NT, SMEM>>>(A); }, true);
    timed("ticket + merge, stamped", [&] { ticket_kernel<true><<<GRID, NT, SMEM>>>(A); }, true);
    timed("the solution's finish_cta", [&] { shipped_end_kernel<<<GRID, NT, SMEM>>>(A, P); }, true, ref_softplus);

    // stamped calls: flush, stamp kernel, kernel; then read the stamps (the probe's own merge: its stamps 0-4).
    const int calls = 100;
    std::vector<unsigned long long> h((size_t)GRID * NSTAMP);
    auto stamped = [&](const char* title) {
        std::vector<double> stored_max, ticket_max, loads, losses, output, tick;
        for (int i = 0; i < calls; ++i) {
            CK(cudaMemset(A.stamps, 0, sizeof(unsigned long long) * h.size()));
            CK(cudaMemsetAsync(g_flush, i & 0xff, kFlushBytes));
            ref_stamp_kernel<<<1, 1>>>();
            ticket_kernel<true><<<GRID, NT, SMEM>>>(A);
            CK(cudaDeviceSynchronize());
            unsigned long long r0;
            CK(cudaMemcpyFromSymbol(&r0, g_ref, sizeof r0));
            CK(cudaMemcpy(h.data(), A.stamps, sizeof(unsigned long long) * h.size(), cudaMemcpyDeviceToHost));
            // per CTA: t[0] spin done / partials stored, t[1] ticket taken, merger only: t[2..4]
            auto t = [&](int c, int k) -> unsigned long long { return h[(size_t)c * NSTAMP + k]; };
            std::vector<double> st0, st1;
            int merger = -1;
            for (int c = 0; c < GRID; ++c) {
                st0.push_back(1e-3 * (double)(t(c, 0) - r0));
                st1.push_back(1e-3 * (double)(t(c, 1) - r0));
                if (t(c, 4) != 0) merger = c;
            }
            if (merger < 0) { printf("  call %d: no merger stamp\n", i); ++fails; continue; }
            stored_max.push_back(pct(st0, 1.0));
            ticket_max.push_back(pct(st1, 1.0));
            loads.push_back(1e-3 * (double)(t(merger, 2) - t(merger, 1)));
            losses.push_back(1e-3 * (double)(t(merger, 3) - t(merger, 2)));
            output.push_back(1e-3 * (double)(t(merger, 4) - t(merger, 3)));
            std::vector<unsigned long long> raw;
            for (int c = 0; c < GRID; ++c) raw.push_back(t(c, 0));
            std::sort(raw.begin(), raw.end());
            unsigned long long step = ~0ull;
            for (size_t k = 1; k < raw.size(); ++k)
                if (raw[k] != raw[k - 1]) step = std::min(step, raw[k] - raw[k - 1]);
            tick.push_back((double)step);
        }
        auto line = [&](const char* what, const std::vector<double>& v) {
            if (!v.empty())
                printf("  %-56s p10 %6.2f  p50 %6.2f  p90 %6.2f us\n", what, pct(v, 0.1), pct(v, 0.5), pct(v, 0.9));
        };
        printf("%s, stamps over %d calls (us after the stamp kernel, or between steps of the merging CTA):\n", title,
               calls);
        line("partials stored, last CTA", stored_max);
        line("ticket taken, last CTA (the merger)", ticket_max);
        line("merger: ticket -> loads landed (pos + 32 partials)", loads);
        line("merger: loads -> row losses formed", losses);
        line("merger: losses -> output stored", output);
        if (!tick.empty())
            printf("  smallest nonzero step between CTAs' stamps (globaltimer resolution bound): %.0f ns (p50)\n",
                   pct(tick, 0.5));
    };
    stamped("probe's own merge");
    printf("RESULT failures=%d\n", fails);
    return fails ? 1 : 0;
}
