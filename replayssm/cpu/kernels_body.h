/* Kernel bodies, included once per (state dtype, activation dtype) pair by the source build.py generates.
 * STYPE / LDS / STS: state storage; ATYPE / LDA / STA: activation storage; SUF(name) names the variant.
 * Shapes are in the docstrings of the ctypes wrappers (replayssm/cpu/ops.py) and the public APIs they serve. */

#include "sr_body.h"     /* st8 / st1: the state stores, plain or stochastically rounded; sr_of */

/* Row primitives. A reduction over a [N] row with one accumulator is bound by the FMA latency chain, which can
 * be slower than one core's DRAM stream, so rows whose length is a multiple of 16 use two independent 8-lane
 * accumulators; other lengths take the plain loop. */
static inline float SUF(dot_row)(const STYPE *row, const float *c, int N)
{
    if (N % 16 == 0) {
        v8f a0 = {0}, a1 = {0};
        for (int n = 0; n < N; n += 16) { a0 += LDS8(row + n) * v8_load(c + n); a1 += LDS8(row + n + 8) * v8_load(c + n + 8); }
        return hsum8(a0 + a1);
    }
    float acc = 0.0f;
    for (int n = 0; n < N; n++) acc += LDS(row + n) * c[n];
    return acc;
}

/* (row . k, row . q) in one read of the row */
static inline void SUF(dot2_row)(const STYPE *row, const float *k, const float *q, int N, float *rk, float *rq)
{
    if (N % 16 == 0) {
        v8f a0 = {0}, a1 = {0}, c0 = {0}, c1 = {0};
        for (int n = 0; n < N; n += 16) {
            const v8f t0 = LDS8(row + n), t1 = LDS8(row + n + 8);
            a0 += t0 * v8_load(k + n); a1 += t1 * v8_load(k + n + 8);
            c0 += t0 * v8_load(q + n); c1 += t1 * v8_load(q + n + 8);
        }
        *rk = hsum8(a0 + a1); *rq = hsum8(c0 + c1);
        return;
    }
    float a = 0.0f, c = 0.0f;
    for (int n = 0; n < N; n++) { const float t = LDS(row + n); a += t * k[n]; c += t * q[n]; }
    *rk = a; *rq = c;
}

/* Prefetch one state row of N into L2 (not L1: a head of state is 32-64 KiB). Every kernel walks the state
 * of the program its thread runs next (next_program, kernels.c) one row per row of the current one, so the
 * DRAM stream runs a whole head ahead of the loads that use it: a head's compute (the verify's 2T dot
 * products per element, a flush's rank-J update) then overlaps the next head's misses instead of waiting on
 * them, and the dozen small input / output / ring streams a spec program touches cannot take the hardware
 * prefetcher off the state stream. */
static inline void SUF(prefetch_l2)(const STYPE *row, int N)
{
    for (int n = 0; n < N; n += 64 / (int)sizeof(STYPE)) __builtin_prefetch(row + n, 0, 2);
}

/* out[r] = scale * (S_r . c) for R rows of N, one row after the other (pf: the next program's rows, or NULL).
 * The order matters more than the arithmetic: rows walked in address order are one sequential stream, which
 * the hardware prefetcher follows at the read bandwidth of the core; walking several rows side by side makes
 * short streams of N * 4 bytes each that it does not lock onto (measured much slower: replayssm/cpu/README.md).
 * Consecutive rows are independent, so the out-of-order core overlaps one row's reduction with the next
 * row's loads. */
static inline void SUF(dot_rows)(const STYPE *S, int64_t rs, int R, int N, const float *c, float scale, float *out,
                                 const STYPE *pf)
{
    for (int r = 0; r < R; r++) {
        if (pf) SUF(prefetch_l2)(pf + r * rs, N);
        out[r] = scale * SUF(dot_row)(S + r * rs, c, N);
    }
}

/* row <- a row + xd B (stored; SR with sr, e the row's first element), returns the new row . C: one read and one
 * write of the row */
static inline float SUF(ssu_row)(STYPE *row, int N, float a, float xd, const float *Bv, const float *Cv,
                                 const sr_ctx *sr, uint32_t e)
{
    if (N % 16 == 0) {
        v8f a0 = {0}, a1 = {0};
        for (int n = 0; n < N; n += 16) {
            const v8f v0 = a * LDS8(row + n) + xd * v8_load(Bv + n);
            const v8f v1 = a * LDS8(row + n + 8) + xd * v8_load(Bv + n + 8);
            SUF(st8)(row + n, v0, sr, e + n); SUF(st8)(row + n + 8, v1, sr, e + n + 8);
            a0 += v0 * v8_load(Cv + n); a1 += v1 * v8_load(Cv + n + 8);
        }
        return hsum8(a0 + a1);
    }
    float acc = 0.0f;
    for (int n = 0; n < N; n++) { const float v = a * LDS(row + n) + xd * Bv[n]; SUF(st1)(row + n, v, sr, e + n); acc += v * Cv[n]; }
    return acc;
}

