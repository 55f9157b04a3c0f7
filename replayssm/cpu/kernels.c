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
 * replayssm_cpu_has_fp16() returns 0 (the Python side then refuses fp16 with a clear error). A float16_sr /
 * bfloat16_sr state (stochastic rounding) is stored by the AR kernels through the SR store below, bit for bit
 * replayssm/stochastic_rounding.py's sr_round_torch.
 *
 * Conventions: every tensor is contiguous; `slots` is int32 [batch], a negative slot is a padding row
 * (skipped, output untouched); nt = OpenMP threads (the caller passes torch.get_num_threads()).
 */
#include <math.h>
#include <stdint.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
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

/* Stochastic rounding (SR) of the fp32 value a kernel stores into a float16_sr / bfloat16_sr state: the C form of
 * replayssm/stochastic_rounding.py, bit for bit (sr_round_torch is the reference; tests/replayssm/test_cpu_sr_state.py
 * checks it). One uint32 draw per element: element e takes output word e mod 4 of Philox4x32-10 (Salmon et al. 2011)
 * at counter group e >> 2, one call feeding four consecutive elements (the mapping of the Triton kernels, which use
 * all four words of tl.randint4x), with
 *   key     (k0, k1) = (seed, step)          step: the slot's write counter sr_step[slot], mod 2^32
 *   counter (c0, c1, c2, c3) = (e >> 2, slot, 0, 0)   e: the flat index in the slot's [heads, a, b] block (uint32)
 * Ten rounds, each (c0, c1, c2, c3) <- (hi(B c2) ^ c1 ^ k0, lo(B c2), hi(A c0) ^ c3 ^ k1, lo(A c0)) with
 * A = 0xD2511F53, B = 0xCD9E8D57 and 32 x 32 -> 64-bit products, then the key bumped by the Weyl constants
 * (0x9E3779B9, 0xBB67AE85). Rounding of x (NaN -> +0, |x| clamped to the format's largest finite value first):
 *   bf16: bits' = (|x|bits + (r & 0xFFFF)) & 0x7FFF0000, the top half stored;
 *   fp16: |x| = t ulp with ulp = 2^(max(e, -14) - 10), stored q = floor(t) + (r < frac(t) 2^32) ulp.
 * The fp16 rule runs on integers here (exactly what the reference computes in exact arithmetic: no floating
 * point, so no compiler flag can move it): with E the biased fp32 exponent and M the 24-bit significand
 * (|x| = M 2^(max(E, 1) - 150)), t = M / 2^sh, sh = 13 for E >= 113 (fp16 normals), else 126 - max(E, 1)
 * (fp16's subnormal grid 2^-24). floor(t) = M >> sh; frac(t) 2^32 = M << (32 - sh) mod 2^32 for sh <= 32, else
 * M >> (sh - 32), truncated as the reference truncates it. The fp16 bits are then ((max(E, 113) - 113) << 10) + q,
 * a carry of q into bit 10 being the next binade. Neither rule needs _Float16: both write the 16-bit pattern
 * (an fp16 state is still stored only where the compiler has _Float16: its kernels exist only then).
 * `mask` ANDs the draw: 0xFFFFFFFF, or 0 for the deterministic-rounding mutant of the tests (ops.SR_BITS_MASK). */
#define SR_F16 1
#define SR_BF16 2
typedef struct { uint32_t seed, step, slot, mask; int fmt; } sr_ctx;

