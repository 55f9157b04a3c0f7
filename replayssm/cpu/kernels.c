/* Fused CPU kernels of ReplaySSM Bench (backend="cpu"): one C translation unit, built once per machine by
 * replayssm/cpu/build.py and loaded with ctypes.
 *
 * Every kernel is one OpenMP loop over (row, head): a program owns one head of one row's state, walks the
 * state row by row (a Mamba-2 row is [dstate], a GDN row is [K]: the update of one row never needs another
 * row), and touches each state element once per step as the GPU kernel does: read once, written once when the
 * method stores (baseline steps, flushes, per-draft snapshots), never when it does not (ReplaySSM normal steps).
 * Inner loops run over the contiguous last dim with `omp simd`, so gcc vectorises them (AVX2 on x86).
 *
 * Families: Mamba-2 and GDN; Kimi Delta Attention (KDA) is GDN with a decay per key channel, served by GDN's AR
 * kernels (gdn_step, gdn_replay) with pc = 1: g is then a K-vector per value head and token, the state's
 * column c decays by exp(g[c]), and those exps are taken 8 lanes at a time (vexp_sub, kda_weight_key below).
 *
 * Dtypes: kernels_body.h is included once per (state dtype, activation dtype) pair; math is fp32. bf16 is
 * a uint16 with round-to-nearest-even stores; fp16 is the compiler's _Float16 (present in gcc >= 12 and
 * clang on x86-64 / aarch64). Where _Float16 is missing the fp16 variants are not built and
 * replayssm_cpu_has_fp16() returns 0 (the Python side then refuses fp16 with a clear error).
 *
 * Conventions: every tensor is contiguous; `slots` is int32 [batch], a negative slot is a padding row
 * (skipped, output untouched); nt = OpenMP threads (the caller passes torch.get_num_threads()).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define SOFTPLUS_THRESHOLD 20.0f
#define MAXV 1024   /* largest headdim / V / dstate / K a kernel keeps on its stack (checked in Python) */
#define MAXL 64     /* largest buffer / ring length (checked in Python) */

static inline float bf16_load(uint16_t v) { uint32_t u = (uint32_t)v << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t bf16_store(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);   /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                              /* round to nearest even */
    return (uint16_t)(u >> 16);
}
/* 8 fp32 lanes (GCC / clang vector extension: AVX on x86-64, two NEON registers on aarch64), the register
 * tile of the blocked rank-J row rebuild; loads and stores go through memcpy (no alignment assumed). */
typedef float v8f __attribute__((vector_size(32)));
static inline v8f v8_load(const float *p) { v8f v; memcpy(&v, p, sizeof v); return v; }
static inline void v8_store(float *p, v8f v) { memcpy(p, &v, sizeof v); }
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));
typedef int32_t v8i32 __attribute__((vector_size(32)));
static inline v8f v8_bits(v8u32 u) { v8f v; memcpy(&v, &u, sizeof v); return v; }
static inline v8f v8_load_bf16(const uint16_t *p) {
    v8u16 h; memcpy(&h, p, sizeof h);
    return v8_bits(__builtin_convertvector(h, v8u32) << 16);
}
static inline void v8_store_bf16(uint16_t *p, v8f v) {
    v8u32 u; memcpy(&u, &v, sizeof u);
    const v8u32 nan = (v8u32)((v8i32)(u & 0x7fffffffu) > (v8i32){0x7f800000, 0x7f800000, 0x7f800000, 0x7f800000,
                                                                    0x7f800000, 0x7f800000, 0x7f800000, 0x7f800000});
    const v8u32 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
    const v8u16 h = __builtin_convertvector((nan & quiet) | (~nan & rounded), v8u16);
    memcpy(p, &h, sizeof h);
}
static inline float hsum8(v8f v) {
    float t[8];
    v8_store(t, v);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}
/* The eight lane sums of a0..a7 as one vector, {sum a0, ..., sum a7}: three rounds of pairwise adds (x86's
 * hadd pattern in generic shuffles, 7 adds and 14 shuffles) instead of eight separate reductions. */
#define V8_HADD(a, b) (__builtin_shufflevector(a, b, 0, 2, 8, 10, 4, 6, 12, 14) + \
                       __builtin_shufflevector(a, b, 1, 3, 9, 11, 5, 7, 13, 15))
