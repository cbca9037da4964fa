// Standalone cross-entropy bench (no torch): built here with nvcc (build.sh), carried to the H200 as a binary.
// fast_v3's kernel is compiled from its solution file (extract_src.py), not copied.
//
//   ce_stream M C fp32|bf16 [reps] [all|v6|check]
//   (v6: the read ceilings, fast_v3's default and fast_v6's knobs only; check: fast_v6 against a float64
//   loss on the host, on odd shapes, several piece sizes and split-row counts, tiny-loss rows; M C dtype
//   reps are ignored)
//
// Times, on the same logits: the read ceiling (a plain grid-stride read of the bytes), probes of the access
// pattern (grid-stride vs one contiguous range per block, with and without a block barrier per iteration),
// and fast_v3 with several ring shapes (warps per CTA x stages x chunk bytes). CUDA events around each
// call, a 256 MB memset before every call (L2 flush), median of `reps`. The fast_v3 rows print their loss
// (the same inputs every time) so a broken config shows.
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
#include "ce_v3.cuh"
#include "ce_v6.cuh"

// Roughly normal logits (a sum of 4 uniforms, spread about +-8).
template <class T>
__global__ void fill_kernel(T* x, int64_t n, uint32_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = hash32(i, seed);
        float u = ((h & 0xff) + ((h >> 8) & 0xff) + ((h >> 16) & 0xff) + (h >> 24)) / 255.0f - 2.0f;
        x[i] = T(2.0f * u);
    }
}
__global__ void fill_targets(int64_t* t, int M, int64_t C, uint32_t seed) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < M) t[i] = hash32(i, seed) % C;
}

// A plain read of the bytes, U 16-byte loads per thread in flight. <U, false, false> is the read ceiling:
// grid-stride iterations of T*U vectors, so the resident blocks read one contiguous front. The probes of
// the access pattern: BLK, block b reads its own contiguous range instead; SYNC, a block barrier after every
// iteration (as a per-chunk reduction has).
template <int U, bool BLK, bool SYNC>
__global__ void __launch_bounds__(512) read_kernel(const float4* __restrict__ x, int64_t n4, float* out) {
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
    if (acc == 12345.678f) out[0] = acc;  // keeps the loads; never true on this data
}

// fast_v3's launch with a given ring: the grid sizing of cross_entropy_fast_v3() in fast_v3.py (persistent,
// every warp the same number of rows). Planned once, outside the timed interval, so that the host's
// attribute and occupancy queries do not delay the timed launch.
struct V3Launch {
    bool bf16;
    int W, S, CB, smem, occ;
    int64_t rpw, ctas;
    V3Launch(int64_t M, bool bf16_, int W_, int S_, int CB_) : bf16(bf16_), W(W_), S(S_), CB(CB_), smem(W_ * S_ * CB_) {
        auto kern = bf16 ? ce_v3::ce_v3_kernel<true> : ce_v3::ce_v3_kernel<false>;
        int optin = 0;
        CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - 2048));
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, W * 32, smem));
        const int64_t max_warps = (int64_t)g_sms * occ * W;
        rpw = std::max<int64_t>(1, (M + max_warps - 1) / max_warps);
        ctas = ((M + rpw - 1) / rpw + W - 1) / W;
    }
    // flags: use_hint 0 (fast_v3's FLAGS = 1), proxy fence on
    void operator()(const void* x, const int64_t* t, int64_t M, int C, float* partials, unsigned* counter,
                    void* out) const {
        auto kern = bf16 ? ce_v3::ce_v3_kernel<true> : ce_v3::ce_v3_kernel<false>;
        kern<<<ctas, W * 32, smem>>>((const char*)x, t, M, C, rpw, S, CB, 0, 1, partials, counter, out);
    }
};

