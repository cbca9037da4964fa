// What the standalone benches share (no torch): error checks, a hash for reproducible fills, and the timer.
#pragma once
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

__device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed) {
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<uint32_t>(z ^ (z >> 31));
}

static float* g_flush = nullptr;  // cudaMalloc'd by main: kFlushBytes
static const size_t kFlushBytes = 256u << 20;
static int g_sms = 0;

// Median of `reps` calls (after 3 warm-ups), CUDA events around each, a 256 MB memset before each so that
// no call finds its inputs in L2. `wait(end_event)` waits for each call (benches that bound their waits pass
// their own).
template <class F, class Wait>
static double time_median_waiting(F&& launch, int reps, Wait&& wait) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int i = 0; i < reps + 3; ++i) {
        CK(cudaMemsetAsync(g_flush, i & 0xff, kFlushBytes));
        CK(cudaEventRecord(a));
        launch();
        CK(cudaEventRecord(b));
        wait(b);
        float t;
        CK(cudaEventElapsedTime(&t, a, b));
        if (i >= 3) ms.push_back(t);
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

template <class F>
static double time_median(F&& launch, int reps) {
    return time_median_waiting(launch, reps, [](cudaEvent_t end) { CK(cudaEventSynchronize(end)); });
}