/* GDN recurrent row: r = alpha row; u = beta (v - r . k); row <- r + u k (stored); returns row . q.
 * av: NULL for GDN's scalar decay alpha; else KDA's per-column decays [K] (r = av * row, alpha unused). gdn_step
 * calls it (through gdn_rows, sr_body.h) with a literal NULL and with av, so each inlined copy keeps one form. */
static inline float SUF(gdn_row)(STYPE *row, int K, float alpha, const float *av, float bt, float vi,
                                 const float *kv, const float *qv, const sr_ctx *sr, uint32_t e)
{
    if (K % 16 == 0 && K <= MAXV) {
        v8f r[MAXV / 8];
        v8f a0 = {0}, a1 = {0};
        for (int n = 0; n < K; n += 16) {
            if (av) { r[n / 8] = v8_load(av + n) * LDS8(row + n); r[n / 8 + 1] = v8_load(av + n + 8) * LDS8(row + n + 8); }
            else { r[n / 8] = alpha * LDS8(row + n); r[n / 8 + 1] = alpha * LDS8(row + n + 8); }
            a0 += r[n / 8] * v8_load(kv + n); a1 += r[n / 8 + 1] * v8_load(kv + n + 8);
        }
        const float u = bt * (vi - hsum8(a0 + a1));
        v8f o0 = {0}, o1 = {0};
        for (int n = 0; n < K; n += 16) {
            const v8f t0 = r[n / 8] + u * v8_load(kv + n), t1 = r[n / 8 + 1] + u * v8_load(kv + n + 8);
            SUF(st8)(row + n, t0, sr, e + n); SUF(st8)(row + n + 8, t1, sr, e + n + 8);
            o0 += t0 * v8_load(qv + n); o1 += t1 * v8_load(qv + n + 8);
        }
        return hsum8(o0 + o1);
    }
    float r[K];
    float sk = 0.0f;
    for (int n = 0; n < K; n++) { r[n] = (av ? av[n] : alpha) * LDS(row + n); sk += r[n] * kv[n]; }
    const float u = bt * (vi - sk);
    float o = 0.0f;
    for (int n = 0; n < K; n++) { const float t = r[n] + u * kv[n]; SUF(st1)(row + n, t, sr, e + n); o += t * qv[n]; }
    return o;
}

/* The end of a Mamba-2 readout of one (row, head, token): y += D x, y *= silu(z), stored to out. y, x, z, out
 * [P]; D NULL or [H]; z NULL for no gate. */
static inline void SUF(m2_finish)(float *y, const ATYPE *x, const ATYPE *z, const float *D, int h, ATYPE *out, int P)
{
    if (D)
        for (int p = 0; p < P; p++) y[p] += D[h] * LDA(x + p);
    if (z) {
        float zf[P];
        for (int p = 0; p < P; p++) zf[p] = LDA(z + p);
        silu_gate(y, zf, P);
    }
    for (int p = 0; p < P; p++) STA(out + p, y[p]);
}

/* ------------------------------------------------------------------------------------------ Mamba-2 AR */

/* Baseline selective state update: per (row, head) S <- exp(A dt) S + dt x B^T; y = S C + D x, * silu(z).
 * The state is read once and written once. sr_step (NULL: a plain format): a float16_sr / bfloat16_sr state, the
 * write rounded stochastically with key (sr_seed, sr_step[slot]) and counter (slot, the element's flat index in the
 * slot's [H, P, N] block), and every live row's counter advanced by one after the loop; sr_mask ANDs the draws
 * (0xFFFFFFFF; 0: the tests' deterministic mutant). Every AR kernel below takes the same three arguments. */
