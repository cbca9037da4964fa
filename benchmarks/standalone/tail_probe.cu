// What does the InfoNCE seed shape's tail cost, and would a second launch do it cheaper?
// A stand-in for fast_v3's B-resident kernel at the seed shape: 128 CTAs of 256 threads, one per SM (200 KB of shared
// memory each, so 4 of the 132 SMs stay free), each spins for a fixed number of clocks (the K loop) and writes its
// partials of 128 rows: the (max, sum) pair of each row as fast_v3 does (float2, at part[split][row]), or one float
// l = max + log2(sum).  Then the tail, one of:
//   ticket  - fast_v3's: one acq_rel ticket per CTA, the last CTA (256 threads) merges every row (2 rounds of 32 loads);
//   pdl     - no ticket: a second kernel of one 1024-thread CTA, launched with programmatic stream serialization, so it
//             is resident on a free SM before the first ends, waits in griddepcontrol.wait, then merges with 4 threads
//             per row (one round of 16 loads each, the quad combined by shuffles in a fixed order);
//   2launch - the same second kernel launched plainly (no overlap with the first).
// Every variant writes the mean of (max + log2 sum) * ln 2 - pos over the rows; the host checks it against its own
// merge of the same partials.  Prints the median event time (256 MB memset before each call) of each variant beside
// the spin kernel alone: the difference is the tail's cost.
#include <cuda_runtime.h>
#include <cmath>
#include <cstdio>
#include <vector>
#include "common.cuh"

namespace {
constexpr int B_ROWS = 256, S = 64, GRID = 128, NT = 256, BM = 128, SMEM = 200 * 1024;
constexpr double LN2 = 0.69314718055994530942;

struct Tail {
    float2* part2;      // [S][B] (max, sum)
    float* part1;       // [S][B] max + log2(sum)
    const double* pos;  // [B] the positive logit of each row
    unsigned* counter;  // the ticket (zeroed again by the merger)
    float* out;
    long long spin;     // clocks of the stand-in K loop
};

__device__ __forceinline__ float part_max(int split, int row) {
    return 4.f + 8.f * (hash32((uint64_t)split * B_ROWS + row, 11u) >> 8) * (1.f / 16777216.f);
}
__device__ __forceinline__ float part_sum(int split, int row) {
    return 1.f + 30.f * (hash32((uint64_t)split * B_ROWS + row, 12u) >> 8) * (1.f / 16777216.f);
}

// The work of one CTA: spin, then write the partials of its 128 rows (thread t < 128: row row0 + t).
template <bool ONE_FLOAT>
__device__ __forceinline__ void work(const Tail& T, int split, int row0) {
    const long long t0 = clock64();
    while (clock64() - t0 < T.spin) {
    }
    if (threadIdx.x < BM) {
        const int row = row0 + threadIdx.x;
        const float m = part_max(split, row), s = part_sum(split, row);
        if (ONE_FLOAT) T.part1[(size_t)split * B_ROWS + row] = m + log2f(s);
        else T.part2[(size_t)split * B_ROWS + row] = make_float2(m, s);
    }
}

// The (max, sum) of one partial, in either layout.
template <bool ONE_FLOAT>
__device__ __forceinline__ float2 load_part(const Tail& T, int split, int row) {
    if (ONE_FLOAT) return make_float2(__ldcg(T.part1 + (size_t)split * B_ROWS + row), 1.f);
    return __ldcg(T.part2 + (size_t)split * B_ROWS + row);
}

// Folds a (max, sum) pair into a running one.
__device__ __forceinline__ void fold(float& m, float& s, float2 v) {
    const float mm = fmaxf(m, v.x);
    s = s * exp2f(m - mm) + v.y * exp2f(v.x - mm);
    m = mm;
}

// Block-wide sum of one double per thread, written by thread 0 as the mean over the rows; the counter is reset.
template <int THREADS>
__device__ __forceinline__ void write_mean(const Tail& T, double v) {
    __shared__ double s_w[THREADS / 32];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) == 0) s_w[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < THREADS / 32; ++w) t += s_w[w];
        T.out[0] = (float)(t / B_ROWS);
        T.counter[0] = 0u;
    }
}