static inline v8f hsum8x8(v8f a0, v8f a1, v8f a2, v8f a3, v8f a4, v8f a5, v8f a6, v8f a7)
{
    const v8f q0 = V8_HADD(V8_HADD(a0, a1), V8_HADD(a2, a3)), q1 = V8_HADD(V8_HADD(a4, a5), V8_HADD(a6, a7));
    return __builtin_shufflevector(q0, q1, 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(q0, q1, 4, 5, 6, 7, 12, 13, 14, 15);
}
static inline float softplus_f(float x) { return x <= SOFTPLUS_THRESHOLD ? log1pf(expf(x)) : x; }
static inline float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Vector expf and the SiLU gate y *= z sigmoid(z) over a [P] row. An output-only ReplaySSM step otherwise only
 * streams the state once, so a scalar libm expf and divide per output element is a visible share of it; eight
 * lanes at a time it is not (replayssm/cpu/README.md, "What was measured"). expf: Cody-Waite range reduction
 * x = n ln2 + r and a degree-6 polynomial for exp(r) (the classic single-precision minimax coefficients, ~1 ulp),
 * 2^n built in the exponent bits. x is clamped to [-87.3, 88.3] so 2^n stays a normal float; a NaN fails both
 * comparisons and stays NaN. */
static inline v8f v8_set1(float a) { return (v8f){a, a, a, a, a, a, a, a}; }
static inline v8f v8_select(v8i32 m, v8f a, v8f b) { return (v8f)(((v8i32)a & m) | ((v8i32)b & ~m)); }
static inline v8f v8_expf(v8f x)
{
    x = v8_select(x > v8_set1(88.3f), v8_set1(88.3f), x);
    x = v8_select(x < v8_set1(-87.3f), v8_set1(-87.3f), x);
    const v8f t = x * 1.44269504088896341f;
    const v8i32 n = __builtin_convertvector(t + v8_select(t >= v8_set1(0.0f), v8_set1(0.5f), v8_set1(-0.5f)), v8i32);
    const v8f nf = __builtin_convertvector(n, v8f);
    const v8f r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;
    v8f p = v8_set1(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const v8f y = p * (r * r) + r + 1.0f;
    return y * (v8f)((n + 127) << 23);
}
static inline void silu_gate(float *y, const float *zf, int P)
{
    int p = 0;
    for (; p + 8 <= P; p += 8) {
        const v8f zv = v8_load(zf + p);
        v8_store(y + p, v8_load(y + p) * (zv / (1.0f + v8_expf(-zv))));
    }
    for (; p < P; p++) y[p] *= zf[p] * sigmoid_f(zf[p]);
}

/* KDA's per-key-channel decays (gdn_step / gdn_replay with pc = 1): K-vectors of exps, 8 lanes at a time, libm
 * for a tail. A program takes (h + 2) K of them, the same order of work as its h buffered-key dot products,
 * where scalar libm expf made the KDA replay step 1.45x slower (replayssm/cpu/README.md, "What was measured").
 * vexp_sub: dst = exp(a - b) (b NULL: exp(a)); dst may be a. */
static inline void vexp_sub(float *dst, const float *a, const float *b, int K)
{
    int n = 0;
    for (; n + 8 <= K; n += 8) v8_store(dst + n, v8_expf(b ? v8_load(a + n) - v8_load(b + n) : v8_load(a + n)));
    for (; n < K; n++) dst[n] = expf(b ? a[n] - b[n] : a[n]);
}
/* Buffered key j of a KDA replay: run += g_j (the inclusive prefix G_pre_j), kj *= exp(gtot - run) (w_j * k_j,
 * in place). run repeats the additions that formed gtot in the same order, so w_{h-1} is exactly 1. */
static inline void kda_weight_key(float *kj, float *run, const float *gj, const float *gtot, int K)
{
    int n = 0;
    for (; n + 8 <= K; n += 8) {
        const v8f r = v8_load(run + n) + v8_load(gj + n);
        v8_store(run + n, r);
        v8_store(kj + n, v8_load(kj + n) * v8_expf(v8_load(gtot + n) - r));
    }
    for (; n < K; n++) { run[n] += gj[n]; kj[n] *= expf(gtot[n] - run[n]); }
}

#if defined(__FLT16_MAX__)
#define HAVE_F16 1
typedef _Float16 f16_t;
#else
#define HAVE_F16 0
#endif

/* The program an OpenMP thread runs after (row b, head h) of a collapse(2) static loop over [batch, H]: head
 * h + 1 of the same row, else head 0 of the next row with a live slot (a thread's chunk is contiguous, so this
 * is its next program except at the chunk's end, where it is a neighbour's: a prefetch either way). Returns 0
 * past the batch; else 1 with its slot and head. The kernels prefetch that program's state (prefetch_l2). */
static inline int next_program(const int32_t *slots, int batch, int b, int h, int H, int *slot, int *head)
{
    if (h + 1 < H) { *slot = slots[b]; *head = h + 1; return 1; }
    for (int b2 = b + 1; b2 < batch; b2++)
        if (slots[b2] >= 0) { *slot = slots[b2]; *head = 0; return 1; }
    return 0;
}

/* Prefetch into L2 the bytes at p, or the n rows (origin + j) & (R - 1), j < n, of a ring block of R rows of
 * row_bytes: the history a ReplaySSM step reads besides the state (its buffered x / u rows, its B / k rows) and
 * the ring rows its window is appended to, a program ahead like the state. These rows are too few and too
 * short for the hardware prefetcher to lock onto, so without this they miss to DRAM on every program (the
 * measured cost: replayssm/cpu/README.md). */
static inline void prefetch_bytes_l2(const void *p, size_t bytes)
{
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o, 0, 2);
}
static inline void prefetch_ring_l2(const void *block, int origin, int n, int R, size_t row_bytes)
{
    for (int j = 0; j < n; j++)
        prefetch_bytes_l2((const char *)block + (size_t)((origin + j) & (R - 1)) * row_bytes, row_bytes);
}

int replayssm_cpu_has_fp16(void) { return HAVE_F16; }
int replayssm_cpu_abi(void) { return 1; }

/* Roofline probes (replayssm/cpu/roofline.py): what this machine's cores do at most, measured with the same
 * compiler, flags and OpenMP threads as the kernels. Each returns the seconds of one pass (omp_get_wtime).
 *   read:   a sum over buf[n], the read-only stream of a ReplaySSM readout;
 *   update: buf <- a buf + b in place, the read-modify-write stream of a baseline step or a flush;
 *   fma:    `iters` rounds of 12 independent 8-lane FMA chains per thread, no memory (the compute roof of a
 *           rank-J rebuild). Twelve chains cover the FMA latency on every x86-64 and aarch64 core we know. */
#include <omp.h>
double replayssm_cpu_probe_read(const float *buf, int64_t n, int nt, float *sink)
{
    const double t0 = omp_get_wtime();
    float total = 0.0f;
#pragma omp parallel num_threads(nt) reduction(+:total)
    {
        v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n - n % 32; i += 32) {
            a0 += v8_load(buf + i); a1 += v8_load(buf + i + 8); a2 += v8_load(buf + i + 16); a3 += v8_load(buf + i + 24);
        }
        total += hsum8((a0 + a1) + (a2 + a3));
    }
    *sink = total;
    return omp_get_wtime() - t0;
}