void SUF(m2_ssu)(STYPE *state, const ATYPE *x, const float *dt, const float *A, const ATYPE *Bm, const ATYPE *Cm,
                 const float *D, const ATYPE *z, const float *dt_bias, int softplus, ATYPE *out,
                 const int32_t *slots, int batch, int H, int P, int N, int G, int64_t ss0, int64_t ss1,
                 int64_t ss2, int32_t *sr_step, uint32_t sr_seed, uint32_t sr_mask, int nt)
{
    const int hpg = H / G;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
    for (int b = 0; b < batch; b++) {
        for (int h = 0; h < H; h++) {
            const int s = slots[b];
            if (s < 0) continue;
            const int g = h / hpg;
            float Bv[N], Cv[N];
            const ATYPE *Bp = Bm + ((size_t)b * G + g) * N, *Cp = Cm + ((size_t)b * G + g) * N;
            for (int n = 0; n < N; n++) { Bv[n] = LDA(Bp + n); Cv[n] = LDA(Cp + n); }
            float d = dt[(size_t)b * H + h] + (dt_bias ? dt_bias[h] : 0.0f);
            if (softplus) d = softplus_f(d);
            const float a = expf(A[h] * d);
            sr_ctx sbuf;
            const sr_ctx *sr = SUF(sr_of)(&sbuf, sr_step, sr_seed, sr_mask, s);
            STYPE *S = state + s * ss0 + h * ss1;
            int s2, h2;
            const STYPE *pf = next_program(slots, batch, b, h, H, &s2, &h2) ? state + s2 * ss0 + h2 * ss1 : NULL;
            const size_t io = ((size_t)b * H + h) * P;
            float yv[P];
            const uint32_t e0 = (uint32_t)((size_t)h * P * N);
            if (sr) SUF(ssu_rows)(S, pf, P, N, ss2, a, d, x + io, Bv, Cv, yv, sr, e0);
            else SUF(ssu_rows)(S, pf, P, N, ss2, a, d, x + io, Bv, Cv, yv, NULL, 0);
            SUF(m2_finish)(yv, x + io, z ? z + io : NULL, D, h, out + io, P);
        }
    }
    if (SR_FMT && sr_step)          /* every live row wrote its slot: its counter moves, after every program read it */
        for (int b = 0; b < batch; b++)
            if (slots[b] >= 0) sr_step[slots[b]]++;
}

/* The rebuild of state rows shared by the Mamba-2 state-and-output route / flush and the GDN flush:
 *   row_r <- scale * S_r + sum_{j<J} X[j, r] * Y[j, :]      (r < R rows of N, row stride rs)
 * stored into S when `store`; with Cv, yout[r] = row_r . Cv. A register-blocked rank-J update over one row at a
 * time: a tile is REBUILD_COLS contiguous columns of one row held in REBUILD_COLS / 8 vector accumulators; per
 * buffered token j it costs one broadcast of X[j, r] and REBUILD_COLS / 8 loads of Y[j] (an L1-resident [J, N]
 * block) folded into as many FMAs. 64 columns = 8 independent FMA chains, enough to cover the FMA latency
 * with registers to spare on AVX2. Rows are walked in address order, so the state streams sequentially (a
 * tile of several rows would read interleaved short streams the prefetcher does not follow; measured slower,
 * replayssm/cpu/README.md). Every S element is read (and written) once. Columns past the last full 64-wide tile
 * go 16 at a time; N not a multiple of 16: the plain loop.
 * rebuild_rows_cs takes a per-column scale cs [N] instead (row_r <- S_r * cs + ...: KDA's flush, whose decay is
 * per key channel); rebuild_rows is it with cs = NULL, so Mamba-2's and GDN's calls keep the scalar form.
 * rebuild_rows_sr is rebuild_rows_cs storing through st8 / st1: sr non-NULL rounds the stored rows stochastically
 * (the AR flushes of a float16_sr / bfloat16_sr checkpoint), row r's element n being e0 + r N + n of the slot. */
#define REBUILD_COLS 64
static inline void SUF(rebuild_tile)(STYPE *row, int r, int R, int n0, int W, float scale, const float *cs,
                                     const float *X, const float *Y, int N, int J, int store, const float *Cv,
                                     v8f *yacc, const sr_ctx *sr, uint32_t e)
{
    v8f acc[REBUILD_COLS / 8];
    const int nv = W / 8;
    if (cs)
        for (int k = 0; k < nv; k++) acc[k] = v8_load(cs + n0 + 8 * k) * LDS8(row + n0 + 8 * k);
    else
        for (int k = 0; k < nv; k++) acc[k] = scale * LDS8(row + n0 + 8 * k);
    for (int j = 0; j < J; j++) {
        const float xv = X[(size_t)j * R + r];
        const float *y = Y + (size_t)j * N + n0;
        for (int k = 0; k < nv; k++) acc[k] += xv * v8_load(y + 8 * k);
    }
    if (store)
        for (int k = 0; k < nv; k++) SUF(st8)(row + n0 + 8 * k, acc[k], sr, e + n0 + 8 * k);
    if (Cv)
        for (int k = 0; k < nv; k++) *yacc += acc[k] * v8_load(Cv + n0 + 8 * k);
}