/* the draw of element e: word e mod 4 of the call at counter (e >> 2, slot) */
static inline uint32_t philox_draw(uint32_t e, uint32_t c1, uint32_t k0, uint32_t k1)
{
    uint32_t c0 = e >> 2, c2 = 0, c3 = 0;
    for (int i = 0; i < 10; i++) {
        const uint64_t pa = (uint64_t)c0 * 0xD2511F53u, pb = (uint64_t)c2 * 0xCD9E8D57u;
        const uint32_t n0 = (uint32_t)(pb >> 32) ^ c1 ^ k0, n2 = (uint32_t)(pa >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)pb; c3 = (uint32_t)pa; c0 = n0; c2 = n2;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    const uint32_t w[4] = {c0, c1, c2, c3};
    return w[e & 3];
}
/* the 16-bit pattern SR stores for fp32 bits u with draw r (fmt SR_F16 or SR_BF16): the scalar form */
static inline uint16_t sr_bits16(uint32_t u, uint32_t r, int fmt)
{
    uint32_t sign = u & 0x80000000u, mag = u & 0x7FFFFFFFu;
    if (mag > 0x7F800000u) { sign = 0; mag = 0; }                              /* NaN -> +0 */
    if (fmt == SR_BF16) {
        mag = mag < 0x7F7F0000u ? mag : 0x7F7F0000u;                           /* inf / beyond max -> max */
        return (uint16_t)((((mag + (r & 0xFFFFu)) & 0x7FFF0000u) >> 16) | (sign >> 16));
    }
    mag = mag < 0x477FE000u ? mag : 0x477FE000u;                               /* 65504 */
    const uint32_t E = mag >> 23, M = E ? (mag & 0x7FFFFFu) | 0x800000u : mag;
    const uint32_t sh = E >= 113 ? 13 : 126 - (E ? E : 1);
    const uint32_t lo = sh < 24 ? M >> sh : 0;
    const uint32_t thr = sh <= 32 ? M << (32 - sh) : (sh < 56 ? M >> (sh - 32) : 0);
    const uint32_t q = lo + (r < thr);
    return (uint16_t)((((E > 113 ? E : 113) - 113) << 10) + q) | (uint16_t)(sign >> 16);
}
/* The draws of 8 consecutive elements e .. e + 7 at once: they span the four-word groups of elements (e & ~3) + 4 l,
 * l = 0, 1, 2 (two when e is a multiple of 4, as every kernel row is), each one call, run as the 4 uint64 lanes of
 * one vector chain, a 32-bit word in the low half of each lane, so every 32 x 32 -> 64-bit product is one lane
 * multiply (vpmuludq on x86; its high word is the product >> 32, its low word the lane as is) and no lane moves
 * until the end. High halves may hold garbage (a product's high word, xored on): the multiply reads only the low
 * halves, and so does the output. The group index is taken after the add (mod 2^32), so the groups wrap as e does. */
typedef uint64_t v4u64 __attribute__((vector_size(32)));
static inline v8u32 v8u32_set1(uint32_t a) { return (v8u32){a, a, a, a, a, a, a, a}; }
static inline v4u64 mul32x4(v4u64 a, uint32_t m)
{
#if defined(__AVX2__)            /* gcc emits a full 64 x 64 multiply (vpmullq) for the generic form */
    return (v4u64)_mm256_mul_epu32((__m256i)a, _mm256_set1_epi64x(m));
#else
    return (a & 0xFFFFFFFFu) * (uint64_t)m;
#endif
}
static inline v8u32 philox8(uint32_t e, uint32_t slot, uint32_t k0, uint32_t k1)
{
    const uint32_t a = e & ~3u;
    v4u64 c0 = {(a >> 2), (uint32_t)(a + 4) >> 2, (uint32_t)(a + 8) >> 2, 0}, c1 = {slot, slot, slot, slot};
    v4u64 c2 = {0, 0, 0, 0}, c3 = {0, 0, 0, 0};
    for (int i = 0; i < 10; i++) {
        const v4u64 pa = mul32x4(c0, 0xD2511F53u), pb = mul32x4(c2, 0xCD9E8D57u);
        c0 = (pb >> 32) ^ c1 ^ (uint64_t)k0;
        c2 = (pa >> 32) ^ c3 ^ (uint64_t)k1;
        c1 = pb;
        c3 = pa;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    uint32_t w[12];                                  /* w[4 l + j]: word j of group l */
    for (int l = 0; l < 3; l++) {
        w[4 * l] = (uint32_t)c0[l]; w[4 * l + 1] = (uint32_t)c1[l];
        w[4 * l + 2] = (uint32_t)c2[l]; w[4 * l + 3] = (uint32_t)c3[l];
    }
    v8u32 r;
    memcpy(&r, w + (e & 3), sizeof r);
    return r;
}
/* sr_bits16 below on 8 lanes (comparisons are lane masks: -1 true, 0 false) */
static inline v8u32 v8u32_sel(v8i32 m, v8u32 a, v8u32 b) { return ((v8u32)m & a) | (~(v8u32)m & b); }
static inline v8u32 sr_bits8(v8u32 u, v8u32 r, int fmt)
{
    const v8i32 nan = (v8i32)(u & 0x7FFFFFFFu) > 0x7F800000;
    v8u32 sign = u & 0x80000000u & ~(v8u32)nan, mag = u & 0x7FFFFFFFu & ~(v8u32)nan;
    if (fmt == SR_BF16) {
        mag = v8u32_sel((v8i32)mag > 0x7F7F0000, v8u32_set1(0x7F7F0000u), mag);
        return (((mag + (r & 0xFFFFu)) & 0x7FFF0000u) >> 16) | (sign >> 16);
    }
    mag = v8u32_sel((v8i32)mag > 0x477FE000, v8u32_set1(0x477FE000u), mag);
    const v8u32 E = mag >> 23, E1 = E - (v8u32)(E == 0);                      /* max(E, 1) */
    const v8u32 M = (mag & 0x7FFFFFu) | ((v8u32)(E != 0) & 0x800000u);
    const v8i32 normal = (v8i32)E >= 113;
    const v8u32 sh = v8u32_sel(normal, v8u32_set1(13), 126 - E1);            /* 13 .. 125 */
    const v8u32 rs = v8u32_sel((v8i32)sh > 31, v8u32_set1(31), sh);          /* M < 2^24: >> 31 is 0 */
    const v8u32 lo = M >> rs;
    const v8u32 down = sh - 32, downc = v8u32_sel((v8i32)sh > 63, v8u32_set1(31), down & 31);
    const v8u32 thr = v8u32_sel((v8i32)sh <= 32, M << ((32 - sh) & 31), M >> downc);
    const v8u32 q = lo - (v8u32)(r < thr);
    return (((v8u32_sel(normal, E, v8u32_set1(113)) - 113) << 10) + q) | (sign >> 16);
}
static inline sr_ctx sr_make(uint32_t seed, int32_t step, int slot, uint32_t mask, int fmt)
{
    const sr_ctx c = {seed, (uint32_t)step, (uint32_t)slot, mask, fmt};
    return c;
}
/* store v (8 fp32 lanes, elements e .. e + 7 of the slot's block) / one value into a 16-bit state */
static inline void sr_store8(void *p, const float *v, const sr_ctx *c, uint32_t e)
{
    v8u32 u;
    memcpy(&u, v, sizeof u);
    const v8u16 h = __builtin_convertvector(sr_bits8(u, philox8(e, c->slot, c->seed, c->step) & c->mask, c->fmt),
                                            v8u16);
    memcpy(p, &h, sizeof h);
}
static inline void sr_store1(void *p, float v, const sr_ctx *c, uint32_t e)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    const uint16_t h = sr_bits16(u, philox_draw(e, c->slot, c->seed, c->step) & c->mask, c->fmt);
    memcpy(p, &h, 2);
}

/* The raw rule for the tests: out[i, j] = SR(x[i, j]) as 16-bit patterns, row i drawn with slot slots[i] at step
 * steps[i], element j (x, out [rows, n] contiguous); the first n - n % 8 elements through the 8-lane path, the rest
 * through the scalar one, as a kernel's rows are. replayssm_cpu_philox: the draws themselves. */
void replayssm_cpu_sr_round(const float *x, uint16_t *out, const int32_t *slots, const int32_t *steps, int rows,
                            int64_t n, uint32_t seed, uint32_t mask, int fmt)
{
    for (int i = 0; i < rows; i++) {
        const sr_ctx c = sr_make(seed, steps[i], slots[i], mask, fmt);
        const float *xi = x + (size_t)i * n;
        uint16_t *oi = out + (size_t)i * n;
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) sr_store8(oi + j, xi + j, &c, (uint32_t)j);
        for (; j < n; j++) sr_store1(oi + j, xi[j], &c, (uint32_t)j);
    }
}
void replayssm_cpu_philox(uint32_t *out, int64_t n, uint32_t e0, uint32_t slot, uint32_t seed, uint32_t step)
{
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const v8u32 r = philox8(e0 + (uint32_t)j, slot, seed, step);
        memcpy(out + j, &r, sizeof r);
    }
    for (; j < n; j++) out[j] = philox_draw(e0 + (uint32_t)j, slot, seed, step);
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
int replayssm_cpu_abi(void) { return 2; }   /* 2: the AR kernels take sr_step, sr_seed, sr_mask */

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
