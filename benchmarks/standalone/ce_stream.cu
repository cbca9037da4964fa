// Standalone cross-entropy bench (no torch): built here with nvcc (build.sh), carried to the H200 as a binary.
// The shipped kernels are compiled from their solution files (extract_src.py), not copied.
//
//   ce_stream time  M C fp32|bf16 [reps]   read ceiling, fast_v3 (defaults and ring configs), fast_v5 configs
//   ce_stream check                        fast_v5 against a float64 host reference on odd shapes, misaligned
//                                          bases, special values, every knob; bit-identical repeat calls
//
// Timing: CUDA events around each call, a 256 MB memset before every call (L2 flush), median of `reps`.
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

#include "ce_v3.cuh"
#include "ce_v5.cuh"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

__device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed) {
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<uint32_t>(z ^ (z >> 31));
}

// Roughly normal (sum of 4 uniforms), times `scale`, plus `offset`.
template <class T>
__global__ void fill_kernel(T* x, int64_t n, uint32_t seed, float scale, float offset) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = hash32(i, seed);
        float u = ((h & 0xff) + ((h >> 8) & 0xff) + ((h >> 16) & 0xff) + (h >> 24)) / 255.0f - 2.0f;
        x[i] = T(2.0f * u * scale + offset);
    }
}
__global__ void fill_targets(int64_t* t, int M, int64_t C, uint32_t seed) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < M) t[i] = hash32(i, seed) % C;
}

// The read ceiling: a plain grid-stride read of the same bytes, U 16-byte loads per thread in flight.
template <int U>
__global__ void __launch_bounds__(512) sum_kernel(const float4* __restrict__ x, int64_t n4, float* out) {
    float acc = 0.f;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x * U;
    for (int64_t base = (int64_t)blockIdx.x * blockDim.x * U + threadIdx.x; base < n4; base += stride) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int64_t i = base + (int64_t)u * blockDim.x;
            v[u] = i < n4 ? __ldg(x + i) : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) acc += (v[u].x + v[u].y) + (v[u].z + v[u].w);
    }
    if (acc == 12345.678f) out[0] = acc;  // keeps the loads; never true on this data
}

// Probes of the access pattern. BLK: block b reads its own contiguous range (iterations of T*U vectors)
// instead of grid-stride chunks. SYNC: a block barrier after every iteration (as a per-chunk reduction has).
template <int U, bool BLK, bool SYNC>
__global__ void __launch_bounds__(512) sum_probe(const float4* __restrict__ x, int64_t n4, float* out) {
    float acc = 0.f;
    const int64_t per = (int64_t)blockDim.x * U;
    const int64_t nit = (n4 + per - 1) / per;
    const int64_t it_per_block = (nit + gridDim.x - 1) / gridDim.x;
    const int64_t it0 = BLK ? blockIdx.x * it_per_block : blockIdx.x;
    const int64_t it1 = BLK ? min(nit, it0 + it_per_block) : nit;
    const int64_t step = BLK ? 1 : gridDim.x;
    for (int64_t it = it0; it < it1; it += step) {
        const int64_t base = it * per + threadIdx.x;
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int64_t i = base + (int64_t)u * blockDim.x;
            v[u] = i < n4 ? __ldg(x + i) : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) acc += (v[u].x + v[u].y) + (v[u].z + v[u].w);
        if (SYNC) __syncthreads();
    }
    if (acc == 12345.678f) out[0] = acc;
}

static float* g_flush = nullptr;
static const size_t kFlushBytes = 256u << 20;
static int g_sms = 0;