static inline void SUF(rebuild_rows_sr)(STYPE *S, int64_t rs, int R, int N, float scale, const float *cs,
                                        const float *X, const float *Y, int J, int store, const float *Cv,
                                        float *yout, const STYPE *pf, const sr_ctx *sr, uint32_t e0)
{
    if (N % 16 == 0) {
        for (int r = 0; r < R; r++) {
            STYPE *row = S + r * rs;
            if (pf) SUF(prefetch_l2)(pf + r * rs, N);
            v8f yacc = {0};
            int n0 = 0;
            /* constant widths, so each call unrolls fully into registers */
            for (; n0 + REBUILD_COLS <= N; n0 += REBUILD_COLS)
                SUF(rebuild_tile)(row, r, R, n0, REBUILD_COLS, scale, cs, X, Y, N, J, store, Cv, &yacc, sr,
                                  e0 + (uint32_t)r * N);
            for (; n0 < N; n0 += 16)
                SUF(rebuild_tile)(row, r, R, n0, 16, scale, cs, X, Y, N, J, store, Cv, &yacc, sr, e0 + (uint32_t)r * N);
            if (yout) yout[r] = hsum8(yacc);
        }
        return;
    }
    float r[N];
    for (int i = 0; i < R; i++) {
        STYPE *row = S + i * rs;
        if (pf) SUF(prefetch_l2)(pf + i * rs, N);
        for (int n = 0; n < N; n++) r[n] = (cs ? cs[n] : scale) * LDS(row + n);
        for (int j = 0; j < J; j++) {
            const float xv = X[(size_t)j * R + i];
            const float *y = Y + (size_t)j * N;
            for (int n = 0; n < N; n++) r[n] += xv * y[n];
        }
        float t = 0.0f;
        for (int n = 0; n < N; n++) {
            if (store) SUF(st1)(row + n, r[n], sr, e0 + (uint32_t)i * N + n);
            t += r[n] * (Cv ? Cv[n] : 0.0f);
        }
        if (yout) yout[i] = t;
    }
}

static inline void SUF(rebuild_rows_cs)(STYPE *S, int64_t rs, int R, int N, float scale, const float *cs,
                                        const float *X, const float *Y, int J, int store, const float *Cv,
                                        float *yout, const STYPE *pf)
{
    SUF(rebuild_rows_sr)(S, rs, R, N, scale, cs, X, Y, J, store, Cv, yout, pf, NULL, 0);
}

static inline void SUF(rebuild_rows)(STYPE *S, int64_t rs, int R, int N, float scale, const float *X,
                                     const float *Y, int J, int store, const float *Cv, float *yout, const STYPE *pf)
{
    SUF(rebuild_rows_cs)(S, rs, R, N, scale, NULL, X, Y, J, store, Cv, yout, pf);
}

/* ReplaySSM AR step (replayssm/mamba2/decode.py has the protocol). Per (row, head) with h = write_pos:
 *   c_j inclusive prefix of the cached dt, c_tot = sum_{j<h} dt_j + dt, s_j = dt_j exp(A (c_tot - c_j)),
 *   abar = exp(A c_tot).
 *   normal, output_only (route 0): y = abar (S0 C) + sum_j s_j (B_j . C) x_j + dt (B . C) x: S0 read once;
 *   normal, state_and_output (1): each state row S_t = abar S0 + sum_j s_j x_j B_j + dt x B, y = S_t C;
 *   flush (h >= L-1): the state_and_output row, stored into the checkpoint (the only state write).
 * Normal rows append x, dt (processed) and B (by the group's first head) at buffer row h; then the cursors
 * advance in a second loop (after every program has read them). */
