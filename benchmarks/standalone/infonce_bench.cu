// Standalone InfoNCE bench (no torch): built here with nvcc (build.sh, sm_90a), carried to the H200 as a binary.
// fast.py's kernels and fast_v3.py's device code + plan/launch are compiled from the solution files
// (extract_src.py), not copied.  fast.py's host-side plan (tile/split choice) is repeated in fast_v1_plan()
// below, because its host function needs torch.
//
//   infonce_bench              run every group below, each in its own process (a crash or a sticky CUDA error
//                              in one group cannot take the others down), then print ALL CORRECT / FAILURES: n
//   infonce_bench GROUP        run one group:
//     gemm:V     layout check of wgmma variant V (0..): raw dot products of a small ragged problem against an
//                exact CPU GEMM (inputs are multiples of 1/16, so every dot product is exact), for two split
//                counts; on a mismatch, two one-hot probes name the (row, k) / (col, k) the kernel really read
//     correct    loss vs a float64 CPU reference on every problem.yaml correctness shape and extras (odd D,
//                misaligned bases, k tails, ragged tiles, several n-tiles per CTA, tiny losses), for fast.py,
//                v3 auto, every v3 variant and forced split counts; bitwise determinism of v3
//     time_seed  seed shape 256x512 N=2560: fast.py, v3 auto, every variant; an empty kernel (the timing floor);
//                the harness's conditions (HARNESS-LIKE: fresh input sets, calls queued in batches of 32); v3 auto
//                over D (fixed cost vs K loop)
//     time_big   4096x1024 N=65536: fast.py, v3 auto and the wide variants (timing); v3 vs fast.py loss, and
//                4 rows' losses against a float64 CPU reference
//     one        (only when named) five flushed seed-shape calls of one variant (INFONCE_ONE_VARIANT=name), for ncu
//     probe      (only when named; not in the default run) seed shape: flushed / warm / back-to-back times of
//                fast.py and v3 at several split counts; with -DINFONCE_V3_STAMPS, per-CTA %globaltimer stamps and
//                thread 0's K-loop clocks per phase (INFONCE_PROBE_VARIANT=name stamps that variant).  build.sh also
//                builds infonce_probe_stamps, infonce_probe_nofence (-DINFONCE_V3_NO_PROXY_FENCE: timing only) and
//                infonce_probe_tma255 (stamps, TMA copies issued by thread 255 instead of thread 0)
// Timing: CUDA events around each call, a 256 MB memset before every call (no input left in L2), median; each call
// synchronised (the harness queues its calls: HARNESS-LIKE measures the difference).
// Every wait is bounded (5 s per call, 55 s per group via alarm, 55 s for the whole run): a hang prints TIMEOUT
// and the group's process exits; the driver goes on with the next group.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>
#include <string>
#include <algorithm>
#include <chrono>
#include <unistd.h>

#include "common.cuh"

// fast.py's device code (its anonymous namespace), wrapped so that its names cannot collide with v3's.
#define C10_CUDA_CHECK(x) CK(x)
#define C10_CUDA_KERNEL_LAUNCH_CHECK() CK(cudaGetLastError())
namespace infonce_v1 {
#include "infonce_fast_dev.cuh"
}
// fast_v3.py's device code and host plan/launch, with the bench-only tile variants (not in the probe builds).
#ifndef INFONCE_BENCH_PROBE
#define INFONCE_V3_ALL_VARIANTS
#endif
#include "infonce_v3.cuh"

using infonce_v3::Plan;

static int g_failures = 0;

// ------------------------------------------------------------------------------------------------ utilities
static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Wait for the device with a time limit: a hung kernel prints TIMEOUT and ends the process.
static void sync_or_die(const char* what, double limit_s = 5.0) {
    const double t0 = now_s();
    while (true) {
        cudaError_t e = cudaStreamQuery(0);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
            printf("CUDA ERROR in %s: %s\n", what, cudaGetErrorString(e));
            printf("RESULT failures=%d (sticky CUDA error)\n", g_failures + 1);
            fflush(stdout);
            _exit(2);
        }
        if (now_s() - t0 > limit_s) {
            printf("TIMEOUT in %s (> %.0f s)\n", what, limit_s);
            printf("RESULT failures=%d (timeout)\n", g_failures + 1);
            fflush(stdout);
            _exit(3);
        }
        usleep(50);
    }
}

static void check_launch(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
        printf("LAUNCH ERROR in %s: %s\n", what, cudaGetErrorString(e));
        printf("RESULT failures=%d (launch error)\n", g_failures + 1);
        fflush(stdout);
        _exit(2);
    }
}

// common.cuh's timer with every wait bounded.
template <class F>
static double time_median_guarded(F&& launch, int reps, const char* what) {
    return time_median_waiting(launch, reps, [&](cudaEvent_t) { sync_or_die(what); });
}

// Host copy of common.cuh's hash32 (same formula).
static uint32_t hash32_host(uint64_t i, uint32_t seed) {
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<uint32_t>(z ^ (z >> 31));
}
// Roughly normal (sum of 4 uniforms, variance 1/3 each -> scaled to unit variance).
static float hnormal(uint64_t i, uint32_t seed) {
    const uint32_t h = hash32_host(i, seed);
    const float u = ((h & 0xff) + ((h >> 8) & 0xff) + ((h >> 16) & 0xff) + (h >> 24)) / 255.0f - 2.0f;
    return u * 1.7320508f / 1.1547005f;
}

// Rows of `rows` x `D`, each normalised to unit length (as the reference's get_inputs) then scaled.
static void fill_rows(std::vector<float>& x, int64_t rows, int D, uint32_t seed, float scale) {
    x.resize((size_t)rows * D);
    for (int64_t r = 0; r < rows; ++r) {
        double ss = 0.0;
        float* xr = x.data() + (size_t)r * D;
        for (int k = 0; k < D; ++k) {
            xr[k] = hnormal((uint64_t)r * D + k, seed);
            ss += (double)xr[k] * xr[k];
        }
        const float inv = (float)(scale / std::max(std::sqrt(ss), 1e-12));
        for (int k = 0; k < D; ++k) xr[k] *= inv;
    }
}

static double dot_d(const float* a, const float* b, int D) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int k = 0;
    for (; k + 4 <= D; k += 4) {
        s0 += (double)a[k] * b[k];
        s1 += (double)a[k + 1] * b[k + 1];
        s2 += (double)a[k + 2] * b[k + 2];
        s3 += (double)a[k + 3] * b[k + 3];
    }
    for (; k < D; ++k) s0 += (double)a[k] * b[k];
    return (s0 + s1) + (s2 + s3);
}