// fast_v6's launch: its own plan_launch (the extension's), knobs as the extension's arguments.
struct V6Launch {
    bool bf16;
    int W, S, CB, smem, occ;
    ce_v6::Plan plan;
    V6Launch(int64_t M, int64_t C, bool bf16_, int W_, int S_, int CB_, int64_t piece_bytes, int64_t tail_rows, int64_t ctas)
        : bf16(bf16_), W(W_), S(S_), CB(CB_), smem(W_ * S_ * CB_) {
        auto kern = bf16 ? ce_v6::ce_v6_kernel<true> : ce_v6::ce_v6_kernel<false>;
        int optin = 0;
        CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - 4096));
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, W * 32, smem));
        if (occ < 1) { fprintf(stderr, "v6 W%d S%d CB%d does not fit\n", W, S, CB); exit(1); }
        plan = ce_v6::plan_launch(M, C * (bf16 ? 2 : 4), W, occ, g_sms, piece_bytes, tail_rows, ctas);
    }
    // ws: at least M * 66 + 64 floats; counters: 3 zeroed u64 (the kernel resets them). Flags as fast_v6's
    // defaults (no hint, proxy fence).
    void operator()(const void* x, const int64_t* t, int64_t M, int C, float* ws, unsigned long long* counters,
                    void* out) const {
        auto kern = bf16 ? ce_v6::ce_v6_kernel<true> : ce_v6::ce_v6_kernel<false>;
        const int64_t n_split = M - plan.n_whole;
        float2* row_part = reinterpret_cast<float2*>(ws);
        float* row_loss = ws + ((2 * n_split * plan.P + 3) & ~int64_t(3));
        kern<<<plan.ctas, W * 32, smem>>>((const char*)x, t, M, C, plan.n_whole, plan.P, S, CB, 0, 1, row_part,
                                         row_loss, row_loss + M, counters, out);
    }
    std::string name() const {
        return "v6 W" + std::to_string(W) + " S" + std::to_string(S) + " CB" + std::to_string(CB) + " P" +
               std::to_string(plan.P) + " whole" + std::to_string(plan.n_whole) + " ctas" + std::to_string(plan.ctas);
    }
};

// ------------------------------------------------------------------------------------------ timing
static int do_time(int64_t M, int64_t C, bool bf16, int reps, bool all) {
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
    CK(cudaMalloc(&partials, (M * 66 + 8192) * 4));  // fast_v6's workspace; fast_v3's partials
    CK(cudaMalloc(&counter, 64));
    CK(cudaMemset(counter, 0, 64));
    if (bf16) fill_kernel<__nv_bfloat16><<<g_sms * 8, 512>>>((__nv_bfloat16*)x, n, 1234u);
    else fill_kernel<float><<<g_sms * 8, 512>>>((float*)x, n, 1234u);
    fill_targets<<<(M + 255) / 256, 256>>>(t, M, C, 99u);
    CK(cudaDeviceSynchronize());
    auto report = [&](const std::string& name, double ms) {
        float h = 0.f;
        if (bf16) { uint16_t b; CK(cudaMemcpy(&b, out, 2, cudaMemcpyDeviceToHost)); uint32_t w = uint32_t(b) << 16; memcpy(&h, &w, 4); }
        else CK(cudaMemcpy(&h, out, 4, cudaMemcpyDeviceToHost));
        printf("%-44s %.4f ms  %.3f TB/s  loss %.6f\n", name.c_str(), ms, bytes / ms / 1e9, h);
    };
    for (int per_sm : {2, 4}) {
        double ms = time_median([&] { read_kernel<4, false, false><<<g_sms * per_sm, 512>>>((const float4*)x, n * E / 16, out); }, reps);
        report("read ceiling: U=4 " + std::to_string(per_sm) + "/SM x512", ms);
    }
    {   // The same read on 128 of the SMs (fast_v3's grid at 8192 rows is 128 CTAs).
        double ms = time_median([&] { read_kernel<4, false, false><<<128 * 4, 512>>>((const float4*)x, n * E / 16, out); }, reps);
        report("read ceiling: U=4 4/SM x512 on 128 SMs", ms);
    }
    const V3Launch v3def(M, bf16, 8, 2, 8192);
    float loss_v3 = 0.f;
    {
        double ms = time_median([&] { v3def(x, t, M, (int)C, partials, counter, out); }, reps);
        report("v3 default", ms);
        if (bf16) { uint16_t b; CK(cudaMemcpy(&b, out, 2, cudaMemcpyDeviceToHost)); uint32_t w = uint32_t(b) << 16; memcpy(&loss_v3, &w, 4); }
        else CK(cudaMemcpy(&loss_v3, out, 4, cudaMemcpyDeviceToHost));
    }
    struct R6 { int W, S, CB; int64_t pb, tail, ctas; };
    for (R6 c : {R6{8, 2, 8192, 0, 0, 0}, R6{8, 2, 8192, 8192, 0, 0}, R6{8, 2, 8192, 32768, 0, 0},
                 R6{8, 2, 8192, 0, 2112, 0}, R6{8, 2, 8192, 0, 528, 0}, R6{8, 2, 8192, 1 << 30, 0, 0},
                 R6{8, 2, 8192, 0, 0, 128}, R6{8, 3, 8192, 0, 0, 0}, R6{16, 2, 6144, 0, 0, 0},
                 R6{4, 2, 16384, 0, 0, 0}, R6{8, 2, 8192, 0, 0, 0}}) {
        if (c.W * c.S * c.CB > 225 * 1024) continue;
        const V6Launch v6(M, C, bf16, c.W, c.S, c.CB, c.pb, c.tail, c.ctas);
        double ms = time_median([&] { v6(x, t, M, (int)C, partials, (unsigned long long*)counter, out); }, reps);
        float h = 0.f;
        if (bf16) { uint16_t b; CK(cudaMemcpy(&b, out, 2, cudaMemcpyDeviceToHost)); uint32_t w = uint32_t(b) << 16; memcpy(&h, &w, 4); }
        else CK(cudaMemcpy(&h, out, 4, cudaMemcpyDeviceToHost));
        const bool dflt = c.W == 8 && c.S == 2 && c.CB == 8192 && c.pb == 0 && c.tail == 0 && c.ctas == 0;
        report(v6.name() + (dflt ? " (default)" : "") +
               (std::fabs(h - loss_v3) > 2e-5f * std::fabs(loss_v3) ? " LOSS DIFFERS FROM V3" : ""), ms);
    }
    if (!all) return 0;
    for (int per_sm : {2, 4}) {
        const int64_t n4 = n * E / 16;
        const std::string ps = " " + std::to_string(per_sm) + "/SM x512";
        report("probe: grid-stride + barrier" + ps,
               time_median([&] { read_kernel<4, false, true><<<g_sms * per_sm, 512>>>((const float4*)x, n4, out); }, reps));
        report("probe: block ranges" + ps,
               time_median([&] { read_kernel<4, true, false><<<g_sms * per_sm, 512>>>((const float4*)x, n4, out); }, reps));
        report("probe: block ranges + barrier" + ps,
               time_median([&] { read_kernel<4, true, true><<<g_sms * per_sm, 512>>>((const float4*)x, n4, out); }, reps));
    }
    struct R { int W, S, CB; };
    for (R c : {R{8, 3, 4096}, R{8, 2, 8192}, R{12, 2, 8192}, R{16, 2, 6144}, R{8, 2, 12288}, R{8, 2, 10240},
                R{16, 2, 4096}, R{14, 2, 8192}, R{8, 3, 8192}, R{6, 2, 16384}, R{8, 2, 14336}, R{10, 2, 8192},
                R{16, 3, 4096}, R{12, 3, 6144}}) {
        if (c.W * c.S * c.CB > 225 * 1024) continue;
        const V3Launch v3(M, bf16, c.W, c.S, c.CB);
        double ms = time_median([&] { v3(x, t, M, (int)C, partials, counter, out); }, reps);
        report("v3 W" + std::to_string(c.W) + " S" + std::to_string(c.S) + " CB" + std::to_string(c.CB) + " occ" + std::to_string(v3.occ) +
               (c.W == 8 && c.S == 2 && c.CB == 8192 ? " (default)" : ""), ms);
    }
    return 0;
}