void SUF(m2_replay)(STYPE *state, ATYPE *xc, ATYPE *Bc, float *dtc, int32_t *wp, float *bcs,
                    const ATYPE *x, const float *dt, const float *A, const ATYPE *Bm, const ATYPE *Cm,
                    const float *D, const ATYPE *z, const float *dt_bias, int softplus, ATYPE *out,
                    const int32_t *slots, int batch, int H, int P, int N, int G, int L, int route,
                    int32_t *sr_step, uint32_t sr_seed, uint32_t sr_mask, int nt)
{
    const int hpg = H / G;
    if (route == 0) {
        /* B_j . C once per (row, group) into the bc scratch [S, G, L] (every head of the group shares it) */
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
        for (int b = 0; b < batch; b++) {
            for (int g = 0; g < G; g++) {
                const int s = slots[b];
                if (s < 0 || wp[s] >= L - 1) continue;
                float Cv[N];
                const ATYPE *Cp = Cm + ((size_t)b * G + g) * N;
                for (int n = 0; n < N; n++) Cv[n] = LDA(Cp + n);
                const ATYPE *Bs = Bc + ((size_t)s * G + g) * (size_t)L * N;
                for (int j = 0; j < wp[s]; j++) {
                    float acc = 0.0f;
#pragma omp simd reduction(+:acc)
                    for (int n = 0; n < N; n++) acc += LDA(Bs + (size_t)j * N + n) * Cv[n];
                    bcs[((size_t)s * G + g) * L + j] = acc;
                }
            }
        }
    }
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
    for (int b = 0; b < batch; b++) {
        for (int h = 0; h < H; h++) {
            const int s = slots[b];
            if (s < 0) continue;
            const int g = h / hpg;
            const int hp = wp[s];
            const int flush = hp >= L - 1;
            const int nj = hp < L - 1 ? hp : L - 1;
            const ATYPE *Bp = Bm + ((size_t)b * G + g) * N, *Cp = Cm + ((size_t)b * G + g) * N;
            float Bv[N], Cv[N];
            for (int n = 0; n < N; n++) { Bv[n] = LDA(Bp + n); Cv[n] = LDA(Cp + n); }
            float d = dt[(size_t)b * H + h] + (dt_bias ? dt_bias[h] : 0.0f);
            if (softplus) d = softplus_f(d);
            const float Ah = A[h];
            float *dts = dtc + ((size_t)s * H + h) * L;
            ATYPE *xs = xc + ((size_t)s * H + h) * (size_t)L * P;
            ATYPE *Bs = Bc + ((size_t)s * G + g) * (size_t)L * N;
            float c[MAXL], sw[MAXL];
            float run = 0.0f;
            for (int j = 0; j < nj; j++) { run += dts[j]; c[j] = run; }
            const float c_tot = run + d, abar = expf(Ah * c_tot);
            for (int j = 0; j < nj; j++) sw[j] = dts[j] * expf(Ah * (c_tot - c[j]));
            STYPE *S = state + ((size_t)s * H + h) * (size_t)P * N;
            int s2, h2;
            const STYPE *pf = next_program(slots, batch, b, h, H, &s2, &h2)
                                  ? state + ((size_t)s2 * H + h2) * (size_t)P * N : NULL;
            if (pf) {
                const int nj2 = wp[s2] < L - 1 ? wp[s2] : L - 1;
                prefetch_bytes_l2(xc + ((size_t)s2 * H + h2) * (size_t)L * P, (size_t)nj2 * P * sizeof(ATYPE));
                if (h2 % hpg == 0 && (route != 0 || wp[s2] >= L - 1))
                    prefetch_bytes_l2(Bc + ((size_t)s2 * G + h2 / hpg) * (size_t)L * N, (size_t)nj2 * N * sizeof(ATYPE));
            }
            const size_t io = ((size_t)b * H + h) * P;
            float yv[P];
            if (!flush && route == 0) {
                float bc[MAXL];
                float bcur = 0.0f;
                for (int j = 0; j < nj; j++) bc[j] = sw[j] * bcs[((size_t)s * G + g) * L + j];
#pragma omp simd reduction(+:bcur)
                for (int n = 0; n < N; n++) bcur += Bv[n] * Cv[n];
                SUF(dot_rows)(S, N, P, N, Cv, abar, yv, pf);
                for (int p = 0; p < P; p++) yv[p] += d * bcur * LDA(x + io + p);
                for (int j = 0; j < nj; j++) {
                    const ATYPE *xj = xs + (size_t)j * P;
                    const float cj = bc[j];
#pragma omp simd
                    for (int p = 0; p < P; p++) yv[p] += cj * LDA(xj + p);
                }
            } else {
                /* rows S_t = abar S0 + X^T Y with X[j, p] = s_j x_j[p] (current token: dt x), Y[j] = B_j */
                float Xm[(nj + 1) * P], Ym[(nj + 1) * N];
                for (int j = 0; j < nj; j++) {
                    for (int p = 0; p < P; p++) Xm[(size_t)j * P + p] = sw[j] * LDA(xs + (size_t)j * P + p);
                    for (int n = 0; n < N; n++) Ym[(size_t)j * N + n] = LDA(Bs + (size_t)j * N + n);
                }
                for (int p = 0; p < P; p++) Xm[(size_t)nj * P + p] = d * LDA(x + io + p);
                for (int n = 0; n < N; n++) Ym[(size_t)nj * N + n] = Bv[n];
                sr_ctx sbuf;          /* the flush's store: SR on a float16_sr / bfloat16_sr checkpoint */
                const sr_ctx *sr = flush ? SUF(sr_of)(&sbuf, sr_step, sr_seed, sr_mask, s) : NULL;
                SUF(rebuild_rows_sr)(S, N, P, N, abar, NULL, Xm, Ym, nj + 1, flush, Cv, yv, pf, sr,
                                     (uint32_t)((size_t)h * P * N));
            }
            SUF(m2_finish)(yv, x + io, z ? z + io : NULL, D, h, out + io, P);
            if (!flush) {
                memcpy(xs + (size_t)hp * P, x + io, (size_t)P * sizeof(ATYPE));
                dts[hp] = d;
                if (h % hpg == 0) memcpy(Bs + (size_t)hp * N, Bp, (size_t)N * sizeof(ATYPE));
            }
        }
    }
    for (int b = 0; b < batch; b++) {
        const int s = slots[b];
        if (s < 0) continue;
        if (SR_FMT && sr_step && wp[s] >= L - 1) sr_step[s]++;         /* a flush wrote the slot */
        wp[s] = wp[s] >= L - 1 ? 0 : wp[s] + 1;
    }
}

