// What does an empty launch cost under the harness's timing, and how much of it is the launch's shape?
// The InfoNCE seed shape's fixed cost includes an "empty kernel" of about 2.9 us (stream_probe: 128 CTAs
// with its shared memory).  This probe times kernels that do nothing, or only write a few floats, in launch shapes
// between <<<1, 32>>> and fast_v3's seed launch (128 CTAs of 256 threads, 225 KB of shared memory, clusters of 2),
// after each of two flushes: the benches' 256 MB memset and a 256 MB fill kernel like torch's `fill_` (the harness's
// flush), and a third column after a one-warp spin kernel that keeps the device busy while the host queues the call
// but leaves L2 and the SMs' configuration alone.  Events around each call, median of 200.  A difference between rows is what that part of the shape costs.
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>
#include "common.cuh"

namespace {
constexpr int kMaxSmem = 227 * 1024;

__global__ void empty_kernel() {}

// Each CTA writes `per_cta` floats (a stand-in for the partials a CTA leaves behind): the launch ends only when they
// have drained.
__global__ void write_kernel(float* out, int per_cta) {
    for (int i = threadIdx.x; i < per_cta; i += blockDim.x) out[(size_t)blockIdx.x * per_cta + i] = (float)i;
}

// The harness's flush, as torch's fill_: a grid-stride store of 16-byte vectors.
__global__ void fill_kernel(int4* buf, size_t n) {
    const int4 v = make_int4(0x5A5A5A5A, 0x5A5A5A5A, 0x5A5A5A5A, 0x5A5A5A5A);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) buf[i] = v;
}

// Keeps the device busy (one warp, about 20 us) while the host queues the timed call, without touching memory.
__global__ void spin_kernel(long long clocks) {
    const long long t0 = clock64();
    while (clock64() - t0 < clocks) {
    }
}

struct Shape {
    const char* name;
    int grid, threads, smem, cluster;  // cluster 1 and no writes: a plain <<<>>> launch; else cudaLaunchKernelEx with
    bool writes;                       // a cluster dimension of `cluster`; writes: write_kernel (64 floats per CTA)
};

cudaError_t launch(const Shape& s, float* out) {
    if (s.cluster == 1 && !s.writes) {
        empty_kernel<<<s.grid, s.threads, s.smem>>>();
        return cudaGetLastError();
    }
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = (unsigned)s.cluster, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)s.grid), cfg.blockDim = dim3((unsigned)s.threads);
    cfg.dynamicSmemBytes = (size_t)s.smem, cfg.attrs = &cluster, cfg.numAttrs = 1;
    if (s.writes) return cudaLaunchKernelEx(&cfg, write_kernel, out, 64);
    return cudaLaunchKernelEx(&cfg, empty_kernel);
}

// Median of 200 event-timed calls, each after `flush`.
template <class Flush>
double time_after(const Shape& s, float* out, Flush&& flush) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int i = 0; i < 203; ++i) {
        flush(i);
        CK(cudaEventRecord(a));
        CK(launch(s, out));
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float t;
        CK(cudaEventElapsedTime(&t, a, b));
        if (i >= 3) ms.push_back(t);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}
}  // namespace

int main() {
    CK(cudaMalloc(&g_flush, kFlushBytes));
    float* out;
    CK(cudaMalloc(&out, 1 << 20));
    CK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
    CK(cudaFuncSetAttribute(write_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
    const Shape shapes[] = {
        {"<<<1, 32>>>, no smem", 1, 32, 0, 1, false},
        {"<<<128, 256>>>, no smem", 128, 256, 0, 1, false},
        {"<<<128, 256>>>, 48 KB", 128, 256, 48 * 1024, 1, false},
        {"<<<128, 256>>>, 100 KB", 128, 256, 100 * 1024, 1, false},
        {"<<<128, 256>>>, 200 KB", 128, 256, 200 * 1024, 1, false},
        {"<<<128, 256>>>, 225 KB", 128, 256, 225 * 1024, 1, false},
        {"<<<132, 256>>>, 225 KB", 132, 256, 225 * 1024, 1, false},
        {"clusters of 2, no smem", 128, 256, 0, 2, false},
        {"clusters of 2, 225 KB", 128, 256, 225 * 1024, 2, false},
        {"clusters of 2, 225 KB, 64 floats/CTA", 128, 256, 225 * 1024, 2, true},
        {"<<<128, 256>>>, 225 KB, 64 floats/CTA", 128, 256, 225 * 1024, 1, true},
    };
    const size_t n4 = kFlushBytes / sizeof(int4);
    auto memset_flush = [&](int i) { CK(cudaMemsetAsync(g_flush, i & 0xff, kFlushBytes)); };
    auto fill_flush = [&](int) {
        fill_kernel<<<132 * 8, 256>>>(reinterpret_cast<int4*>(g_flush), n4);
        CK(cudaGetLastError());
    };
    auto spin_only = [&](int) {
        spin_kernel<<<1, 32>>>(40000);
        CK(cudaGetLastError());
    };
    printf("launch probe: median of 200 event-timed calls (us)\n");
    printf("  %-40s %14s %14s %10s\n", "launch", "after memset", "after fill", "after spin");
    for (const Shape& s : shapes) {
        const double m = time_after(s, out, memset_flush), f = time_after(s, out, fill_flush),
                     z = time_after(s, out, spin_only);
        printf("  %-40s %14.2f %14.2f %10.2f\n", s.name, 1e3 * m, 1e3 * f, 1e3 * z);
    }
    CK(cudaDeviceSynchronize());
    printf("RESULT done\n");
    return 0;
}