// float64 reference of one row's loss: logsumexp([pos, neg...]) - pos (torch's cosine_similarity clamps each
// norm at 1e-8).
static double ref_row_loss(const float* q, const float* p, const float* n, int N, int D, double T) {
    const double qq = std::sqrt(dot_d(q, q, D)), pp = std::sqrt(dot_d(p, p, D));
    const double pos = dot_d(q, p, D) / (std::max(qq, 1e-8) * std::max(pp, 1e-8)) / T;
    std::vector<double> l((size_t)N);
    double m = pos;
    for (int j = 0; j < N; ++j) {
        l[j] = dot_d(q, n + (size_t)j * D, D) / T;
        m = std::max(m, l[j]);
    }
    double s = std::exp(pos - m);
    for (int j = 0; j < N; ++j) s += std::exp(l[j] - m);
    return m + std::log(s) - pos;
}

static double ref_loss(const std::vector<float>& q, const std::vector<float>& p, const std::vector<float>& n, int B,
                       int D, int N, double T) {
    double acc = 0.0;
    for (int b = 0; b < B; ++b)
        acc += ref_row_loss(q.data() + (size_t)b * D, p.data() + (size_t)b * D, n.data(), N, D, T);
    return acc / B;
}

// ------------------------------------------------------------------------------------------------ problem
struct DevProblem {
    int B = 0, D = 0, N = 0;
    double T = 0.1;
    float *q = nullptr, *p = nullptr, *n = nullptr;  // possibly offset (misaligned) views
    float *q_alloc = nullptr, *p_alloc = nullptr, *n_alloc = nullptr;
    unsigned* counters = nullptr;
    void* ws = nullptr;
    size_t ws_cap = 0;
    int counters_cap = 0;
    float* out = nullptr;