/* ---------------------------------------------------------------------------------------------- GDN AR */

/* q, k of key head hk for row b, fp32, L2-normalised when asked, q scaled. */
static inline void SUF(gdn_qk)(const ATYPE *q, const ATYPE *k, size_t off, int K, int l2norm, float scale,
                               float *qv, float *kv)
{
    float sq = 0.0f, sk = 0.0f;
    for (int n = 0; n < K; n++) { qv[n] = LDA(q + off + n); kv[n] = LDA(k + off + n); sq += qv[n] * qv[n]; sk += kv[n] * kv[n]; }
    const float fq = (l2norm ? 1.0f / sqrtf(sq + 1e-6f) : 1.0f) * scale, fk = l2norm ? 1.0f / sqrtf(sk + 1e-6f) : 1.0f;
    for (int n = 0; n < K; n++) { qv[n] *= fq; kv[n] *= fk; }
}

/* Baseline fused recurrent step: per (row, value head), each state row [K]: r = exp(g) S_i; u = beta (v_i - r.k);
 * S_i <- r + u k; o_i = S_i . q. One read and one write of the state.
 * pc = 0: GDN, g [batch, HV] one decay per head. pc = 1: KDA, g [batch, HV, K] one decay per key channel, so
 * r = S_i * exp(g) column-wise (the K exps once per program, 8 lanes at a time). */
void SUF(gdn_step)(STYPE *state, const ATYPE *q, const ATYPE *k, const ATYPE *v, const float *g, const float *beta,
                   float scale, int l2norm, ATYPE *out, const int32_t *slots, int batch, int H, int HV, int K, int V,
                   int64_t ss0, int64_t ss1, int64_t ss2, int pc, int32_t *sr_step, uint32_t sr_seed,
                   uint32_t sr_mask, int nt)
{
    const int gq = HV / H;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
    for (int b = 0; b < batch; b++) {
        for (int hv = 0; hv < HV; hv++) {
            const int s = slots[b];
            if (s < 0) continue;
            float qv[K], kv[K], av[pc ? K : 1];
            SUF(gdn_qk)(q, k, ((size_t)b * H + hv / gq) * K, K, l2norm, scale, qv, kv);
            const float alpha = pc ? 1.0f : expf(g[(size_t)b * HV + hv]), bt = beta[(size_t)b * HV + hv];
            if (pc) vexp_sub(av, g + ((size_t)b * HV + hv) * K, NULL, K);
            sr_ctx sbuf;
            const sr_ctx *sr = SUF(sr_of)(&sbuf, sr_step, sr_seed, sr_mask, s);
            const uint32_t e0 = (uint32_t)((size_t)hv * V * K);
            STYPE *S = state + s * ss0 + hv * ss1;
            int s2, h2;
            const STYPE *pf = next_program(slots, batch, b, hv, HV, &s2, &h2) ? state + s2 * ss0 + h2 * ss1 : NULL;
            const size_t io = ((size_t)b * HV + hv) * V;
            /* four copies: GDN's inlines gdn_row with a literal NULL av (its scalar form), the plain store with a
             * literal NULL sr */
            if (pc && sr) SUF(gdn_rows)(S, pf, V, K, ss2, alpha, av, bt, v + io, out + io, kv, qv, sr, e0);
            else if (pc) SUF(gdn_rows)(S, pf, V, K, ss2, alpha, av, bt, v + io, out + io, kv, qv, NULL, 0);
            else if (sr) SUF(gdn_rows)(S, pf, V, K, ss2, alpha, NULL, bt, v + io, out + io, kv, qv, sr, e0);
            else SUF(gdn_rows)(S, pf, V, K, ss2, alpha, NULL, bt, v + io, out + io, kv, qv, NULL, 0);
        }
    }
    if (SR_FMT && sr_step)          /* every live row wrote its slot: its counter moves, after every program read it */
        for (int b = 0; b < batch; b++)
            if (slots[b] >= 0) sr_step[slots[b]]++;
}