template <class F>
static double time_median(F&& launch, int reps) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int i = 0; i < reps + 3; ++i) {
        CK(cudaMemsetAsync(g_flush, i & 0xff, kFlushBytes));
        CK(cudaEventRecord(a));
        launch();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
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

// ------------------------------------------------------------------------------------------ fast_v5 launcher
struct V5 {
    unsigned* counter = nullptr;
    float* scratch = nullptr;
    int64_t ns = 0;
    // Mirrors cross_entropy_fast_v5() in solutions/cross_entropy/fast_v5.py (same plan function).
    int parts = 3;  // 1: sweep only, 2: merge only, 3: both (the op)
    int probe = 0;
    void run(const void* x, const int64_t* t, int64_t M, int64_t C, bool bf16, void* out, int threads, int per_sm) {
        ce_v5::Plan p = ce_v5::make_plan(M, C, bf16 ? 2 : 4, reinterpret_cast<uintptr_t>(x), threads);
        p.g.probe = probe;
        if (!counter) {
            CK(cudaMalloc(&counter, 4));
            CK(cudaMemset(counter, 0, 4));
        }
        if (p.scratch > ns) {
            if (scratch) CK(cudaFree(scratch));
            ns = 2 * p.scratch;
            CK(cudaMalloc(&scratch, ns * 4));
        }
        auto sweep = bf16 ? ce_v5::ce_v5_sweep<true, ce_v5::kVecs> : ce_v5::ce_v5_sweep<false, ce_v5::kVecs>;
        auto merge = bf16 ? ce_v5::ce_v5_merge<true> : ce_v5::ce_v5_merge<false>;
        int o = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, sweep, p.threads, 0));
        const int64_t ps = per_sm > 0 ? std::min(per_sm, o) : o;
        const int64_t grid = std::min<int64_t>(p.g.nchunks, g_sms * ps);
        if (parts & 1) sweep<<<grid, p.threads>>>(static_cast<const char*>(x), t, p.g, reinterpret_cast<float2*>(scratch),
                                   scratch + p.xt_off);
        if (parts & 2) merge<<<p.g.ngroups, ce_v5::kGroup * 32>>>(static_cast<const char*>(x), t, p.g,
                                              reinterpret_cast<const float2*>(scratch), scratch + p.xt_off,
                                              scratch + p.grp_off, counter, out);
    }
};

static void v3_run(const void* x, const int64_t* t, int M, int C, bool bf16, float* partials, unsigned* counter,
                   void* out, int W, int S, int CB, int per_sm_cap, int* occ_out = nullptr) {
    using namespace ce_v3;
    auto kern = bf16 ? ce_v3_kernel<true> : ce_v3_kernel<false>;
    static bool configured[2] = {false, false};
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    if (!configured[bf16]) {
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prop.sharedMemPerBlockOptin - 2048));
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
        configured[bf16] = true;
    }
    const int smem = W * S * CB;
    int o = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kern, W * 32, smem));
    if (per_sm_cap > 0) o = std::min(o, per_sm_cap);
    if (occ_out) *occ_out = o;
    const int64_t max_warps = (int64_t)g_sms * o * W;
    const int64_t rpw = std::max<int64_t>(1, (M + max_warps - 1) / max_warps);
    const int64_t ctas = ((M + rpw - 1) / rpw + W - 1) / W;
    // flags: use_hint 0 (fast_v3's FLAGS = 1), proxy fence on
    kern<<<ctas, W * 32, smem>>>((const char*)x, t, M, C, rpw, S, CB, 0, 1, partials, counter, out);
}

// ------------------------------------------------------------------------------------------ reference
static double ref_loss(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t M, int64_t C) {
    double tot = 0.0;
    for (int64_t r = 0; r < M; ++r) {
        const double* row = x.data() + r * C;
        double mx = -INFINITY;
        bool nan = false;
        for (int64_t j = 0; j < C; ++j) { mx = std::max(mx, row[j]); nan |= std::isnan(row[j]); }
        if (nan) return NAN;
        double s = 0.0;
        for (int64_t j = 0; j < C; ++j) s += std::exp(row[j] - mx);
        tot += (mx + std::log(s)) - row[t[r]];
    }
    return tot / M;
}

struct Case {
    int64_t M, C;
    bool bf16;
    int offset;        // elements the base pointer is moved by (misaligned rows and base)
    float scale, shift;
    int special;       // 0 none, 1 NaN in one row, 2 tiny loss (target row peaked)
};