    void upload(const std::vector<float>& hq, const std::vector<float>& hp, const std::vector<float>& hn, int B_,
                int D_, int N_, double T_, int off_q = 0, int off_p = 0, int off_n = 0) {
        B = B_, D = D_, N = N_, T = T_;
        CK(cudaMalloc(&q_alloc, (hq.size() + 8) * sizeof(float)));
        CK(cudaMalloc(&p_alloc, (hp.size() + 8) * sizeof(float)));
        CK(cudaMalloc(&n_alloc, (hn.size() + 8) * sizeof(float)));
        q = q_alloc + off_q, p = p_alloc + off_p, n = n_alloc + off_n;
        CK(cudaMemcpy(q, hq.data(), hq.size() * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(p, hp.data(), hp.size() * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(n, hn.data(), hn.size() * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMalloc(&out, 256));
    }
    void ensure_ws(size_t bytes, int counters_needed) {
        if (bytes > ws_cap) {
            if (ws) CK(cudaFree(ws));
            ws_cap = std::max<size_t>(bytes, 1 << 16);
            CK(cudaMalloc(&ws, ws_cap));
        }
        if (counters_needed > counters_cap) {
            if (counters) CK(cudaFree(counters));
            counters_cap = std::max(counters_needed, 64);
            CK(cudaMalloc(&counters, counters_cap * sizeof(unsigned)));
            CK(cudaMemset(counters, 0, counters_cap * sizeof(unsigned)));
        }
    }
    void release() {
        for (void* x : {(void*)q_alloc, (void*)p_alloc, (void*)n_alloc, (void*)out, ws, (void*)counters})
            if (x) CK(cudaFree(x));
        *this = DevProblem();
    }
    float read_out() {
        float h = 0.f;
        CK(cudaMemcpy(&h, out, 4, cudaMemcpyDeviceToHost));
        return h;
    }
};

// fast.py's plan (copied from its host function infonce_fast(): tile shape and split count by the wave model).
struct V1Plan {
    int big, S, m_tiles, n_tiles, grid;
    bool vec4;
};
static V1Plan fast_v1_plan(const DevProblem& P) {
    using namespace infonce_v1;
    const bool vec4 = P.D % 4 == 0 && reinterpret_cast<uintptr_t>(P.q) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(P.p) % 16 == 0 && reinterpret_cast<uintptr_t>(P.n) % 16 == 0;
    const Cfg cfgs[2] = {make_cfg<BIG_ARGS>(1.0), make_cfg<SMALL_ARGS>(0.7)};
    int best_c = 0, best_S = 1;
    double best_t = 1e300;
    for (int ci = 0; ci < 2; ++ci) {
        const int64_t mt = (P.B + cfgs[ci].BM - 1) / cfgs[ci].BM, nt = (P.N + cfgs[ci].BN - 1) / cfgs[ci].BN;
        const int64_t s_max = std::min<int64_t>(nt, 1024);
        for (int64_t s = 1; s <= s_max; ++s) {
            if (mt * s > (1LL << 31) - 1) break;
            const int64_t waves = (mt * s + g_sms - 1) / g_sms, per_cta = (nt + s - 1) / s;
            const double t = (double)waves * (double)per_cta * cfgs[ci].tile_cost;
            if (t < best_t * 0.97) best_t = t, best_c = ci, best_S = (int)s;
        }
    }
    V1Plan v;
    v.big = best_c == 0;
    v.S = best_S;
    v.m_tiles = (P.B + cfgs[best_c].BM - 1) / cfgs[best_c].BM;
    v.n_tiles = (P.N + cfgs[best_c].BN - 1) / cfgs[best_c].BN;
    v.grid = v.m_tiles * v.S;
    v.vec4 = vec4;
    return v;
}
static void fast_v1_launch(DevProblem& P, const V1Plan& v) {
    using namespace infonce_v1;
    const size_t off_part = ((size_t)P.B * 8 + 255) & ~(size_t)255;
    P.ensure_ws(off_part + (size_t)v.S * P.B * 8, 1);
    double* pos = static_cast<double*>(P.ws);
    float2* part = reinterpret_cast<float2*>(static_cast<char*>(P.ws) + off_part);
    const double inv_t = 1.0 / P.T;
    const float scale2 = (float)(1.4426950408889634074 / P.T);
    const Cfg c = v.big ? make_cfg<BIG_ARGS>(1.0) : make_cfg<SMALL_ARGS>(0.7);
    cudaStream_t st = 0;
    if (v.big) {
        if (v.vec4) launch<BIG_ARGS, true>(c, v.grid, st, P.q, P.p, P.n, P.B, P.D, P.N, v.S, v.n_tiles, scale2, inv_t, part, pos, P.counters, P.out);
        else        launch<BIG_ARGS, false>(c, v.grid, st, P.q, P.p, P.n, P.B, P.D, P.N, v.S, v.n_tiles, scale2, inv_t, part, pos, P.counters, P.out);
    } else {
        if (v.vec4) launch<SMALL_ARGS, true>(c, v.grid, st, P.q, P.p, P.n, P.B, P.D, P.N, v.S, v.n_tiles, scale2, inv_t, part, pos, P.counters, P.out);
        else        launch<SMALL_ARGS, false>(c, v.grid, st, P.q, P.p, P.n, P.B, P.D, P.N, v.S, v.n_tiles, scale2, inv_t, part, pos, P.counters, P.out);
    }
}

static Plan v3_plan(const DevProblem& P, int mode, int variant, int splits) {
    return infonce_v3::make_plan(P.B, P.D, P.N, infonce_v3::can_vec4(P.q, P.p, P.n, P.D), g_sms, mode, variant,
                                 splits);
}
static cudaError_t v3_launch(DevProblem& P, const Plan& pl, float* dbg_logits = nullptr, double* dbg_rowloss = nullptr) {
    P.ensure_ws(pl.ws_bytes, pl.counters);
    return infonce_v3::launch(pl, P.q, P.p, P.n, P.B, P.D, P.N, P.T, P.counters, P.ws, P.out, 0, dbg_logits,
                              dbg_rowloss);
}
static std::string plan_str(const Plan& pl) {
    char buf[128];
    snprintf(buf, sizeof buf, "%-18s S=%-4d grid=%-5d", infonce_v3::plan_name(pl), pl.S, pl.grid);
    return buf;
}
static std::string v1_str(const V1Plan& v) {
    char buf[128];
    snprintf(buf, sizeof buf, "%-18s S=%-4d grid=%-5d", v.big ? (v.vec4 ? "fast_128x128_v4" : "fast_128x128_b4")
                                                              : (v.vec4 ? "fast_64x80_v4" : "fast_64x80_b4"),
             v.S, v.grid);
    return buf;
}

// The check the harness applies to the scalar, plus the brief's 1e-5 relative error.
static bool loss_ok(double got, double ref, double* rel_out) {
    const double diff = std::fabs(got - ref);
    const double rel = diff / std::max(std::fabs(ref), 1e-30);
    if (rel_out) *rel_out = rel;
    return std::isfinite(got) && diff <= 1e-4 + 1e-4 * std::fabs(ref) && rel <= 1e-5;
}

// ------------------------------------------------------------------------------------------------ gemm:V
// Dot products of a small ragged problem, read back through the kernel's debug output.
static int run_gemm_case(int vi, const char* label, std::vector<float>& hq, std::vector<float>& hn, int B, int D, int N,
                         int splits, int mode_probe /* 0 random ints, 1 q one-hot, 2 n one-hot */) {
    std::vector<float> hp = hq;  // positive unused by the check
    DevProblem P;
    P.upload(hq, hp, hn, B, D, N, 0.1);
    const Plan pl = v3_plan(P, infonce_v3::MODE_WGMMA, vi, splits);
    float* dbg;
    CK(cudaMalloc(&dbg, (size_t)B * N * sizeof(float)));
    CK(cudaMemset(dbg, 0xff, (size_t)B * N * sizeof(float)));  // NaN: "never written"
    check_launch(v3_launch(P, pl, dbg), label);
    sync_or_die(label);
    std::vector<float> got((size_t)B * N);
    CK(cudaMemcpy(got.data(), dbg, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaFree(dbg));
    const float loss = P.read_out();
    P.release();
    int bad = 0, shown = 0, unwritten = 0;
    for (int r = 0; r < B; ++r)
        for (int c = 0; c < N; ++c) {
            const double want = dot_d(&hq[(size_t)r * D], &hn[(size_t)c * D], D);
            const float g = got[(size_t)r * N + c];
            if (std::isnan(g)) ++unwritten;
            if (!(g == (float)want)) {
                ++bad;
                if (shown < 6) {
                    ++shown;
                    printf("    mismatch row %d col %d: got %.8g want %.8g", r, c, g, want);
                    if (mode_probe == 1 && std::isfinite(g)) {  // q one-hot: got should be n[c][r % D]
                        const double idx = g * 16384.0 - 1.0;
                        if (idx >= 0 && idx == std::floor(idx))
                            printf("  = n[col %d][k %d] (expected n[col %d][k %d])", (int)idx / D, (int)idx % D, c, r % D);
                    } else if (mode_probe == 2 && std::isfinite(g)) {  // n one-hot: got should be q[r][c % D]
                        const double idx = g * 16384.0 - 1.0;
                        if (idx >= 0 && idx == std::floor(idx))
                            printf("  = q[row %d][k %d] (expected q[row %d][k %d])", (int)idx / D, (int)idx % D, r, c % D);
                    } else if (mode_probe == 0 && std::isfinite(g)) {  // search for the (row, col) it belongs to
                        for (int r2 = 0; r2 < B && shown > 0; ++r2)
                            for (int c2 = 0; c2 < N; ++c2)
                                if ((float)dot_d(&hq[(size_t)r2 * D], &hn[(size_t)c2 * D], D) == g && (r2 != r || c2 != c)) {
                                    printf("  (equals the dot product of row %d col %d)", r2, c2);
                                    r2 = B;
                                    break;
                                }
                    }
                    printf("\n");
                }
            }
        }
    printf("  %-34s %s  mismatches %d / %d (unwritten %d)  loss %.6f  %s\n", label, plan_str(pl).c_str(), bad, B * N,
           unwritten, loss, bad ? "FAIL" : "PASS");
    return bad ? 1 : 0;
}

static int group_gemm(int vi) {
    if (vi < 0 || vi >= infonce_v3::kNumWgVariants) {
        printf("no variant %d\n", vi);
        return 1;
    }
    const infonce_v3::WgVariant& v = infonce_v3::kWgVariants[vi];
    printf("GEMM layout check, variant %d = %s (warpgroups %d, N %d, prefetch %d, k8-steps/iteration %d)\n", vi,
           v.name, v.wgs, v.bn, v.pd, v.kh);
    const int BM = 64 * v.wgs;
    // ragged rows, ragged k-tile (72 = 2x32 + 8; the 3-D copies need whole k-tiles: 96, and with a K split an odd
    // count of them), ragged cols
    const int B = 2 * BM + 3, D = v.a3d ? 96 : 72, N = 3 * v.bn + 5;
    int fails = 0;
    std::vector<float> hq((size_t)B * D), hn((size_t)N * D);
    for (size_t i = 0; i < hq.size(); ++i) hq[i] = (float)((int)(hash32_host(i, 11) % 17) - 8) / 16.0f;
    for (size_t i = 0; i < hn.size(); ++i) hn[i] = (float)((int)(hash32_host(i, 12) % 17) - 8) / 16.0f;
    int f0 = run_gemm_case(vi, "random multiples of 1/16, S=1", hq, hn, B, D, N, 1, 0);
    f0 += run_gemm_case(vi, "random multiples of 1/16, S=2", hq, hn, B, D, N, 2, 0);
    fails += f0;
    if (f0) {
        printf("  probes (values (index+1)/16384, so a wrong read names its source):\n");
        std::vector<float> pq((size_t)B * D), pn((size_t)N * D);
        for (int r = 0; r < B; ++r)
            for (int k = 0; k < D; ++k) pq[(size_t)r * D + k] = k == r % D ? 1.f : 0.f;
        for (int c = 0; c < N; ++c)
            for (int k = 0; k < D; ++k) pn[(size_t)c * D + k] = (float)(c * D + k + 1) / 16384.f;
        run_gemm_case(vi, "probe A: q one-hot (checks B reads)", pq, pn, B, D, N, 1, 1);
        for (int r = 0; r < B; ++r)
            for (int k = 0; k < D; ++k) pq[(size_t)r * D + k] = (float)(r * D + k + 1) / 16384.f;
        for (int c = 0; c < N; ++c)
            for (int k = 0; k < D; ++k) pn[(size_t)c * D + k] = k == c % D ? 1.f : 0.f;
        run_gemm_case(vi, "probe B: n one-hot (checks A reads)", pq, pn, B, D, N, 1, 2);
    }
    return fails;
}

// ------------------------------------------------------------------------------------------------ correct
struct Case {
    const char* name;
    int B, D, N;
    double T;
    int off_q, off_p, off_n;  // float offsets of the bases (misalignment)
    int scale_idx;            // which of the harness's scales each input gets
    bool p_equals_q;          // positive == query (cos 1: tiny losses)
    int special = 0;          // 1: three entries beyond fp16's range (query 5, negatives 7 and N-1); 2: rows scaled
                              // by 2^-8..2^8
};

static void make_inputs(const Case& c, std::vector<float>& q, std::vector<float>& p, std::vector<float>& n,
                        uint32_t seed) {
    static const float scales[5] = {0.5f, 0.8f, 1.0f, 1.25f, 2.0f};
    const float sq = scales[(c.scale_idx + 0) % 5] * 1.03f, sp = scales[(c.scale_idx + 1) % 5] * 0.95f,
                sn = scales[(c.scale_idx + 2) % 5] * 1.07f;
    fill_rows(q, c.B, c.D, seed * 3 + 1, sq);
    if (c.p_equals_q) {
        p = q;
    } else {
        fill_rows(p, c.B, c.D, seed * 3 + 2, sp);
    }
    fill_rows(n, c.N, c.D, seed * 3 + 3, sn);
    if (c.special == 1) {  // the 3xFP16 kernels' guard: |x| >= 65520 must not give a wrong loss
        q[(size_t)5 * c.D + 3] = 7e4f;
        n[(size_t)7 * c.D + 11] = 7e4f;
        n[(size_t)c.N * c.D - 1] = -9e4f;
    }
    if (c.special == 2) {  // magnitudes over 16 binades (fp16's subnormals for the small rows' entries)
        auto scale_rows = [&](std::vector<float>& x, int rows, uint32_t salt) {
            for (int r = 0; r < rows; ++r) {
                const float f = std::ldexp(1.0f, (int)(hash32_host((uint64_t)r, salt) % 17) - 8);
                for (int k = 0; k < c.D; ++k) x[(size_t)r * c.D + k] *= f;
            }
        };
        scale_rows(q, c.B, seed + 1), scale_rows(p, c.B, seed + 2), scale_rows(n, c.N, seed + 3);
    }
}

static int check_one(const char* who, const std::string& plan, double got, double ref) {
    double rel;
    const bool ok = loss_ok(got, ref, &rel);
    printf("    %-16s %s loss %-14.8g rel_err %.2e  %s\n", who, plan.c_str(), got, rel, ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}

static int group_correct() {
    const Case cases[] = {
        // problem.yaml correctness shapes (the seed's TEMPERATURE is 0.1; cold_temperature sets 0.05)
        {"tiny", 3, 3, 7, 0.1, 0, 0, 0, 0, false},
        {"one_negative", 17, 65, 1, 0.1, 0, 0, 0, 1, false},
        {"odd_sizes", 33, 129, 1001, 0.1, 0, 0, 0, 2, false},
        {"cold_temperature", 64, 256, 4099, 0.05, 0, 0, 0, 3, false},
        {"wide_features", 130, 2048, 3001, 0.1, 0, 0, 0, 4, false},
        {"one_query", 1, 1000, 65537, 0.1, 0, 0, 0, 0, false},
        {"seed 256x512_n2560", 256, 512, 2560, 0.1, 0, 0, 0, 1, false},
        // extras
        {"seed, q base +4 B", 256, 512, 2560, 0.1, 1, 0, 0, 2, false},
        {"seed, n base +8 B", 256, 512, 2560, 0.1, 0, 0, 2, 3, false},
        {"odd D 255", 70, 255, 700, 0.1, 0, 0, 0, 4, false},
        {"D 100 (k tail 4)", 200, 100, 1500, 0.1, 0, 0, 0, 0, false},
        {"D 4", 130, 4, 300, 0.1, 0, 0, 0, 1, false},
        {"vec4 tiny 3x4 N7", 3, 4, 7, 0.1, 0, 0, 0, 2, false},
        {"B 129 ragged", 129, 64, 4097, 0.1, 0, 0, 0, 3, false},
        {"512x256 N8192", 512, 256, 8192, 0.1, 0, 0, 0, 4, false},
        {"cold T0.05 scale 2", 64, 256, 4099, 0.05, 0, 0, 0, 4, false},
        {"tiny loss p=q T0.05", 64, 128, 100, 0.05, 0, 0, 0, 2, true},
        {"seed, |x| > 65504 entries", 256, 512, 2560, 0.1, 0, 0, 0, 1, false, 1},
        {"odd, |x| > 65504 entries", 70, 256, 700, 0.1, 0, 0, 0, 3, false, 1},
        {"seed, rows 2^-8..2^8", 256, 512, 2560, 0.1, 0, 0, 0, 2, false, 2},
    };
    int fails = 0;
    uint32_t seed = 100;
    for (const Case& c : cases) {
        std::vector<float> hq, hp, hn;
        make_inputs(c, hq, hp, hn, seed++);
        const double t0 = now_s();
        const double ref = ref_loss(hq, hp, hn, c.B, c.D, c.N, c.T);
        printf("case %-22s B=%d D=%d N=%d T=%g offsets q%d p%d n%d  ref %.10g  (cpu %.2f s)\n", c.name, c.B, c.D, c.N,
               c.T, c.off_q, c.off_p, c.off_n, ref, now_s() - t0);
        DevProblem P;
        P.upload(hq, hp, hn, c.B, c.D, c.N, c.T, c.off_q, c.off_p, c.off_n);
        // fast.py
        {
            const V1Plan v = fast_v1_plan(P);
            fast_v1_launch(P, v);
            sync_or_die("fast.py");
            fails += check_one("fast.py", v1_str(v), P.read_out(), ref);
        }
        // v3 auto (what ModelNew runs), its fast.py fallback, every wgmma variant
        std::vector<std::pair<std::string, Plan>> runs;
        runs.push_back({"v3 auto", v3_plan(P, infonce_v3::MODE_AUTO, -1, 0)});
        runs.push_back({"v3 legacy", v3_plan(P, infonce_v3::MODE_LEGACY, -1, 0)});
        if (infonce_v3::can_vec4(P.q, P.p, P.n, P.D)) {
            for (int vi = 0; vi < infonce_v3::kNumWgVariants; ++vi) {
                runs.push_back({std::string("v3 var ") + std::to_string(vi), v3_plan(P, infonce_v3::MODE_WGMMA, vi, 0)});
                const bool checked_wide = vi < 2 || infonce_v3::kWgVariants[vi].kind != infonce_v3::WG_PLAIN;
                if (checked_wide && c.N > 2 * infonce_v3::kWgVariants[vi].bn)  // several n-tiles per CTA
                    runs.push_back({std::string("v3 var ") + std::to_string(vi) + " S=2",
                                    v3_plan(P, infonce_v3::MODE_WGMMA, vi, 2)});
            }
        }
        for (auto& r : runs) {
            check_launch(v3_launch(P, r.second), r.first.c_str());
            sync_or_die(r.first.c_str());
            fails += check_one(r.first.c_str(), plan_str(r.second), P.read_out(), ref);
        }
        if (c.B == 256 && c.N == 2560 && c.off_q == 0 && c.off_n == 0) {  // determinism (the harness checks it too)
            const Plan pl = v3_plan(P, infonce_v3::MODE_AUTO, -1, 0);
            uint32_t bits[3];
            for (int i = 0; i < 3; ++i) {
                check_launch(v3_launch(P, pl), "determinism");
                sync_or_die("determinism");
                const float h = P.read_out();
                memcpy(&bits[i], &h, 4);
            }
            const bool same = bits[0] == bits[1] && bits[1] == bits[2];
            printf("    determinism: three v3 auto calls %08x %08x %08x  %s\n", bits[0], bits[1], bits[2],
                   same ? "PASS" : "FAIL");
            fails += same ? 0 : 1;
        }
        P.release();
    }
    return fails;
}

// ------------------------------------------------------------------------------------------------ timing
__global__ void empty_kernel() {}

// The seed shape (256x512, N=2560, T=0.1) on the device, with its float64 reference loss.
static const Case kSeedCase = {"seed", 256, 512, 2560, 0.1, 0, 0, 0, 1, false};
static double upload_seed(DevProblem& P) {
    const Case& c = kSeedCase;
    std::vector<float> hq, hp, hn;
    make_inputs(c, hq, hp, hn, 7);
    P.upload(hq, hp, hn, c.B, c.D, c.N, c.T);
    return ref_loss(hq, hp, hn, c.B, c.D, c.N, c.T);
}

// As the harness times: calls queued in batches (flush, event, call, event; one synchronise per batch), the call
// index passed to the launch so that it can take a different input set each time.
template <class F>
static double time_median_queued(F&& launch, int reps, int batch) {
    std::vector<cudaEvent_t> a(batch), b(batch);
    for (int j = 0; j < batch; ++j) {
        CK(cudaEventCreate(&a[j]));
        CK(cudaEventCreate(&b[j]));
    }
    std::vector<float> ms;
    for (int i0 = 0; i0 < reps + batch; i0 += batch) {
        for (int j = 0; j < batch; ++j) {
            CK(cudaMemsetAsync(g_flush, (i0 + j) & 0xff, kFlushBytes));
            CK(cudaEventRecord(a[j]));
            launch(i0 + j);
            CK(cudaEventRecord(b[j]));
        }
        sync_or_die("queued batch");
        for (int j = 0; j < batch && i0 > 0; ++j) {  // the first batch warms up
            float t;
            CK(cudaEventElapsedTime(&t, a[j], b[j]));
            ms.push_back(t);
        }
    }
    for (int j = 0; j < batch; ++j) {
        CK(cudaEventDestroy(a[j]));
        CK(cudaEventDestroy(b[j]));
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

static int group_time_seed() {
    const Case& c = kSeedCase;
    DevProblem P;
    const double ref = upload_seed(P);
    const int reps = 200;
    const double flop = 2.0 * c.B * c.D * c.N;
    int fails = 0;
    printf("seed 256x512 N=2560 T=0.1, ref loss %.10g; median of %d calls, L2 flushed before each\n", ref, reps);
    const double t_empty = time_median_guarded([&] { empty_kernel<<<1, 32>>>(); }, reps, "empty kernel");
    printf("  %-16s %-42s %8.4f ms   (the timing floor of this method)\n", "empty kernel", "", t_empty);
    auto report = [&](const char* who, const std::string& plan, double ms) {
        double rel;
        const double got = P.read_out();
        const bool ok = loss_ok(got, ref, &rel);
        fails += ok ? 0 : 1;
        printf("  %-16s %s %8.4f ms  %6.1f TFLOP/s  loss rel_err %.1e %s\n", who, plan.c_str(), ms, flop / ms / 1e9,
               rel, ok ? "" : "FAIL");
    };
    double ms_fast = 0.0, ms_auto = 0.0, ms_best = 1e30;
    std::string best;
    {
        const V1Plan v = fast_v1_plan(P);
        ms_fast = time_median_guarded([&] { fast_v1_launch(P, v); }, reps, "fast.py");
        report("fast.py", v1_str(v), ms_fast);
    }
    std::vector<std::pair<std::string, Plan>> runs;
    runs.push_back({"v3 auto", v3_plan(P, infonce_v3::MODE_AUTO, -1, 0)});
    runs.push_back({"v3 legacy", v3_plan(P, infonce_v3::MODE_LEGACY, -1, 0)});
    for (int vi = 0; vi < infonce_v3::kNumWgVariants; ++vi)
        runs.push_back({std::string("v3 var ") + std::to_string(vi), v3_plan(P, infonce_v3::MODE_WGMMA, vi, 0)});
    runs.push_back({"v3 var 0 S=32", v3_plan(P, infonce_v3::MODE_WGMMA, 0, 32)});
    for (auto& r : runs) {
        const Plan pl = r.second;
        const double ms = time_median_guarded([&] { check_launch(v3_launch(P, pl), "v3"); }, reps, r.first.c_str());
        report(r.first.c_str(), plan_str(pl), ms);
        if (r.first == "v3 auto") ms_auto = ms;
        if (ms < ms_best) ms_best = ms, best = r.first + " " + infonce_v3::plan_name(pl) + " S=" + std::to_string(pl.S);
    }
    // K-split variants: how many of their clusters the GPU can hold at once (a grid beyond it runs in two waves).
    for (auto& r : runs) {
        const Plan& pl = r.second;
        const infonce_v3::WgVariant& v = infonce_v3::kWgVariants[pl.variant];
        if (pl.path != 0 || v.ks == 1 || r.first == "v3 auto") continue;
        cudaLaunchAttribute cluster;
        const cudaLaunchConfig_t cfg = infonce_v3::cluster_launch_config(v, pl, nullptr, &cluster);
        int clusters = -1;
        const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, v.kern, &cfg);
        printf("  %s: at most %d clusters of %d CTAs at once (%s); the grid has %d\n", v.name, clusters, v.ks,
               cudaGetErrorString(e), pl.grid / v.ks);
    }
    printf("SUMMARY seed 256x512 N=2560: fast.py %.4f ms, v3 auto %.4f ms (%.2fx), fastest v3 row: %s %.4f ms; "
           "empty kernel %.4f ms\n", ms_fast, ms_auto, ms_fast / ms_auto, best.c_str(), ms_best, t_empty);
    {
        // The harness's conditions, one at a time: its inputs are drawn fresh for every call (other addresses, other
        // tensor maps), and its calls are queued 32 to a batch instead of synchronised one by one.
        constexpr int kSets = 16;
        std::vector<DevProblem> sets(kSets);
        const Plan pl = runs[0].second;
        for (auto& Q : sets) {  // one workspace for all, as the extension's per-device workspace
            upload_seed(Q);
            Q.ws = P.ws, Q.ws_cap = P.ws_cap, Q.counters = P.counters, Q.counters_cap = P.counters_cap;
        }
        const double us_same = 1e3 * ms_auto;  // the "v3 auto" row above
        const double us_turn = 1e3 * time_median_guarded([&, k = 0]() mutable {
            check_launch(v3_launch(sets[k++ % kSets], pl), "v3 sets"); }, reps, "v3 sets");
        const double us_q = 1e3 * time_median_queued([&](int) { check_launch(v3_launch(P, pl), "v3 q"); }, reps, 32);
        const double us_qturn = 1e3 * time_median_queued(
            [&](int i) { check_launch(v3_launch(sets[i % kSets], pl), "v3 q sets"); }, reps, 32);
        printf("HARNESS-LIKE v3 auto, us: one input set, synchronised %.2f; %d sets in turn %.2f; queued 32 per batch "
               "%.2f; queued, sets in turn %.2f\n", us_same, kSets, us_turn, us_q, us_qturn);
        // Whether queueing costs every kernel or this one: the empty kernel and fast.py, synchronised (their rows
        // above) and queued.
        const V1Plan v1 = fast_v1_plan(P);
        const double e_q = 1e3 * time_median_queued([&](int) { empty_kernel<<<1, 32>>>(); }, reps, 32);
        const double f_q = 1e3 * time_median_queued([&](int) { fast_v1_launch(P, v1); }, reps, 32);
        printf("HARNESS-LIKE synchronised / queued, us: empty kernel %.2f / %.2f; fast.py %.2f / %.2f\n", 1e3 * t_empty,
               e_q, 1e3 * ms_fast, f_q);
        for (auto& Q : sets) {
            Q.ws = nullptr, Q.counters = nullptr;
            Q.release();
        }
    }
    P.release();
    // Fixed cost vs K loop: the auto plan at B=256, N=2560 does not depend on D.
    printf("  v3 auto over D (B=256, N=2560; plan independent of D): fixed cost = the D -> 0 intercept\n");
    for (int D : {32, 128, 256, 512, 1024}) {
        const Case cd = {"seedD", 256, D, 2560, 0.1, 0, 0, 0, 1, false};
        std::vector<float> q2, p2, n2;
        make_inputs(cd, q2, p2, n2, 9);
        DevProblem P2;
        P2.upload(q2, p2, n2, cd.B, cd.D, cd.N, cd.T);
        const Plan pl = v3_plan(P2, infonce_v3::MODE_AUTO, -1, 0);
        const V1Plan v = fast_v1_plan(P2);
        const double ms3 = time_median_guarded([&] { check_launch(v3_launch(P2, pl), "v3 D sweep"); }, 100, "v3 D sweep");
        const double ms1 = time_median_guarded([&] { fast_v1_launch(P2, v); }, 100, "fast.py D sweep");
        printf("    D=%-5d v3 %8.4f ms   fast.py %8.4f ms   (%s)\n", D, ms3, ms1, infonce_v3::plan_name(pl));
        P2.release();
    }
    return fails;
}

static int group_time_big() {
    const Case c = {"big", 4096, 1024, 65536, 0.1, 0, 0, 0, 2, false};
    const double t0 = now_s();
    std::vector<float> hq, hp, hn;
    make_inputs(c, hq, hp, hn, 21);
    DevProblem P;
    P.upload(hq, hp, hn, c.B, c.D, c.N, c.T);
    printf("big 4096x1024 N=65536 T=0.1 (inputs %.1f s); median of 10 calls, L2 flushed before each\n", now_s() - t0);
    const double flop = 2.0 * c.B * c.D * c.N;
    int fails = 0;
    double loss_v1 = 0.0, ms_fast = 0.0, ms_auto = 0.0;
    {
        const V1Plan v = fast_v1_plan(P);
        ms_fast = time_median_guarded([&] { fast_v1_launch(P, v); }, 10, "fast.py big");
        loss_v1 = P.read_out();
        printf("  %-16s %s %8.3f ms  %6.1f TFLOP/s  loss %.8g\n", "fast.py", v1_str(v).c_str(), ms_fast,
               flop / ms_fast / 1e9, loss_v1);
    }
    std::vector<std::pair<std::string, Plan>> runs;
    runs.push_back({"v3 auto", v3_plan(P, infonce_v3::MODE_AUTO, -1, 0)});
    for (int vi = 1; vi < infonce_v3::kNumWgVariants; ++vi)
        if (infonce_v3::kWgVariants[vi].bn >= 80 && infonce_v3::kWgVariants[vi].ks == 1)  // K splits: small D only
            runs.push_back({std::string("v3 var ") + std::to_string(vi), v3_plan(P, infonce_v3::MODE_WGMMA, vi, 0)});
    for (auto& r : runs) {
        const Plan pl = r.second;
        const double ms = time_median_guarded([&] { check_launch(v3_launch(P, pl), "v3 big"); }, 10, r.first.c_str());
        if (r.first == "v3 auto") ms_auto = ms;
        const double got = P.read_out();
        const double rel = std::fabs(got - loss_v1) / std::fabs(loss_v1);
        const bool ok = std::isfinite(got) && rel <= 1e-5;
        fails += ok ? 0 : 1;
        printf("  %-16s %s %8.3f ms  %6.1f TFLOP/s  loss %.8g  vs fast.py %.1e %s\n", r.first.c_str(),
               plan_str(pl).c_str(), ms, flop / ms / 1e9, got, rel, ok ? "PASS" : "FAIL");
    }
    printf("SUMMARY big 4096x1024 N=65536: fast.py %.3f ms, v3 auto %.3f ms (%.2fx)\n", ms_fast, ms_auto,
           ms_fast / ms_auto);
    // Four rows against float64 (the whole loss would be 550 GFLOP on the CPU): v3 auto's per-row debug output.
    {
        const Plan pl = v3_plan(P, infonce_v3::MODE_AUTO, -1, 0);
        double* rl;
        CK(cudaMalloc(&rl, c.B * sizeof(double)));
        CK(cudaMemset(rl, 0, c.B * sizeof(double)));
        check_launch(v3_launch(P, pl, nullptr, rl), "v3 big rows");
        sync_or_die("v3 big rows");
        std::vector<double> h(c.B);
        CK(cudaMemcpy(h.data(), rl, c.B * sizeof(double), cudaMemcpyDeviceToHost));
        CK(cudaFree(rl));
        for (int r : {0, 1, 2049, 4095}) {
            const double ref = ref_row_loss(&hq[(size_t)r * c.D], &hp[(size_t)r * c.D], hn.data(), c.N, c.D, c.T);
            double rel;
            const bool ok = loss_ok(h[r], ref, &rel);
            fails += ok ? 0 : 1;
            printf("  row %-5d v3 auto %.10g  float64 %.10g  rel_err %.1e  %s\n", r, h[r], ref, rel, ok ? "PASS" : "FAIL");
        }
    }
    P.release();
    return fails;
}

// ------------------------------------------------------------------------------------------------ probe
// Where the seed shape's time goes (diagnostics; not part of the default run):
//   * each kernel timed three ways: L2 flushed before each call (the benches' rule), warm (no flush), and 20 calls
//     back to back between one pair of events (warm; per call);
//   * in a build with -DINFONCE_V3_STAMPS: %globaltimer per CTA at the kernel's phase boundaries, microseconds
//     after a one-thread stamp kernel that runs just before (after the flush).
template <class F>
static double time_warm(F&& launch, int reps, int per_pair, const char* what) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int i = 0; i < reps + 3; ++i) {
        CK(cudaEventRecord(a));
        for (int j = 0; j < per_pair; ++j) launch();
        CK(cudaEventRecord(b));
        sync_or_die(what);
        float t;
        CK(cudaEventElapsedTime(&t, a, b));
        if (i >= 3) ms.push_back(t / per_pair);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

__device__ unsigned long long g_ref_stamp;
__global__ void ref_stamp_kernel() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    g_ref_stamp = t;
}

static int group_probe() {
    const Case& c = kSeedCase;
    DevProblem P;
    const double ref = upload_seed(P);
    int fails = 0;
#ifdef INFONCE_V3_NO_PROXY_FENCE
    printf("probe build: proxy fence REMOVED (timing only; losses may be wrong)\n");
#endif
    printf("probe, seed 256x512 N=2560: median of 100; flushed / warm / 20 back to back (per call), ms\n");
    auto row = [&](const char* who, const std::string& plan, auto&& launch) {
        const double f = time_median_guarded(launch, 100, who);
        const double w = time_warm(launch, 100, 1, who);
        const double b = time_warm(launch, 30, 20, who);
        double rel = 0.0;
        bool ok = true;
        if (plan != "") {
            ok = loss_ok(P.read_out(), ref, &rel);
#ifndef INFONCE_V3_NO_PROXY_FENCE
            fails += ok ? 0 : 1;
#endif
        }
        printf("  %-16s %-34s %8.4f %8.4f %8.4f   rel_err %.1e %s\n", who, plan.c_str(), f, w, b, rel, ok ? "" : "WRONG");
    };
    row("empty kernel", "", [&] { empty_kernel<<<1, 32>>>(); });
    row("ref stamp", "", [&] { ref_stamp_kernel<<<1, 1>>>(); });
    {
        const V1Plan v = fast_v1_plan(P);
        row("fast.py", v1_str(v), [&] { fast_v1_launch(P, v); });
    }
    for (int S : {0, 16, 32, 128}) {
        const Plan pl = v3_plan(P, S ? infonce_v3::MODE_WGMMA : infonce_v3::MODE_AUTO, S ? 0 : -1, S);
        const std::string who = S ? "v3 var 0 S=" + std::to_string(S) : std::string("v3 auto");
        row(who.c_str(), plan_str(pl), [&] { check_launch(v3_launch(P, pl), "probe"); });
    }
#ifdef INFONCE_V3_STAMPS
    {
        int pv = -1;  // INFONCE_PROBE_VARIANT=name: stamp that variant instead of the automatic plan
        if (const char* want = getenv("INFONCE_PROBE_VARIANT"))
            for (int vi = 0; vi < infonce_v3::kNumWgVariants; ++vi)
                if (strcmp(infonce_v3::kWgVariants[vi].name, want) == 0) pv = vi;
        const Plan pl = v3_plan(P, pv < 0 ? infonce_v3::MODE_AUTO : infonce_v3::MODE_WGMMA, pv, 0);
        const char* names[infonce_v3::kStampSlots] = {"entry", "prologue done", "1st k-tile stored", "K loop done",
                                                       "ticket", "merged (last CTA)", "output (last CTA)",
                                                       "K split: wg0 loop end", "K split: wg1 loop end",
                                                       "K split: keeper got sums", "K split: keeper folded",
                                                       "B group 1 landed"};
        printf("stamps, v3 auto %s, grid %d: us after the stamp kernel; per slot: CTAs, min / p10 / p50 / p90 / max\n",
               plan_str(pl).c_str(), pl.grid);
        static unsigned long long h[infonce_v3::kStampCtas][infonce_v3::kStampSlots];
        for (int call = 0; call < 6; ++call) {
            memset(h, 0, sizeof h);
            CK(cudaMemcpyToSymbol(infonce_v3::g_v3_stamps, h, sizeof h));
            CK(cudaMemsetAsync(g_flush, call & 0xff, kFlushBytes));
            ref_stamp_kernel<<<1, 1>>>();
            check_launch(v3_launch(P, pl), "stamps");
            sync_or_die("stamps");
            unsigned long long r0;
            CK(cudaMemcpyFromSymbol(&r0, g_ref_stamp, sizeof r0));
            CK(cudaMemcpyFromSymbol(h, infonce_v3::g_v3_stamps, sizeof h));
            printf(" call %d\n", call);
            {
                static unsigned long long ph[infonce_v3::kStampCtas][infonce_v3::kStampSlots];
                CK(cudaMemcpyFromSymbol(ph, infonce_v3::g_v3_phase, sizeof ph));
                const char* pn[7] = {"raw wait", "lds+split+sts", "fence+barrier", "wgmma issue", "wait prev", "rest",
                                     "TMA refill"};
                printf("   K-loop clocks of thread 0 per iteration, median CTA:");
                for (int i = 0; i < 7; ++i) {
                    std::vector<double> v;
                    for (int b = 0; b < pl.grid; ++b) v.push_back((double)ph[b][i]);
                    std::sort(v.begin(), v.end());
                    printf(" %s %.0f", pn[i], v[v.size() / 2] / (c.D / 32.0));
                }
                printf("\n");
            }
            {  // the B-resident kernel: thread 0's iteration ends (medians over CTAs)
                static unsigned long long hi[infonce_v3::kStampCtas][infonce_v3::kStampIters];
                CK(cudaMemcpyFromSymbol(hi, infonce_v3::g_v3_iter, sizeof hi));
                printf("   iteration ends (p50 / max over CTAs):");
                for (int it = 0; it < infonce_v3::kStampIters; ++it) {
                    std::vector<double> v;
                    for (int b = 0; b < std::min(pl.grid, infonce_v3::kStampCtas); ++b)
                        if (hi[b][it] > r0) v.push_back(((double)hi[b][it] - (double)r0) / 1000.0);
                    if (v.empty()) break;
                    std::sort(v.begin(), v.end());
                    printf(" %d: %.2f/%.2f", it, v[v.size() / 2], v.back());
                }
                printf("\n");
                memset(hi, 0, sizeof hi);
                CK(cudaMemcpyToSymbol(infonce_v3::g_v3_iter, hi, sizeof hi));
            }
            for (int sl = 0; sl < infonce_v3::kStampSlots; ++sl) {
                std::vector<double> v;
                for (int b = 0; b < std::min(pl.grid, infonce_v3::kStampCtas); ++b)
                    if (h[b][sl]) v.push_back(((double)h[b][sl] - (double)r0) / 1000.0);
                if (v.empty()) continue;
                std::sort(v.begin(), v.end());
                auto q = [&](double f) { return v[std::min(v.size() - 1, (size_t)(f * (v.size() - 1) + 0.5))]; };
                printf("   %-24s %4zu  %7.2f / %7.2f / %7.2f / %7.2f / %7.2f\n", names[sl], v.size(), v.front(), q(0.1),
                       q(0.5), q(0.9), v.back());
            }
            // K split (clusters of 2, CTA b of rank r = b % 2 keeps warpgroup r's rows and gets them from warpgroup r
            // of CTA b ^ 1): per keeper, the sender's loop end -> sums there -> folded, and the CTA's two loop ends.
            if (h[0][9] != 0) {
                std::vector<double> xfer, fold, skew, late;
                for (int b = 0; b < std::min(pl.grid, infonce_v3::kStampCtas); ++b) {
                    const int r = b % 2, peer = b ^ 1;
                    if (!h[b][9] || !h[peer][7 + r]) continue;
                    xfer.push_back(((double)h[b][9] - (double)h[peer][7 + r]) / 1000.0);
                    fold.push_back(((double)h[b][10] - (double)h[b][9]) / 1000.0);
                    skew.push_back(((double)h[b][8] - (double)h[b][7]) / 1000.0);
                    late.push_back(((double)h[b][9] - (double)std::max(h[peer][7 + r], h[b][7 + r])) / 1000.0);
                }
                auto pr = [](const char* n, std::vector<double> v) {
                    if (v.empty()) return;
                    std::sort(v.begin(), v.end());
                    printf("   %-44s %7.2f / %7.2f / %7.2f\n", n, v.front(), v[v.size() / 2], v.back());
                };
                pr("sender's loop end -> keeper has sums (us)", xfer);
                pr("keeper's last loop end of the two -> has sums", late);
                pr("keeper has sums -> folded", fold);
                pr("wg1 loop end - wg0 loop end (same CTA)", skew);
            }
        }
    }
#endif
    P.release();
    return fails;
}

// ------------------------------------------------------------------------------------------------ one
// For a profiler (ncu -k regex:infonce_wgmma --launch-skip 2 --launch-count 1): the seed shape, five flushed calls of
// the variant INFONCE_ONE_VARIANT names (default: the automatic plan).
static int group_one() {
    DevProblem P;
    const double ref = upload_seed(P);
    int vi = -1;
    if (const char* want = getenv("INFONCE_ONE_VARIANT"))
        for (int i = 0; i < infonce_v3::kNumWgVariants; ++i)
            if (strcmp(infonce_v3::kWgVariants[i].name, want) == 0) vi = i;
    const Plan pl = v3_plan(P, vi < 0 ? infonce_v3::MODE_AUTO : infonce_v3::MODE_WGMMA, vi, 0);
    for (int i = 0; i < 5; ++i) {
        CK(cudaMemsetAsync(g_flush, i & 0xff, kFlushBytes));
        check_launch(v3_launch(P, pl), "one");
        sync_or_die("one", 50.0);
    }
    double rel;
    const bool ok = loss_ok(P.read_out(), ref, &rel);
    printf("one: %s rel_err %.1e %s\n", plan_str(pl).c_str(), rel, ok ? "PASS" : "FAIL");
    P.release();
    return ok ? 0 : 1;
}

// ------------------------------------------------------------------------------------------------ driver
static int run_group(const std::string& g) {
    if (g == "one") return group_one();
    if (g.rfind("gemm:", 0) == 0) return group_gemm(atoi(g.c_str() + 5));
    if (g == "correct") return group_correct();
    if (g == "time_seed") return group_time_seed();
    if (g == "time_big") return group_time_big();
    if (g == "probe") return group_probe();
    printf("unknown group %s\n", g.c_str());
    return 1;
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    if (argc > 1) {
        alarm(strcmp(argv[1], "one") == 0 ? 300 : 55);  // a group that runs away is killed (a profiler needs longer)
        cudaDeviceProp prop;
        CK(cudaGetDeviceProperties(&prop, 0));
        g_sms = prop.multiProcessorCount;
        CK(cudaMalloc(&g_flush, kFlushBytes));
        const int f = run_group(argv[1]);
        printf("RESULT failures=%d\n", f);
        return 0;
    }
    // Driver: every group in its own process.
    {
        cudaDeviceProp prop;
        CK(cudaGetDeviceProperties(&prop, 0));
        printf("device %s, %d SMs, sm_%d%d; fast_v3 variants: %d\n", prop.name, prop.multiProcessorCount, prop.major,
               prop.minor, infonce_v3::kNumWgVariants);
        for (int vi = 0; vi < infonce_v3::kNumWgVariants; ++vi)
            printf("  variant %d = %s%s\n", vi, infonce_v3::kWgVariants[vi].name,
                   infonce_v3::kWgVariants[vi].automatic ? " (automatic plan)" : "");
    }
    std::vector<std::string> groups;
    for (int vi = 0; vi < infonce_v3::kNumWgVariants; ++vi) groups.push_back("gemm:" + std::to_string(vi));
    groups.push_back("correct");
    groups.push_back("time_seed");
    groups.push_back("time_big");
    int total = 0;
    const double t0 = now_s();
    std::vector<std::string> summary;
    for (const std::string& g : groups) {
        if (now_s() - t0 > 55.0) {  // a run of timeouts must not take the whole run past a minute
            printf("==== %s skipped: 55 s spent; counted as 1 failure\n", g.c_str());
            ++total;
            continue;
        }
        printf("==== %s\n", g.c_str());
        const std::string cmd = std::string("'") + argv[0] + "' " + g + " 2>&1";
        FILE* f = popen(cmd.c_str(), "r");
        if (!f) {
            printf("cannot start %s\n", g.c_str());
            ++total;
            continue;
        }
        char line[4096];
        int got = -1;
        while (fgets(line, sizeof line, f)) {
            fputs(line, stdout);
            if (strncmp(line, "SUMMARY", 7) == 0) summary.push_back(line);
            int n;
            if (sscanf(line, "RESULT failures=%d", &n) == 1) got = n;
        }
        const int st = pclose(f);
        if (got < 0) {
            printf("group %s ended without a result (exit status %d): counted as 1 failure\n", g.c_str(), st);
            got = 1;
        }
        total += got;
    }
    printf("==== total %.1f s\n", now_s() - t0);
    for (const std::string& l : summary) fputs(l.c_str(), stdout);
    if (total == 0) printf("ALL CORRECT\n");
    else printf("FAILURES: %d\n", total);
    return total == 0 ? 0 : 1;
}