__device__ __forceinline__ double row_loss(const Tail& T, int row, float m, float s) {
    return ((double)m + (double)log2f(s)) * LN2 - __ldcg(T.pos + row);
}

template <bool ONE_FLOAT, bool TICKET>
__global__ void __launch_bounds__(NT, 1) work_kernel(const Tail T) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // no effect without a programmatic dependent
    const int mt = blockIdx.x % 2, split = blockIdx.x / 2;
    work<ONE_FLOAT>(T, split, mt * BM);
    if (!TICKET) return;
    __shared__ int s_last;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned old;
        asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;" : "=r"(old) : "l"(T.counter) : "memory");
        s_last = old == gridDim.x - 1;
    }
    __syncthreads();
    if (!s_last) return;
    // fast_v3's merge: thread t owns row t, two rounds of 32 loads
    const int row = threadIdx.x;
    float m = -INFINITY, s = 0.f;
#pragma unroll 1
    for (int k0 = 0; k0 < S; k0 += 32) {
        float2 v[32];
#pragma unroll
        for (int u = 0; u < 32; ++u) v[u] = load_part<ONE_FLOAT>(T, k0 + u, row);
#pragma unroll
        for (int u = 0; u < 32; ++u) fold(m, s, v[u]);
    }
    write_mean<NT>(T, row_loss(T, row, m, s));
}

// The second kernel: one CTA of 1024 threads, 4 per row, 16 partials each (splits 4j + q for thread q of the quad:
// the quad's pairs combined by shuffles in a fixed order, so the result does not depend on timing).
template <bool ONE_FLOAT>
__global__ void __launch_bounds__(1024, 1) merge_kernel(const Tail T) {
    asm volatile("griddepcontrol.wait;" ::: "memory");  // returns at once without a programmatic dependency
    const int row = threadIdx.x >> 2, q = threadIdx.x & 3;
    float2 v[S / 4];
#pragma unroll
    for (int j = 0; j < S / 4; ++j) v[j] = load_part<ONE_FLOAT>(T, 4 * j + q, row);
    float m = -INFINITY, s = 0.f;
#pragma unroll
    for (int j = 0; j < S / 4; ++j) fold(m, s, v[j]);
#pragma unroll
    for (int off = 1; off < 4; off <<= 1)
        fold(m, s, make_float2(__shfl_xor_sync(0xffffffffu, m, off), __shfl_xor_sync(0xffffffffu, s, off)));
    write_mean<1024>(T, q == 0 ? row_loss(T, row, m, s) : 0.0);
}

__global__ void spin_kernel(const Tail T) {  // the stand-in K loop alone, as the floor of every row
    work<false>(T, blockIdx.x / 2, (blockIdx.x % 2) * BM);
}

template <class K>
void launch(K kern, int grid, int threads, int smem, bool pdl, const Tail& T) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, kern, T));
}

template <class K>
void allow_smem(K kern) {
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
}
}  // namespace

