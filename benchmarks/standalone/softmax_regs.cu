// Standalone softmax bench for the register kernels of solutions/softmax/register_rows.py (no torch): built
// here with nvcc (build.sh), carried to the H200 as a binary. The kernels are compiled from the solution
// file's device string (extract_src.py), not copied; the launches below mirror its host code, and the other
// template arguments (threads, 16-byte units per thread, CTAs per SM, e as fp16 or fp32) are the variants
// kept for experiments beside the shipped ones.
//
//   softmax_regs [long|rows|all] [reps]
//
// long: rows longer than 64 KB, in register segments (softmax_seg_kernel); rows: rows of up to 64 KB, one
// row per CTA (softmax_v4_kernel). For each case: fill x with fresh random values, poison y, run the kernel
// and check every element against a float64 softmax of the same row (one block per row). Then time it:
// CUDA events around each call, a 256 MB memset before every call (L2 flush), median of `reps`. A device copy
// of the 4096x393216 fp32 bytes is timed first, as the ceiling.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>
#include <algorithm>
#include <string>

#include "common.cuh"
#include "softmax_register_rows.cuh"

// Roughly normal values (a sum of 4 uniforms, spread about +-4 * scale); every row also gets a shift, so
// that row maxima differ.
template <class T>
__global__ void fill_kernel(T* x, int64_t n, int64_t cols, float scale, uint32_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const uint32_t h = hash32(i, seed);
        const float u = ((h & 0xff) + ((h >> 8) & 0xff) + ((h >> 16) & 0xff) + (h >> 24)) / 255.0f - 2.0f;
        const float shift = (float)(hash32(i / cols, seed ^ 0x5bd1e995u) % 64) - 32.f;
        x[i] = T(scale * u + shift);
    }
}
template <class T>
__global__ void poison_kernel(T* y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = T(__int_as_float(0x7fc00001));
}
__device__ double to_d(float v) { return v; }
__device__ double to_d(__nv_bfloat16 v) { return __bfloat162float(v); }

// One block per row: float64 max and sum, then the worst |y - ref| over the row, as an absolute error and
// relative to the row's largest probability (1/s). Any NaN in y is counted (the inputs have none).
template <class T>
__global__ void check_kernel(const T* x, const T* y, int64_t cols, double* worst_abs, double* worst_rel, int* nan_count) {
    __shared__ double red[32];
    const T* xr = x + blockIdx.x * cols;
    const T* yr = y + blockIdx.x * cols;
    auto block_max = [&](double v) {
        for (int o = 16; o; o /= 2) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
        __syncthreads();
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
        __syncthreads();
        v = (threadIdx.x & 31) < blockDim.x / 32 ? red[threadIdx.x & 31] : -INFINITY;
        for (int o = 16; o; o /= 2) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
        return v;
    };
    auto block_sum = [&](double v) {
        for (int o = 16; o; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
        __syncthreads();
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
        __syncthreads();
        v = (threadIdx.x & 31) < blockDim.x / 32 ? red[threadIdx.x & 31] : 0.0;
        for (int o = 16; o; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
        return v;
    };
    double m = -INFINITY;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) m = fmax(m, to_d(xr[i]));
    m = block_max(m);
    double s = 0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) s += exp(to_d(xr[i]) - m);
    s = block_sum(s);
    double ea = 0, er = 0;
    int nans = 0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
        const double ref = exp(to_d(xr[i]) - m) / s, got = to_d(yr[i]);
        if (got != got) ++nans;
        ea = fmax(ea, fabs(got - ref));
        er = fmax(er, fabs(got - ref) / (1.0 / s));  // relative to the row's largest probability, 1/s
    }
    ea = block_max(ea);
    er = block_max(er);
    if (threadIdx.x == 0) {
        worst_abs[blockIdx.x] = ea;
        worst_rel[blockIdx.x] = er;
    }
    if (nans) atomicAdd(nan_count, nans);
}