static bool g_all_ok = true;

static void check_case(const Case& c, V5& v5) {
    const int64_t n = c.M * c.C;
    const int E = c.bf16 ? 2 : 4;
    char* buf;
    int64_t* t;
    void* out;
    CK(cudaMalloc(&buf, (n + 16) * E));
    CK(cudaMalloc(&t, std::max<int64_t>(1, c.M) * 8));
    CK(cudaMalloc(&out, 16));
    char* x = buf + c.offset * E;
    if (c.bf16) fill_kernel<__nv_bfloat16><<<264, 512>>>((__nv_bfloat16*)x, n, 7u + c.C, c.scale, c.shift);
    else fill_kernel<float><<<264, 512>>>((float*)x, n, 7u + c.C, c.scale, c.shift);
    fill_targets<<<(c.M + 255) / 256, 256>>>(t, c.M, c.C, 3u + c.M);
    CK(cudaDeviceSynchronize());
    std::vector<int64_t> ht(c.M);
    CK(cudaMemcpy(ht.data(), t, c.M * 8, cudaMemcpyDeviceToHost));
    std::vector<double> hx(n);
    if (c.bf16) {
        std::vector<uint16_t> raw(n);
        CK(cudaMemcpy(raw.data(), x, n * 2, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < n; ++i) { uint32_t w = uint32_t(raw[i]) << 16; float f; memcpy(&f, &w, 4); hx[i] = f; }
    } else {
        std::vector<float> raw(n);
        CK(cudaMemcpy(raw.data(), x, n * 4, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < n; ++i) hx[i] = raw[i];
    }
    auto put = [&](int64_t i, double val) {
        hx[i] = val;
        if (c.bf16) { __nv_bfloat16 b = __float2bfloat16((float)val); CK(cudaMemcpy(x + i * 2, &b, 2, cudaMemcpyHostToDevice)); }
        else { float f = (float)val; CK(cudaMemcpy(x + i * 4, &f, 4, cudaMemcpyHostToDevice)); }
    };
    if (c.special == 1) put((c.M / 2) * c.C + c.C / 3, NAN);
    if (c.special == 2) {  // every row: target 30 above the rest, so the loss is ~C*e^-30
        for (int64_t r = 0; r < c.M; ++r) put(r * c.C + ht[r], 35.0);
    }
    const double ref = ref_loss(hx, ht, c.M, c.C);
    const double tol = c.bf16 ? 1e-2 : 2e-6;
    struct Knob { int T, ps; };
    for (Knob k : {Knob{0, 0}, Knob{32, 0}, Knob{128, 0}, Knob{512, 1}, Knob{256, 2}}) {
        float res[2];
        for (int rep = 0; rep < 2; ++rep) {
            CK(cudaMemset(out, 0xff, 16));  // poison
            v5.run(x, t, c.M, c.C, c.bf16, out, k.T, k.ps);
            CK(cudaDeviceSynchronize());
            if (c.bf16) { uint16_t b; CK(cudaMemcpy(&b, out, 2, cudaMemcpyDeviceToHost)); uint32_t w = uint32_t(b) << 16; memcpy(&res[rep], &w, 4); }
            else CK(cudaMemcpy(&res[rep], out, 4, cudaMemcpyDeviceToHost));
        }
        const double err = std::fabs(res[0] - ref) / std::max(1e-30, std::fabs(ref));
        bool ok = std::isnan(ref) ? std::isnan(res[0]) : (ref == 0.0 ? res[0] == 0.f : err <= tol);
        ok = ok && (memcmp(&res[0], &res[1], 4) == 0 || (std::isnan(res[0]) && std::isnan(res[1])));
        g_all_ok &= ok;
        printf("%-5s %7lldx%-8lld off%d scale%.1f shift%.0f sp%d T%-3d ps%d  %.8g ref %.8g rel %.1e %s\n",
               c.bf16 ? "bf16" : "fp32", (long long)c.M, (long long)c.C, c.offset, c.scale, c.shift, c.special, k.T,
               k.ps, res[0], ref, err, ok ? "ok" : "FAIL");
    }
    CK(cudaFree(buf));
    CK(cudaFree(t));
    CK(cudaFree(out));
}

static int do_check() {
    V5 v5;
    std::vector<Case> cases = {
        {1, 1000, false, 0, 1, 0, 0},      {5, 3, false, 0, 1, 0, 0},        {4, 2, false, 0, 1, 0, 0},
        {7, 65537, false, 0, 1, 0, 0},     {333, 1001, false, 0, 1, 0, 0},   {2, 1048583, false, 0, 1, 0, 0},
        {129, 4099, true, 0, 1, 0, 0},     {3, 65537, true, 0, 1, 0, 0},     {16, 128257, true, 0, 1, 0, 0},
        {1, 7, true, 0, 1, 0, 0},          {333, 1001, false, 1, 8, 60, 0},  {333, 1001, false, 3, 0.5, 60, 0},
        {129, 4099, true, 5, 4, 60, 0},    {64, 8192, false, 0, 1, 0, 0},    {64, 8191, false, 2, 1, 0, 0},
        {1000, 4096, false, 0, 2, 0, 0},   {300, 32000, false, 0, 1, 0, 0},  {300, 32000, true, 0, 1, 0, 0},
        {100, 12345, false, 1, 1, 0, 1},   {100, 12345, false, 0, 1, 0, 2},  {40, 20000, true, 0, 1, 0, 2},
        {70, 16384, false, 0, 1, 0, 0},    {70, 16383, true, 7, 1, 0, 0},    {3, 5, false, 1, 1, 0, 0},
        {1, 1, false, 0, 1, 0, 0},         {9, 1, false, 3, 1, 0, 0},
    };
    for (const Case& c : cases) check_case(c, v5);
    printf(g_all_ok ? "ALL CORRECT\n" : "SOME FAILED\n");
    return g_all_ok ? 0 : 1;
}

// ------------------------------------------------------------------------------------------ timing
static int do_time(int64_t M, int64_t C, bool bf16, int reps) {
    const int E = bf16 ? 2 : 4;
    const int64_t n = M * C;
    const double bytes = double(n) * E + M * 8.0;
    printf("M=%lld C=%lld %s, %.3f GB\n", (long long)M, (long long)C, bf16 ? "bf16" : "fp32", bytes / 1e9);
    void* x;
    int64_t* t;
    float *out, *partials;
    unsigned* counter;
    CK(cudaMalloc(&x, n * E));
    CK(cudaMalloc(&t, M * 8));
    CK(cudaMalloc(&out, 64));
    CK(cudaMalloc(&partials, 1 << 20));
    CK(cudaMalloc(&counter, 64));
    CK(cudaMemset(counter, 0, 64));
    if (bf16) fill_kernel<__nv_bfloat16><<<g_sms * 8, 512>>>((__nv_bfloat16*)x, n, 1234u, 1.f, 0.f);
    else fill_kernel<float><<<g_sms * 8, 512>>>((float*)x, n, 1234u, 1.f, 0.f);
    fill_targets<<<(M + 255) / 256, 256>>>(t, M, C, 99u);
    CK(cudaDeviceSynchronize());
    auto report = [&](const std::string& name, double ms) {
        float h = 0.f;
        if (bf16) { uint16_t b; CK(cudaMemcpy(&b, out, 2, cudaMemcpyDeviceToHost)); uint32_t w = uint32_t(b) << 16; memcpy(&h, &w, 4); }
        else CK(cudaMemcpy(&h, out, 4, cudaMemcpyDeviceToHost));
        printf("%-44s %.4f ms  %.3f TB/s  loss %.6f\n", name.c_str(), ms, bytes / ms / 1e9, h);
    };
    for (int per_sm : {2, 4}) {
        double ms = time_median([&] { sum_kernel<4><<<g_sms * per_sm, 512>>>((const float4*)x, n * E / 16, out); }, reps);
        report("read ceiling: sum U=4 " + std::to_string(per_sm) + "/SM x512", ms);
    }
    for (int per_sm : {2, 4}) {
        const int64_t n4 = n * E / 16;
        const std::string ps = " " + std::to_string(per_sm) + "/SM x512";
        report("probe: grid-stride + barrier" + ps,
               time_median([&] { sum_probe<4, false, true><<<g_sms * per_sm, 512>>>((const float4*)x, n4, out); }, reps));
        report("probe: block ranges" + ps,
               time_median([&] { sum_probe<4, true, false><<<g_sms * per_sm, 512>>>((const float4*)x, n4, out); }, reps));
        report("probe: block ranges + barrier" + ps,
               time_median([&] { sum_probe<4, true, true><<<g_sms * per_sm, 512>>>((const float4*)x, n4, out); }, reps));
    }
    struct R { int W, S, CB; };
    for (R c : {R{8, 3, 4096}, R{8, 2, 8192}, R{12, 2, 8192}, R{16, 2, 6144}, R{8, 2, 12288}, R{8, 2, 10240},
                R{16, 2, 4096}, R{14, 2, 8192}, R{8, 3, 8192}, R{6, 2, 16384}, R{8, 2, 14336}, R{10, 2, 8192},
                R{16, 3, 4096}, R{12, 3, 6144}}) {
        if (c.W * c.S * c.CB > 225 * 1024) continue;
        int o = 0;
        double ms = time_median([&] { v3_run(x, t, M, C, bf16, partials, counter, out, c.W, c.S, c.CB, 0, &o); }, reps);
        report("v3 W" + std::to_string(c.W) + " S" + std::to_string(c.S) + " CB" + std::to_string(c.CB) + " occ" + std::to_string(o) +
               (c.W == 8 && c.S == 3 && c.CB == 4096 ? " (shipped)" : ""), ms);
    }
    V5 v5;
    struct K { int T, ps; };
    for (K k : {K{0, 0}, K{512, 1}, K{256, 0}, K{256, 2}, K{256, 3}, K{128, 0}, K{128, 6}, K{384, 0}}) {
        double ms = time_median([&] { v5.run(x, t, M, C, bf16, out, k.T, k.ps); }, reps);
        const ce_v5::Plan p = ce_v5::make_plan(M, C, E, reinterpret_cast<uintptr_t>(x), k.T);
        report("v5 T" + std::to_string(p.threads) + " per_sm" +
               (k.ps ? std::to_string(k.ps) : std::string("occ")) + (k.T == 0 ? " (auto)" : ""), ms);
        if (k.T == 0) {
            for (int part : {1, 2}) {
                v5.parts = part;
                double ms2 = time_median([&] { v5.run(x, t, M, C, bf16, out, k.T, k.ps); }, reps);
                report(part == 1 ? "  v5 auto: sweep alone" : "  v5 auto: merge alone", ms2);
            }
            v5.parts = 1;
            for (int pr : {1, 2, 3, 4, 7}) {
                v5.probe = pr;
                double ms2 = time_median([&] { v5.run(x, t, M, C, bf16, out, k.T, k.ps); }, reps);
                report("  v5 auto: sweep alone, probe " + std::to_string(pr), ms2);
            }
            v5.probe = 0;
            v5.parts = 3;
        }
    }
    return 0;
}

int main(int argc, char** argv) {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    g_sms = prop.multiProcessorCount;
    CK(cudaMalloc(&g_flush, kFlushBytes));
    printf("device %s, %d SMs\n", prop.name, g_sms);
    const std::string mode = argc > 1 ? argv[1] : "time";
    if (mode == "check") return do_check();
    const int64_t M = argc > 2 ? atoll(argv[2]) : 8192;
    const int64_t C = argc > 3 ? atoll(argv[3]) : 32000;
    const bool bf16 = argc > 4 && std::string(argv[4]) == "bf16";
    const int reps = argc > 5 ? atoi(argv[5]) : 50;
    return do_time(M, C, bf16, reps);
}