/* ReplaySSM GDN AR step (replayssm/gdn/decode.py has the protocol). Per (row, value head), h = write_pos:
 *   G_pre_j inclusive prefix of the cached g, G_tot = sum_{j<h} g_j, w_j = exp(G_tot - G_pre_j), d0 = exp(G_tot)
 *   S_h x = d0 (S0 x) + sum_j w_j (k_j . x) u_j  for x in {k, q}: one pass over S0 with two dot products,
 *   u = beta (v - alpha S_h k), o = alpha S_h q + u (k . q).
 *   normal (h < L-1): append (u, k, g) at h; the checkpoint is not written.
 *   flush: each row S0_i <- alpha d0 S0_i + sum_j alpha w_j u_j,i k_j + u_i k, written once, right after its read.
 * pc = 1 is KDA (replayssm/kda/decode.py): g [batch, HV, K] and the cached g [S, HV, L, K] hold a decay per key
 * channel, so G, w_j, d0 and alpha are K-vectors (products below elementwise):
 *   S_h x = S0 (d0 * x) + sum_j ((w_j * k_j) . x) u_j,  u = beta (v - S_h (alpha * k)),  o = S_h (alpha * q) + u (k . q)
 * alpha and d0 fold into the two vectors each S0 row is dotted with (d0 * alpha * k, d0 * alpha * q), so the row
 * loop is GDN's one pass (its scalar alpha, d0 become 1); the flush scales the rows per column,
 *   S0_i <- S0_i * (alpha * d0) + sum_j u_j,i (alpha * w_j * k_j) + u_i k   (rebuild_rows_cs).
 * The exps cost (h + 2) K per program (vector expf) where GDN's cost h + 2 libm expf; pc = 0 takes none of them. */