// register_rows.py's launch_seg without torch: the row counters zeroed, then one CTA per segment. `ws` holds
// the pairs (rows * P) and then the counters (rows).
template <class T, int THREADS, int VPT, int MINB>
struct Seg {
    static int64_t segments(int64_t cols) { return (cols / (16 / (int)sizeof(T)) + THREADS * VPT - 1) / (THREADS * VPT); }
    static void launch(const T* x, T* y, int64_t rows, int64_t cols, MS* ws) {
        const int64_t P = segments(cols);
        unsigned* cnt = reinterpret_cast<unsigned*>(ws + rows * P);
        CK(cudaMemsetAsync(cnt, 0, rows * 4));
        softmax_seg_kernel<T, THREADS, VPT, MINB><<<(unsigned)(rows * P), THREADS>>>(x, y, cols, (int)P, ws, cnt);
    }
};

// register_rows.py's launch_rows: one CTA per row.
template <class T, int THREADS, int VPT, int MINB, bool HALF_E>
struct Rows {
    static int64_t segments(int64_t) { return 1; }
    static void launch(const T* x, T* y, int64_t rows, int64_t cols, MS*) {
        softmax_v4_kernel<T, THREADS, VPT, MINB, HALF_E><<<(unsigned)rows, THREADS>>>(x, y, rows, cols);
    }
};

struct Buffers {
    void *x = nullptr, *y = nullptr;
    MS* ws = nullptr;
    double *ea = nullptr, *er = nullptr;
    int* nans = nullptr;
};

