// Standalone InfoNCE bench (no torch): built here with nvcc (build.sh, sm_90a), carried to the H200 as a binary.
// The device code and the plan/launch are solutions/infonce/wgmma_fused.py's `_kernel_src`, extracted by build.sh
// (extract_src.py) into infonce_wgmma_fused.cuh, not copied: the bench times exactly what the solution runs.
// Besides the automatic plan (what ModelNew runs) it forces each wgmma tile, split counts and the mma.sync path
// through the solution's plan_for().
//
//   infonce_bench              run every group below, each in its own process (a crash or a sticky CUDA error
//                              in one group cannot take the others down), then print ALL CORRECT / FAILURES: n
//   infonce_bench GROUP        run one group:
//     correct    loss vs a float64 CPU reference on every problem.yaml correctness shape and extras (odd D,
//                misaligned bases, k tails, ragged tiles, several n-tiles per CTA, tiny losses, inputs beyond
//                fp16's range), for the automatic plan, every wgmma tile, a forced split count and the mma.sync
//                path; bitwise determinism of the automatic plan
//     time_seed  seed shape 256x512 N=2560: the automatic plan, every tile, the mma.sync path, an empty kernel (the
//                timing floor); the harness's conditions (HARNESS-LIKE: fresh input sets, calls queued in batches of
//                32); the automatic plan over D (fixed cost vs K loop)
//     time_big   4096x1024 N=65536: the automatic plan and the TMA tiles (timing); their losses against the
//                mma.sync path's (an independent kernel: the whole float64 loss would be 550 GFLOP on the CPU)
//     one        (only when named) five flushed seed-shape calls of one tile (INFONCE_ONE_TILE=name), for ncu
//     probe      (only when named) seed shape: flushed / warm / back-to-back times of the automatic plan and the
//                40-wide TMA tile at several split counts
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
#include "infonce_wgmma_fused.cuh"  // the solution's device code and host plan/launch

using wgmma_fused::Plan;
using wgmma_fused::kWgTiles;
using wgmma_fused::kNumWgTiles;

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
    unsigned* counter = nullptr;  // the kernels' ticket, zeroed once (every launch leaves it zero)
    void* ws = nullptr;
    size_t ws_cap = 0;
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
    void ensure_ws(size_t bytes) {
        if (bytes > ws_cap) {
            if (ws) CK(cudaFree(ws));
            ws_cap = std::max<size_t>(bytes, 1 << 16);
            CK(cudaMalloc(&ws, ws_cap));
        }
        if (counter == nullptr) {
            CK(cudaMalloc(&counter, sizeof(unsigned)));
            CK(cudaMemset(counter, 0, sizeof(unsigned)));
        }
    }
    void release() {
        for (void* x : {(void*)q_alloc, (void*)p_alloc, (void*)n_alloc, (void*)out, ws, (void*)counter})
            if (x) CK(cudaFree(x));
        *this = DevProblem();
    }
    float read_out() {
        float h = 0.f;
        CK(cudaMemcpy(&h, out, 4, cudaMemcpyDeviceToHost));
        return h;
    }
};

// ------------------------------------------------------------------------------------------------ plans
// The automatic plan (what ModelNew runs).
static Plan auto_plan(const DevProblem& P) {
    return wgmma_fused::make_plan(P.B, P.D, P.N, wgmma_fused::can_vec4(P.q, P.p, P.n, P.D), g_sms);
}
// The mma.sync path (any input: it is what misaligned or D % 4 != 0 inputs run).
static Plan mma_sync_plan(const DevProblem& P) { return wgmma_fused::make_plan(P.B, P.D, P.N, false, g_sms); }
// Whether wgmma tile `tile` can run this problem (16-byte loads; its shared memory; the B-resident kernel's 3-D
// copies of whole k-tiles).
static bool tile_runs(const DevProblem& P, int tile) {
    const auto& v = kWgTiles[tile];
    return wgmma_fused::can_vec4(P.q, P.p, P.n, P.D) && wgmma_fused::wg_smem_bytes(v, P.D) <= wgmma_fused::kMaxDynSmem &&
           (!v.resident || P.D % 32 == 0);
}
// wgmma tile `tile` with S partials per row: S <= 0 takes the split count the wave model would give that tile
// alone (the B-resident kernel always has one n-tile per cluster).
static Plan tile_plan(const DevProblem& P, int tile, int S = 0) {
    const auto& v = kWgTiles[tile];
    const long long mt = (P.B + 127) / 128, nt = (P.N + v.bn - 1) / v.bn;
    if (v.resident) {
        S = (int)nt;
    } else if (S <= 0) {
        double best = 1e300;
        for (long long s = 1; s <= std::min<long long>(nt, 1024); ++s) {
            const double t = (double)((mt * s + g_sms - 1) / g_sms) * (double)((nt + s - 1) / s);
            if (t < best * 0.97) best = t, S = (int)s;
        }
    }
    return wgmma_fused::plan_for(P.B, P.D, P.N, wgmma_fused::PATH_WGMMA, tile, (int)std::min<long long>(S, nt));
}
static cudaError_t run_plan(DevProblem& P, const Plan& pl) {
    P.ensure_ws(pl.ws_bytes);
    return wgmma_fused::launch(pl, P.q, P.p, P.n, P.B, P.D, P.N, P.T, P.counter, P.ws, P.out, 0);
}
static std::string plan_str(const Plan& pl) {
    char buf[128];
    snprintf(buf, sizeof buf, "%-18s S=%-4d grid=%-5d", wgmma_fused::plan_name(pl), pl.S, pl.grid);
    return buf;
}