void SUF(gdn_replay)(STYPE *state, ATYPE *uc, ATYPE *kc, float *gc, int32_t *wp,
                     const ATYPE *q, const ATYPE *k, const ATYPE *v, const float *g, const float *beta,
                     float scale, int l2norm, ATYPE *out, const int32_t *slots, int batch, int H, int HV, int K,
                     int V, int L, int pc, int32_t *sr_step, uint32_t sr_seed, uint32_t sr_mask, int nt)
{
    const int gq = HV / H;
    const int gK = pc ? K : 1;     /* floats of g per (head, token) */
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
    for (int b = 0; b < batch; b++) {
        for (int hv = 0; hv < HV; hv++) {
            const int s = slots[b];
            if (s < 0) continue;
            const int hk = hv / gq;
            const int hp = wp[s];
            const int flush = hp >= L - 1;
            const int nj = hp < L - 1 ? hp : L - 1;
            float qv[K], kv[K], bk[V], bq[V], Kl[(nj + 1) * K];
            /* KDA only (one float each for GDN): alpha, alpha * k, alpha * q, G_tot then alpha * d0, the running
             * prefix, and the row vectors d0 * alpha * k, d0 * alpha * q */
            float kda_buf[7 * gK];
            float *av = kda_buf, *ka = av + gK, *qa = ka + gK, *gtot = qa + gK, *run_v = gtot + gK, *kd = run_v + gK,
                  *qd = kd + gK;
            SUF(gdn_qk)(q, k, ((size_t)b * H + hk) * K, K, l2norm, scale, qv, kv);
            const float *gt = g + ((size_t)b * HV + hv) * gK;
            const float alpha = pc ? 1.0f : expf(gt[0]), bt = beta[(size_t)b * HV + hv];
            ATYPE *us = uc + ((size_t)s * HV + hv) * (size_t)L * V;
            ATYPE *ks = kc + ((size_t)s * H + hk) * (size_t)L * K;
            float *gs = gc + ((size_t)s * HV + hv) * (size_t)L * gK;
            int s2, h2;
            const STYPE *pf = next_program(slots, batch, b, hv, HV, &s2, &h2)
                                  ? state + ((size_t)s2 * HV + h2) * (size_t)V * K : NULL;
            if (pf) {   /* the next program's buffered u (and k, by its key head's first value head; KDA: its g) */
                const int nj2 = wp[s2] < L - 1 ? wp[s2] : L - 1;
                prefetch_bytes_l2(uc + ((size_t)s2 * HV + h2) * (size_t)L * V, (size_t)nj2 * V * sizeof(ATYPE));
                if (h2 % gq == 0)
                    prefetch_bytes_l2(kc + ((size_t)s2 * H + h2 / gq) * (size_t)L * K, (size_t)nj2 * K * sizeof(ATYPE));
                if (pc)
                    prefetch_bytes_l2(gc + ((size_t)s2 * HV + h2) * (size_t)L * K, (size_t)nj2 * K * sizeof(float));
            }
            float Gp[MAXL], w[MAXL];
            float run = 0.0f, d0 = 1.0f;
            if (pc) {
                vexp_sub(av, gt, NULL, K);
                for (int n = 0; n < K; n++) { ka[n] = av[n] * kv[n]; qa[n] = av[n] * qv[n]; gtot[n] = 0.0f; run_v[n] = 0.0f; }
                for (int j = 0; j < nj; j++)
                    for (int n = 0; n < K; n++) gtot[n] += gs[(size_t)j * K + n];
                vexp_sub(kd, gtot, NULL, K);                   /* d0 */
                for (int n = 0; n < K; n++) { qd[n] = kd[n] * qa[n]; kd[n] *= ka[n]; }
            } else {
                for (int j = 0; j < nj; j++) { run += gs[j]; Gp[j] = run; }
                d0 = expf(run);
                for (int j = 0; j < nj; j++) w[j] = expf(run - Gp[j]);
            }
            float kq = 0.0f;
            for (int n = 0; n < K; n++) kq += kv[n] * qv[n];
            for (int i = 0; i < V; i++) { bk[i] = 0.0f; bq[i] = 0.0f; }
            for (int j = 0; j < nj; j++) {
                float dk = 0.0f, dq = 0.0f;
                float *kj = Kl + (size_t)j * K;
                if (pc) {                   /* kj <- w_j * k_j, dotted with alpha * k, alpha * q */
                    for (int n = 0; n < K; n++) kj[n] = LDA(ks + (size_t)j * K + n);
                    kda_weight_key(kj, run_v, gs + (size_t)j * K, gtot, K);
                    for (int n = 0; n < K; n++) { dk += kj[n] * ka[n]; dq += kj[n] * qa[n]; }
                } else {
                    for (int n = 0; n < K; n++) { kj[n] = LDA(ks + (size_t)j * K + n); dk += kj[n] * kv[n]; dq += kj[n] * qv[n]; }
                }
                const float ck = pc ? dk : w[j] * dk, cq = pc ? dq : w[j] * dq;
                const ATYPE *uj = us + (size_t)j * V;
#pragma omp simd
                for (int i = 0; i < V; i++) { const float t = LDA(uj + i); bk[i] += ck * t; bq[i] += cq * t; }
            }
            STYPE *S = state + ((size_t)s * HV + hv) * (size_t)V * K;
            const size_t io = ((size_t)b * HV + hv) * V;
            const float *rk = pc ? kd : kv, *rq = pc ? qd : qv;
            float uv[V];
            for (int i = 0; i < V; i++) {
                float a, c;
                if (pf) SUF(prefetch_l2)(pf + (size_t)i * K, K);
                SUF(dot2_row)(S + (size_t)i * K, rk, rq, K, &a, &c);
                const float u = bt * (LDA(v + io + i) - alpha * (d0 * a + bk[i]));
                uv[i] = u;
                STA(out + io + i, alpha * (d0 * c + bq[i]) + u * kq);
            }
            if (flush) {
                /* S0_i <- alpha d0 S0_i + sum_j (alpha w_j u_j,i) k_j + u_i k: a rank-(nj+1) rebuild of the rows
                 * (their second read, one head = V x K, usually still in this core's L2). KDA: the row scale is
                 * per column (alpha * d0, into gtot) and alpha * w_j goes on the key (Kl), u_j stays as cached. */
                float Xm[(nj + 1) * V];
                for (int j = 0; j < nj; j++) {
                    const float cj = pc ? 1.0f : alpha * w[j];
                    for (int i = 0; i < V; i++) Xm[(size_t)j * V + i] = cj * LDA(us + (size_t)j * V + i);
                }
                for (int i = 0; i < V; i++) Xm[(size_t)nj * V + i] = uv[i];
                if (pc) {
                    for (int j = 0; j < nj; j++)
                        for (int n = 0; n < K; n++) Kl[(size_t)j * K + n] *= av[n];
                    vexp_sub(gtot, gtot, NULL, K);
                    for (int n = 0; n < K; n++) gtot[n] *= av[n];
                }
                memcpy(Kl + (size_t)nj * K, kv, (size_t)K * sizeof(float));
                sr_ctx sbuf;          /* SR on a float16_sr / bfloat16_sr checkpoint */
                const sr_ctx *sr = SUF(sr_of)(&sbuf, sr_step, sr_seed, sr_mask, s);
                const uint32_t e0 = (uint32_t)((size_t)hv * V * K);
                if (pc) SUF(rebuild_rows_sr)(S, K, V, K, 1.0f, gtot, Xm, Kl, nj + 1, 1, NULL, NULL, NULL, sr, e0);
                else SUF(rebuild_rows_sr)(S, K, V, K, alpha * d0, NULL, Xm, Kl, nj + 1, 1, NULL, NULL, NULL, sr, e0);
            } else {
                for (int i = 0; i < V; i++) STA(us + (size_t)hp * V + i, uv[i]);
            }
            if (!flush) {
                if (pc) memcpy(gs + (size_t)hp * K, gt, (size_t)K * sizeof(float));
                else gs[hp] = gt[0];
                if (hv % gq == 0)
                    for (int n = 0; n < K; n++) STA(ks + (size_t)hp * K + n, kv[n]);
            }
        }
    }
    for (int b = 0; b < batch; b++) {
        const int s = slots[b];
        if (s < 0) continue;
        if (SR_FMT && sr_step && wp[s] >= L - 1) sr_step[s]++;         /* a flush wrote the slot */
        wp[s] = wp[s] >= L - 1 ? 0 : wp[s] + 1;
    }
}

#include "spec_body.h"   /* speculative-decoding kernels (same dtype instantiation) */
#include "tree_body.h"   /* tree speculation kernels (same dtype instantiation) */