// fast_v6 against a float64 loss computed on the host from the same logits. Odd shapes (unaligned rows,
// tails, pieces shorter than a chunk or empty), piece sizes from 16 B to whole rows, every row split or
// none, and "tiny" rows whose target is far above the rest (the log1p path: a mean loss of ~1e-13, so 1e-5
// relative separates the paths).
__global__ void make_tiny(float* x, const int64_t* t, int M, int64_t C) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < M) x[i * C + t[i]] = 40.f;
}
__global__ void make_tiny_bf16(__nv_bfloat16* x, const int64_t* t, int M, int64_t C) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < M) x[i * C + t[i]] = __float2bfloat16(40.f);
}
static int do_check() {
    struct Case { int64_t M, C; bool bf16, tiny; };
    int bad = 0, n = 0;
    for (Case cs : {Case{37, 32001, false, false}, Case{64, 32000, false, false}, Case{5, 100003, true, false},
                    Case{300, 50000, true, false}, Case{1000, 4096, false, false}, Case{3, 7, false, false},
                    Case{130, 65536, false, false}, Case{257, 40000, false, true}, Case{33, 70001, true, true},
                    Case{1, 1, false, false}, Case{2, 33, true, false}}) {
        const int E = cs.bf16 ? 2 : 4;
        const int64_t M = cs.M, C = cs.C, nel = M * C;
        void* x; int64_t* t; float *ws, *out; unsigned* counter;
        CK(cudaMalloc(&x, nel * E + 64)); CK(cudaMalloc(&t, M * 8)); CK(cudaMalloc(&ws, (M * 66 + 8192) * 4));
        CK(cudaMalloc(&out, 64)); CK(cudaMalloc(&counter, 64)); CK(cudaMemset(counter, 0, 64));
        if (cs.bf16) fill_kernel<__nv_bfloat16><<<g_sms * 8, 512>>>((__nv_bfloat16*)x, nel, 77u);
        else fill_kernel<float><<<g_sms * 8, 512>>>((float*)x, nel, 77u);
        fill_targets<<<(M + 255) / 256, 256>>>(t, (int)M, C, 5u);
        if (cs.tiny) {
            if (cs.bf16) make_tiny_bf16<<<(M + 255) / 256, 256>>>((__nv_bfloat16*)x, t, (int)M, C);
            else make_tiny<<<(M + 255) / 256, 256>>>((float*)x, t, (int)M, C);
        }
        CK(cudaDeviceSynchronize());
        std::vector<float> hx(nel);
        std::vector<int64_t> ht(M);
        if (cs.bf16) {
            std::vector<uint16_t> hb(nel);
            CK(cudaMemcpy(hb.data(), x, nel * 2, cudaMemcpyDeviceToHost));
            for (int64_t i = 0; i < nel; ++i) { uint32_t w = uint32_t(hb[i]) << 16; memcpy(&hx[i], &w, 4); }
        } else CK(cudaMemcpy(hx.data(), x, nel * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(ht.data(), t, M * 8, cudaMemcpyDeviceToHost));
        double ref = 0.0;
        for (int64_t r = 0; r < M; ++r) {
            const float* row = hx.data() + r * C;
            double mx = -INFINITY;
            for (int64_t j = 0; j < C; ++j) mx = std::max(mx, (double)row[j]);
            double rest = 0.0;  // sum over j != t of exp(x_j - x_t), for an accurate tiny loss
            for (int64_t j = 0; j < C; ++j) if (j != ht[r]) rest += std::exp((double)row[j] - row[ht[r]]);
            ref += std::log1p(rest);
        }
        ref /= M;
        struct K { int W, CB; int64_t pb, tail, ctas; };
        for (K k : {K{8, 8192, 0, 0, 0}, K{8, 8192, 1024, 0, 0}, K{8, 8192, 16, 0, 0}, K{8, 8192, 4096, 7, 0},
                    K{8, 8192, 2048, 1 << 30, 0}, K{16, 4096, 8192, 0, 0}, K{8, 1024, 4096, 0, 3}, K{1, 8192, 64, 0, 1},
                    K{8, 8192, 1 << 30, 0, 0}}) {
            const V6Launch v6(M, C, cs.bf16, k.W, 2, k.CB, k.pb, k.tail, k.ctas);
            // The second call must give the same bits (the ticket resets itself; fixed-order sums).
            float h[2];
            for (int rep = 0; rep < 2; ++rep) {
                CK(cudaMemset(out, 0xff, 64));  // poison: NaN if the kernel never writes
                v6(x, t, M, (int)C, ws, (unsigned long long*)counter, out);
                CK(cudaDeviceSynchronize());
                if (cs.bf16) { uint16_t b; CK(cudaMemcpy(&b, out, 2, cudaMemcpyDeviceToHost)); uint32_t w = uint32_t(b) << 16; memcpy(&h[rep], &w, 4); }
                else CK(cudaMemcpy(&h[rep], out, 4, cudaMemcpyDeviceToHost));
            }
            const double rel = std::fabs(h[0] - ref) / std::max(1e-30, std::fabs(ref));
            const double tol = cs.bf16 ? 8e-3 : 1e-5;  // bf16 output rounding: 2^-8 relative
            const bool ok = rel <= tol && memcmp(&h[0], &h[1], 4) == 0;
            bad += !ok;
            ++n;
            printf("%s M=%lld C=%lld %s%s %-40s loss %.9g ref %.9g rel %.2e %s\n", ok ? "ok  " : "FAIL", (long long)M,
                   (long long)C, cs.bf16 ? "bf16" : "fp32", cs.tiny ? " tiny" : "", v6.name().c_str(), h[0], ref, rel,
                   memcmp(&h[0], &h[1], 4) == 0 ? "" : "NOT DETERMINISTIC");
        }
        CK(cudaFree(x)); CK(cudaFree(t)); CK(cudaFree(ws)); CK(cudaFree(out)); CK(cudaFree(counter));
    }
    printf(bad ? "FAILURES: %d of %d\n" : "ALL CORRECT (%d of %d)\n", bad ? bad : n, n);
    return bad ? 1 : 0;
}

int main(int argc, char** argv) {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    g_sms = prop.multiProcessorCount;
    CK(cudaMalloc(&g_flush, kFlushBytes));
    printf("device %s, %d SMs\n", prop.name, g_sms);
    const int64_t M = argc > 1 ? atoll(argv[1]) : 8192;
    const int64_t C = argc > 2 ? atoll(argv[2]) : 32000;
    const bool bf16 = argc > 3 && std::string(argv[3]) == "bf16";
    const int reps = argc > 4 ? atoi(argv[4]) : 50;
    const std::string mode = argc > 5 ? argv[5] : "all";
    if (mode == "check") return do_check();
    return do_time(M, C, bf16, reps, mode == "all");
}