int main(int argc, char** argv) {
    CK(cudaMalloc(&g_flush, kFlushBytes));
    Tail T = {};
    CK(cudaMalloc(&T.part2, sizeof(float2) * S * B_ROWS));
    CK(cudaMalloc(&T.part1, sizeof(float) * S * B_ROWS));
    CK(cudaMalloc(&T.counter, 64));
    CK(cudaMemset(T.counter, 0, 64));
    CK(cudaMalloc(&T.out, 64));
    double* pos;
    std::vector<double> hpos(B_ROWS);
    for (int r = 0; r < B_ROWS; ++r) hpos[r] = 5.0 + 0.01 * r;
    CK(cudaMalloc(&pos, sizeof(double) * B_ROWS));
    CK(cudaMemcpy(pos, hpos.data(), sizeof(double) * B_ROWS, cudaMemcpyHostToDevice));
    T.pos = pos;
    T.spin = argc > 1 ? atoll(argv[1]) : 16000;
    allow_smem(spin_kernel);
    allow_smem(work_kernel<false, true>);
    allow_smem(work_kernel<true, true>);
    allow_smem(work_kernel<false, false>);
    allow_smem(work_kernel<true, false>);

    // the host's merge of the same partials (the device's hash, recomputed here through a tiny kernel's output)
    CK(cudaMemset(T.part2, 0, sizeof(float2) * S * B_ROWS));
    spin_kernel<<<GRID, NT, SMEM>>>(T);
    CK(cudaDeviceSynchronize());
    std::vector<float2> hp((size_t)S * B_ROWS);
    CK(cudaMemcpy(hp.data(), T.part2, sizeof(float2) * hp.size(), cudaMemcpyDeviceToHost));
    double ref = 0.0;
    for (int r = 0; r < B_ROWS; ++r) {
        double m = -INFINITY, s = 0.0;
        for (int k = 0; k < S; ++k) m = std::max(m, (double)hp[(size_t)k * B_ROWS + r].x);
        for (int k = 0; k < S; ++k) s += hp[(size_t)k * B_ROWS + r].y * std::exp2(hp[(size_t)k * B_ROWS + r].x - m);
        ref += (m + std::log2(s)) * LN2 - hpos[r];
    }
    ref /= B_ROWS;

    printf("tail probe, seed shape stand-in: %d CTAs x %d threads, %d KB smem, spin %lld clocks, S = %d, B = %d\n", GRID,
           NT, SMEM / 1024, T.spin, S, B_ROWS);
    printf("median of 200 calls, 256 MB memset before each; reference loss %.7f\n", ref);
    int fails = 0;
    const double t_spin = time_median([&] { spin_kernel<<<GRID, NT, SMEM>>>(T); }, 200);
    printf("  %-34s %8.4f ms\n", "spin kernel alone", t_spin);
    auto row = [&](const char* name, auto&& call) {
        CK(cudaMemset(T.out, 0xff, 4));
        const double ms = time_median(call, 200);
        float got;
        CK(cudaMemcpy(&got, T.out, 4, cudaMemcpyDeviceToHost));
        const double err = std::fabs(got - ref) / std::fabs(ref);
        const bool ok = err < 1e-5;
        fails += !ok;
        printf("  %-34s %8.4f ms   tail %+7.4f ms   loss %.7f rel_err %.1e %s\n", name, ms, ms - t_spin, got, err,
               ok ? "" : "WRONG");
    };
    row("ticket, float2 (fast_v3)", [&] { launch(work_kernel<false, true>, GRID, NT, SMEM, false, T); });
    row("ticket, one float", [&] { launch(work_kernel<true, true>, GRID, NT, SMEM, false, T); });
    row("pdl merge kernel, float2", [&] {
        launch(work_kernel<false, false>, GRID, NT, SMEM, false, T);
        launch(merge_kernel<false>, 1, 1024, 0, true, T);
    });
    row("pdl merge kernel, one float", [&] {
        launch(work_kernel<true, false>, GRID, NT, SMEM, false, T);
        launch(merge_kernel<true>, 1, 1024, 0, true, T);
    });
    row("2 launches, float2", [&] {
        launch(work_kernel<false, false>, GRID, NT, SMEM, false, T);
        launch(merge_kernel<false>, 1, 1024, 0, false, T);
    });
    row("2 launches, one float", [&] {
        launch(work_kernel<true, false>, GRID, NT, SMEM, false, T);
        launch(merge_kernel<true>, 1, 1024, 0, false, T);
    });
    CK(cudaDeviceSynchronize());
    printf("RESULT failures=%d\n", fails);
    return fails ? 1 : 0;
}