template <class T, class S>
static bool run_case(const char* name, int64_t rows, int64_t cols, int reps, Buffers& b, uint32_t seed) {
    const int64_t n = rows * cols;
    T* x = (T*)b.x;
    T* y = (T*)b.y;
    fill_kernel<T><<<g_sms * 8, 512>>>(x, n, cols, 2.f, seed);
    poison_kernel<T><<<g_sms * 8, 512>>>(y, n);
    CK(cudaMemset(b.nans, 0, 4));
    S::launch(x, y, rows, cols, b.ws);
    CK(cudaGetLastError());
    check_kernel<T><<<(unsigned)rows, 512>>>(x, y, cols, b.ea, b.er, b.nans);
    CK(cudaDeviceSynchronize());
    std::vector<double> ea(rows), er(rows);
    int nans = 0;
    CK(cudaMemcpy(ea.data(), b.ea, rows * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(er.data(), b.er, rows * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&nans, b.nans, 4, cudaMemcpyDeviceToHost));
    const double wa = *std::max_element(ea.begin(), ea.end()), wr = *std::max_element(er.begin(), er.end());
    const bool fp32 = sizeof(T) == 4;
    const bool ok = nans == 0 && wr < (fp32 ? 1e-4 : 1e-2);
    const double bytes = 2.0 * n * sizeof(T);
    printf("%-34s %6lldx%-8lld P=%-4lld  %s (worst abs %.2e, rel-to-max %.2e, NaN %d)",
           name, (long long)rows, (long long)cols, (long long)S::segments(cols), ok ? "ok  " : "FAIL", wa, wr, nans);
    if (reps > 0) {
        const double ms = time_median([&] { S::launch(x, y, rows, cols, b.ws); }, reps);
        printf("  %.4f ms  %.3f TB/s", ms, bytes / ms / 1e9);
    }
    printf("\n");
    fflush(stdout);
    return ok;
}

int main(int argc, char** argv) {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    g_sms = prop.multiProcessorCount;
    const std::string mode = argc > 1 ? argv[1] : "all";
    const int reps = argc > 2 ? atoi(argv[2]) : 30;
    printf("device %s, %d SMs, reps %d\n", prop.name, g_sms, reps);
    CK(cudaMalloc(&g_flush, kFlushBytes));
    const size_t max_bytes = (size_t)4096 * 393216 * 4;
    Buffers b;
    CK(cudaMalloc(&b.x, max_bytes));
    CK(cudaMalloc(&b.y, max_bytes));
    CK(cudaMalloc(&b.ws, 64 << 20));  // pairs + counters
    CK(cudaMalloc(&b.ea, 65536 * 8));
    CK(cudaMalloc(&b.er, 65536 * 8));
    CK(cudaMalloc(&b.nans, 4));

    // The ceiling: a device copy of the timing shape's bytes (read + write).
    const double copy_ms = time_median([&] { CK(cudaMemcpyAsync(b.y, b.x, max_bytes, cudaMemcpyDeviceToDevice)); }, reps);
    printf("device copy, %.2f GB read + written: %.4f ms  %.3f TB/s\n", 2.0 * max_bytes / 1e9, copy_ms, 2.0 * max_bytes / copy_ms / 1e9);

    using B = __nv_bfloat16;
    // long rows: threads x 16-byte units per thread, CTAs per SM (the first of each dtype is the shipped one)
    using SegF36 = Seg<float, 128, 36, 3>;
    using SegF24 = Seg<float, 128, 24, 4>;
    using SegF512x6 = Seg<float, 512, 6, 3>;
    using SegF512x8 = Seg<float, 512, 8, 2>;
    using SegB12 = Seg<B, 128, 12, 4>;
    using SegB512x4 = Seg<B, 512, 4, 2>;
    bool all = true;
    uint32_t seed = 1;
    if (mode == "long" || mode == "all") {
        // correctness only: partial last segments, P > 32 (several pairs per lane), P = 2, bf16
        all &= run_case<float, SegF36>("128x36 partial segment", 7, 393216 + 4 * 37, 0, b, seed++);
        all &= run_case<float, SegF36>("128x36 P=114", 2, 4 << 20, 0, b, seed++);
        all &= run_case<float, SegF24>("128x24 P=2", 300, 2 * 128 * 24 * 4, 0, b, seed++);
        all &= run_case<B, SegB12>("bf16 128x12", 64, 393216 + 8, 0, b, seed++);
        all &= run_case<B, SegB12>("bf16 128x12 partial", 33, 200008, 0, b, seed++);
        // timed: the fp32 timing shape (shipped against the other shapes), other widths, bf16 long rows
        for (int rep = 0; rep < 2; ++rep) {
            all &= run_case<float, SegF36>("128x36, 72 KB, 3 CTA/SM (shipped)", 4096, 393216, reps, b, seed++);
            all &= run_case<float, SegF24>("128x24, 48 KB, 4 CTA/SM", 4096, 393216, reps, b, seed++);
            all &= run_case<float, SegF512x6>("512x6, 48 KB, 3 CTA/SM", 4096, 393216, reps, b, seed++);
            all &= run_case<float, SegF512x8>("512x8, 64 KB, 2 CTA/SM", 4096, 393216, reps, b, seed++);
        }
        all &= run_case<float, SegF36>("128x36 (shipped)", 2048, 262144, reps, b, seed++);
        all &= run_case<float, SegF36>("128x36 (shipped)", 1024, 1048576, reps, b, seed++);
        all &= run_case<B, SegB12>("bf16 128x12, 24 KB, 4 CTA/SM (shipped)", 4096, 393216, reps, b, seed++);
        all &= run_case<B, SegB512x4>("bf16 512x4, 32 KB, 2 CTA/SM", 4096, 393216, reps, b, seed++);
    }
    if (mode == "rows" || mode == "all") {
        // the shipped row kernels (fp32 16384, bf16 32768, bf16 4096) and other shapes of the same templates
        using RowsF = Rows<float, 512, 8, 2, false>;
        using RowsB1024 = Rows<B, 1024, 4, 2, true>;
        using RowsB512 = Rows<B, 512, 8, 2, true>;
        using RowsBWarp = Rows<B, 32, 16, 24, true>;
        using RowsB64F32 = Rows<B, 64, 8, 10, false>;
        all &= run_case<B, RowsB1024>("bf16 1024x4 partial row", 77, 32768 - 8 * 130, 0, b, seed++);
        all &= run_case<B, RowsBWarp>("bf16 32x16 partial row", 77, 4096 - 8 * 13, 0, b, seed++);
        for (int rep = 0; rep < 2; ++rep) {
            all &= run_case<float, RowsF>("512x8 (shipped fp32 16384)", 8192, 16384, reps, b, seed++);
            all &= run_case<B, RowsB1024>("1024x4, fp16 e (shipped bf16 32768)", 16384, 32768, reps, b, seed++);
            all &= run_case<B, RowsB512>("512x8, fp16 e", 16384, 32768, reps, b, seed++);
            all &= run_case<B, RowsBWarp>("32x16, fp16 e (shipped bf16 4096)", 32768, 4096, reps, b, seed++);
            all &= run_case<B, RowsB64F32>("64x8, fp32 e", 32768, 4096, reps, b, seed++);
        }
    }
    printf(all ? "ALL CORRECT\n" : "SOME CASES FAILED\n");
    return all ? 0 : 1;
}