double replayssm_cpu_probe_update(float *buf, int64_t n, int nt)
{
    const double t0 = omp_get_wtime();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < n - n % 16; i += 16) {
        v8_store(buf + i, 0.5f * v8_load(buf + i) + 0.25f);
        v8_store(buf + i + 8, 0.5f * v8_load(buf + i + 8) + 0.25f);
    }
    return omp_get_wtime() - t0;
}

double replayssm_cpu_probe_fma(int64_t iters, int nt, float *sink)
{
    const double t0 = omp_get_wtime();
    float total = 0.0f;
#pragma omp parallel num_threads(nt) reduction(+:total)
    {
        v8f a[12];
        volatile float mv = 0.999f;               /* a runtime multiplier: the chains cannot be folded */
        const v8f m = v8_set1(mv), c = v8_set1(1e-3f);
        for (int i = 0; i < 12; i++) a[i] = v8_set1((float)(i + omp_get_thread_num()));
        for (int64_t k = 0; k < iters; k++)
            for (int i = 0; i < 12; i++) a[i] = a[i] * m + c;
        v8f s = {0};
        for (int i = 0; i < 12; i++) s += a[i];
        total += hsum8(s);
    }
    *sink = total;
    return omp_get_wtime() - t0;
}

/* Loads and stores per storage dtype; build.py appends one `#include "kernels_body.h"` per (state, act)
 * pair with STYPE/LDS/STS (state) and ATYPE/LDA/STA (activations) defined, SUF(name) giving the suffix. */
#define LD_F32(p) (*(p))
#define ST_F32(p, v) (*(p) = (v))
#define LD_F16(p) ((float)*(p))
#define ST_F16(p, v) (*(p) = (f16_t)(v))
#define LD_BF16(p) bf16_load(*(p))
#define ST_BF16(p, v) (*(p) = bf16_store(v))
/* 8 lanes at once (the blocked rebuild): LD8_* returns a v8f, ST8_* stores one */
#define LD8_F32(p) v8_load(p)
#define ST8_F32(p, v) v8_store((p), (v))
#define LD8_BF16(p) v8_load_bf16(p)
#define ST8_BF16(p, v) v8_store_bf16((p), (v))
#if HAVE_F16
typedef _Float16 v8h __attribute__((vector_size(16)));
static inline v8f v8_load_f16(const f16_t *p) { v8h h; memcpy(&h, p, sizeof h); return __builtin_convertvector(h, v8f); }
static inline void v8_store_f16(f16_t *p, v8f v) { const v8h h = __builtin_convertvector(v, v8h); memcpy(p, &h, sizeof h); }
#define LD8_F16(p) v8_load_f16(p)
#define ST8_F16(p, v) v8_store_f16((p), (v))
#endif