// |got - ref| <= 1e-4 + 1e-4 |ref| and a relative error of at most 1e-5 (tighter than problem.yaml's tolerance).
static bool loss_ok(double got, double ref, double* rel_out) {
    const double diff = std::fabs(got - ref);
    const double rel = diff / std::max(std::fabs(ref), 1e-30);
    if (rel_out) *rel_out = rel;
    return std::isfinite(got) && diff <= 1e-4 + 1e-4 * std::fabs(ref) && rel <= 1e-5;
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
    if (c.special == 1) {  // the 3xFP16 kernel's guard: |x| >= 65520 must not give a wrong loss
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
        {"D 96 (3 k-tiles)", 200, 96, 3000, 0.1, 0, 0, 0, 3, false},
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
        // the automatic plan (what ModelNew runs), the mma.sync path, every wgmma tile that can run the case, and
        // the TMA tiles with several n-tiles per CTA
        std::vector<std::pair<std::string, Plan>> runs;
        runs.push_back({"auto", auto_plan(P)});
        runs.push_back({"mma_sync", mma_sync_plan(P)});
        for (int t = 0; t < kNumWgTiles; ++t) {
            if (!tile_runs(P, t)) continue;
            runs.push_back({std::string("tile ") + kWgTiles[t].name, tile_plan(P, t)});
            if (!kWgTiles[t].resident && c.N > 2 * kWgTiles[t].bn)
                runs.push_back({std::string("tile ") + kWgTiles[t].name + " S=2", tile_plan(P, t, 2)});
        }
        for (auto& r : runs) {
            check_launch(run_plan(P, r.second), r.first.c_str());
            sync_or_die(r.first.c_str());
            fails += check_one(r.first.c_str(), plan_str(r.second), P.read_out(), ref);
        }
        if (c.B == 256 && c.N == 2560 && c.off_q == 0 && c.off_n == 0) {  // determinism (the harness checks it too)
            const Plan pl = auto_plan(P);
            uint32_t bits[3];
            for (int i = 0; i < 3; ++i) {
                check_launch(run_plan(P, pl), "determinism");
                sync_or_die("determinism");
                const float h = P.read_out();
                memcpy(&bits[i], &h, 4);
            }
            const bool same = bits[0] == bits[1] && bits[1] == bits[2];
            printf("    determinism: three automatic-plan calls %08x %08x %08x  %s\n", bits[0], bits[1], bits[2],
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
    printf("  %-22s %-42s %8.4f ms   (the timing floor of this method)\n", "empty kernel", "", t_empty);
    auto report = [&](const char* who, const std::string& plan, double ms) {
        double rel;
        const double got = P.read_out();
        const bool ok = loss_ok(got, ref, &rel);
        fails += ok ? 0 : 1;
        printf("  %-22s %s %8.4f ms  %6.1f TFLOP/s  loss rel_err %.1e %s\n", who, plan.c_str(), ms, flop / ms / 1e9,
               rel, ok ? "" : "FAIL");
    };
    std::vector<std::pair<std::string, Plan>> runs;
    runs.push_back({"auto", auto_plan(P)});
    runs.push_back({"mma_sync", mma_sync_plan(P)});
    for (int t = 0; t < kNumWgTiles; ++t)
        if (tile_runs(P, t)) runs.push_back({std::string("tile ") + kWgTiles[t].name, tile_plan(P, t)});
    runs.push_back({"tile tma_n40 S=32", tile_plan(P, 0, 32)});
    double ms_auto = 0.0, ms_mma = 0.0, ms_best = 1e30;
    std::string best;
    for (auto& r : runs) {
        const Plan pl = r.second;
        const double ms = time_median_guarded([&] { check_launch(run_plan(P, pl), "seed"); }, reps, r.first.c_str());
        report(r.first.c_str(), plan_str(pl), ms);
        if (r.first == "auto") ms_auto = ms;
        if (r.first == "mma_sync") ms_mma = ms;
        if (ms < ms_best) ms_best = ms, best = r.first + " S=" + std::to_string(pl.S);
    }
    // The B-resident kernel: how many of its clusters the GPU can hold at once (a grid beyond it runs in two waves).
    for (auto& r : runs) {
        const Plan& pl = r.second;
        if (pl.path != wgmma_fused::PATH_WGMMA || !kWgTiles[pl.tile].resident || r.first == "auto") continue;
        cudaLaunchAttribute cluster;
        const cudaLaunchConfig_t cfg = wgmma_fused::cluster_launch_config(pl, nullptr, &cluster);
        int clusters = -1;
        const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kWgTiles[pl.tile].kern, &cfg);
        printf("  %s: at most %d clusters of %d CTAs at once (%s); the grid has %d\n", kWgTiles[pl.tile].name, clusters,
               wgmma_fused::kPairCtas, cudaGetErrorString(e), pl.grid / wgmma_fused::kPairCtas);
    }
    printf("SUMMARY seed 256x512 N=2560: auto %.4f ms, mma.sync path %.4f ms (%.2fx), fastest row: %s %.4f ms; "
           "empty kernel %.4f ms\n", ms_auto, ms_mma, ms_mma / ms_auto, best.c_str(), ms_best, t_empty);
    {
        // The harness's conditions, one at a time: its inputs are drawn fresh for every call (other addresses, other
        // tensor maps), and its calls are queued 32 to a batch instead of synchronised one by one.
        constexpr int kSets = 16;
        std::vector<DevProblem> sets(kSets);
        const Plan pl = runs[0].second;
        for (auto& Q : sets) {  // one workspace for all, as the extension's per-device workspace
            upload_seed(Q);
            Q.ws = P.ws, Q.ws_cap = P.ws_cap, Q.counter = P.counter;
        }
        const double us_same = 1e3 * ms_auto;  // the "auto" row above
        const double us_turn = 1e3 * time_median_guarded([&, k = 0]() mutable {
            check_launch(run_plan(sets[k++ % kSets], pl), "sets"); }, reps, "sets");
        const double us_q = 1e3 * time_median_queued([&](int) { check_launch(run_plan(P, pl), "queued"); }, reps, 32);
        const double us_qturn = 1e3 * time_median_queued(
            [&](int i) { check_launch(run_plan(sets[i % kSets], pl), "queued sets"); }, reps, 32);
        printf("HARNESS-LIKE auto, us: one input set, synchronised %.2f; %d sets in turn %.2f; queued 32 per batch "
               "%.2f; queued, sets in turn %.2f\n", us_same, kSets, us_turn, us_q, us_qturn);
        // Whether queueing costs every kernel or this one: the empty kernel and the mma.sync path, synchronised (their
        // rows above) and queued.
        const Plan mp = mma_sync_plan(P);
        const double e_q = 1e3 * time_median_queued([&](int) { empty_kernel<<<1, 32>>>(); }, reps, 32);
        const double m_q = 1e3 * time_median_queued([&](int) { check_launch(run_plan(P, mp), "queued mma"); }, reps, 32);
        printf("HARNESS-LIKE synchronised / queued, us: empty kernel %.2f / %.2f; mma.sync path %.2f / %.2f\n",
               1e3 * t_empty, e_q, 1e3 * ms_mma, m_q);
        for (auto& Q : sets) {
            Q.ws = nullptr, Q.counter = nullptr;
            Q.release();
        }
    }
    P.release();
    // Fixed cost vs K loop (the B-resident pair from D = 128 to 512; at 1024 its tile no longer fits).
    printf("  auto over D (B=256, N=2560): fixed cost = the D -> 0 intercept of the same plan\n");
    for (int D : {128, 256, 512, 1024}) {
        const Case cd = {"seedD", 256, D, 2560, 0.1, 0, 0, 0, 1, false};
        std::vector<float> q2, p2, n2;
        make_inputs(cd, q2, p2, n2, 9);
        DevProblem P2;
        P2.upload(q2, p2, n2, cd.B, cd.D, cd.N, cd.T);
        const Plan pl = auto_plan(P2), mp = mma_sync_plan(P2);
        const double ms_a = time_median_guarded([&] { check_launch(run_plan(P2, pl), "D sweep"); }, 100, "D sweep");
        const double ms_m = time_median_guarded([&] { check_launch(run_plan(P2, mp), "D sweep mma"); }, 100, "D sweep mma");
        printf("    D=%-5d auto %8.4f ms (%s)   mma.sync path %8.4f ms\n", D, ms_a, wgmma_fused::plan_name(pl), ms_m);
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
    // The reference: the mma.sync path (a different kernel and tile, 3xTF32 mma.sync), 3 timed calls.
    const Plan mp = mma_sync_plan(P);
    const double ms_mma = time_median_guarded([&] { check_launch(run_plan(P, mp), "mma big"); }, 3, "mma big");
    const double loss_mma = P.read_out();
    printf("  %-16s %s %8.3f ms  %6.1f TFLOP/s  loss %.8g\n", "mma_sync", plan_str(mp).c_str(), ms_mma,
           flop / ms_mma / 1e9, loss_mma);
    std::vector<std::pair<std::string, Plan>> runs;
    runs.push_back({"auto", auto_plan(P)});
    for (int t = 0; t < kNumWgTiles; ++t)
        if (!kWgTiles[t].resident) runs.push_back({std::string("tile ") + kWgTiles[t].name, tile_plan(P, t)});
    double ms_auto = 0.0;
    for (auto& r : runs) {
        const Plan pl = r.second;
        const double ms = time_median_guarded([&] { check_launch(run_plan(P, pl), "big"); }, 10, r.first.c_str());
        if (r.first == "auto") ms_auto = ms;
        const double got = P.read_out();
        const double rel = std::fabs(got - loss_mma) / std::fabs(loss_mma);
        const bool ok = std::isfinite(got) && rel <= 1e-5;
        fails += ok ? 0 : 1;
        printf("  %-16s %s %8.3f ms  %6.1f TFLOP/s  loss %.8g  vs mma.sync %.1e %s\n", r.first.c_str(),
               plan_str(pl).c_str(), ms, flop / ms / 1e9, got, rel, ok ? "PASS" : "FAIL");
    }
    printf("SUMMARY big 4096x1024 N=65536: auto %.3f ms, mma.sync path %.3f ms\n", ms_auto, ms_mma);
    P.release();
    return fails;
}

// ------------------------------------------------------------------------------------------------ probe
// Where the seed shape's time goes (not part of the default run): each plan timed three ways: L2 flushed before each
// call (the benches' rule), warm (no flush), and 20 calls back to back between one pair of events (warm; per call).
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

static int group_probe() {
    DevProblem P;
    const double ref = upload_seed(P);
    int fails = 0;
    printf("probe, seed 256x512 N=2560: median of 100; flushed / warm / 20 back to back (per call), ms\n");
    auto row = [&](const char* who, const std::string& plan, auto&& launch) {
        const double f = time_median_guarded(launch, 100, who);
        const double w = time_warm(launch, 100, 1, who);
        const double b = time_warm(launch, 30, 20, who);
        double rel = 0.0;
        bool ok = true;
        if (plan != "") {
            ok = loss_ok(P.read_out(), ref, &rel);
            fails += ok ? 0 : 1;
        }
        printf("  %-18s %-34s %8.4f %8.4f %8.4f   rel_err %.1e %s\n", who, plan.c_str(), f, w, b, rel, ok ? "" : "WRONG");
    };
    row("empty kernel", "", [&] { empty_kernel<<<1, 32>>>(); });
    {
        const Plan pl = auto_plan(P);
        row("auto", plan_str(pl), [&] { check_launch(run_plan(P, pl), "probe"); });
    }
    {
        const Plan pl = mma_sync_plan(P);
        row("mma_sync", plan_str(pl), [&] { check_launch(run_plan(P, pl), "probe"); });
    }
    for (int S : {16, 32, 64}) {
        const Plan pl = tile_plan(P, 0, S);
        const std::string who = "tma_n40 S=" + std::to_string(S);
        row(who.c_str(), plan_str(pl), [&] { check_launch(run_plan(P, pl), "probe"); });
    }
    P.release();
    return fails;
}

// ------------------------------------------------------------------------------------------------ one
// For a profiler (ncu -k regex:infonce_wgmma --launch-skip 2 --launch-count 1): the seed shape, five flushed calls of
// the tile INFONCE_ONE_TILE names (default: the automatic plan).
static int group_one() {
    DevProblem P;
    const double ref = upload_seed(P);
    Plan pl = auto_plan(P);
    if (const char* want = getenv("INFONCE_ONE_TILE"))
        for (int t = 0; t < kNumWgTiles; ++t)
            if (strcmp(kWgTiles[t].name, want) == 0) pl = tile_plan(P, t);
    for (int i = 0; i < 5; ++i) {
        CK(cudaMemsetAsync(g_flush, i & 0xff, kFlushBytes));
        check_launch(run_plan(P, pl), "one");
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
        printf("device %s, %d SMs, sm_%d%d; wgmma tiles:", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
        for (int t = 0; t < kNumWgTiles; ++t) printf(" %s", kWgTiles[t].name);
        printf("\n");
    }
    const std::vector<std::string> groups = {"correct", "time_seed", "time_big"};
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
