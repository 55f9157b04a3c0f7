/* Speculative-decoding kernels: Mamba-2's native per-draft snapshots, commit-replay verify and commit, and
 * ReplaySSM ring verify with its flush, and the row primitives every spec kernel shares (dot_block); GDN's and
 * KDA's are in gdn_spec_body.h, included at the end. Included by kernels_body.h, so instantiated per (state
 * dtype, activation dtype) pair like the rest and free to use its row primitives (dot_row, rebuild_rows,
 * prefetch_l2, gdn_qk) and kernels.c's next_program. */

/* ------------------------------------------------------------------------------------------------ spec */

#define MAXT 16   /* largest speculative window (MAX_WINDOW in the Python modules) */

/* Where a serial verify reads head h of slot s: the native layout [S, T, H, hs] from snapshot last[s], the
 * commit-replay checkpoint [S, H, hs] when last is NULL (hs = elements per head). */
static inline const STYPE *SUF(spec_src)(const STYPE *state, const int32_t *last, int s, int h, int H, int T,
                                         size_t hs)
{
    return last ? state + (((size_t)s * T + last[s]) * H + h) * hs : state + ((size_t)s * H + h) * hs;
}

/* The register tiles of dot_block (N % 8 == 0): two rows against eight vectors, or four rows against four. Each
 * 8-lane step loads the rows' chunk once and every vector's chunk once for 16 FMAs; the first form (one row
 * against four vectors) loaded 10 chunks for 8 FMAs, load-bound, and re-read the row per four vectors. Adjacent
 * rows side by side are short streams a row apart that the hardware prefetcher does not follow, so the tiles
 * rely on dot_block's software prefetch of the next program a head ahead, which keeps them at least as fast as
 * one row at a time (the paired timings: replayssm/cpu/README.md). The 16 accumulators fit x86-64's 32 vector
 * registers with AVX-512VL (an AVX2-only core has 16 and spills some; the results are the same). hsum8x8
 * reduces eight at once. Vectors past nx point at the first one and their sums are dropped.
 * out[x * os + r] = row_r . C_x. */
static inline void SUF(dot_tile2x8)(const STYPE *row, size_t rs, const float *Cm, int nx, int N, float *out,
                                    size_t os)
{
    const float *c[8];
    for (int x = 0; x < 8; x++) c[x] = Cm + (size_t)(x < nx ? x : 0) * N;
    v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    v8f b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0}, b4 = {0}, b5 = {0}, b6 = {0}, b7 = {0};
    for (int n = 0; n < N; n += 8) {
        const v8f r0 = LDS8(row + n), r1 = LDS8(row + rs + n);
        v8f cv;
        cv = v8_load(c[0] + n); a0 += r0 * cv; b0 += r1 * cv;
        cv = v8_load(c[1] + n); a1 += r0 * cv; b1 += r1 * cv;
        cv = v8_load(c[2] + n); a2 += r0 * cv; b2 += r1 * cv;
        cv = v8_load(c[3] + n); a3 += r0 * cv; b3 += r1 * cv;
        cv = v8_load(c[4] + n); a4 += r0 * cv; b4 += r1 * cv;
        cv = v8_load(c[5] + n); a5 += r0 * cv; b5 += r1 * cv;
        cv = v8_load(c[6] + n); a6 += r0 * cv; b6 += r1 * cv;
        cv = v8_load(c[7] + n); a7 += r0 * cv; b7 += r1 * cv;
    }
    float sa[8], sb[8];
    v8_store(sa, hsum8x8(a0, a1, a2, a3, a4, a5, a6, a7));
    v8_store(sb, hsum8x8(b0, b1, b2, b3, b4, b5, b6, b7));
    for (int x = 0; x < nx; x++) { out[x * os] = sa[x]; out[x * os + 1] = sb[x]; }
}

static inline void SUF(dot_tile4x4)(const STYPE *row, size_t rs, const float *Cm, int nx, int N, float *out,
                                    size_t os)
{
    const float *c0 = Cm, *c1 = nx > 1 ? Cm + N : Cm, *c2 = nx > 2 ? Cm + 2 * (size_t)N : Cm,
                *c3 = nx > 3 ? Cm + 3 * (size_t)N : Cm;
    v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
    v8f e0 = {0}, e1 = {0}, e2 = {0}, e3 = {0}, f0 = {0}, f1 = {0}, f2 = {0}, f3 = {0};
    for (int n = 0; n < N; n += 8) {
        const v8f r0 = LDS8(row + n), r1 = LDS8(row + rs + n), r2 = LDS8(row + 2 * rs + n),
                  r3 = LDS8(row + 3 * rs + n);
        v8f cv;
        cv = v8_load(c0 + n); a0 += r0 * cv; b0 += r1 * cv; e0 += r2 * cv; f0 += r3 * cv;
        cv = v8_load(c1 + n); a1 += r0 * cv; b1 += r1 * cv; e1 += r2 * cv; f1 += r3 * cv;
        cv = v8_load(c2 + n); a2 += r0 * cv; b2 += r1 * cv; e2 += r2 * cv; f2 += r3 * cv;
        cv = v8_load(c3 + n); a3 += r0 * cv; b3 += r1 * cv; e3 += r2 * cv; f3 += r3 * cv;
    }
    float s01[8], s23[8];   /* {row0 . C_0..3, row1 . C_0..3}, {row2 ..., row3 ...} */
    v8_store(s01, hsum8x8(a0, a1, a2, a3, b0, b1, b2, b3));
    v8_store(s23, hsum8x8(e0, e1, e2, e3, f0, f1, f2, f3));
    for (int x = 0; x < nx; x++) {
        out[x * os] = s01[x]; out[x * os + 1] = s01[4 + x];
        out[x * os + 2] = s23[x]; out[x * os + 3] = s23[4 + x];
    }
}

/* out[x * os + r] = S_r . C_x for the R rows S_r = S + r rs and nx vectors C [nx, N] fp32: every dot product
 * of a verify's window against a head's rows in one read of each row. Rows go in address order, a tile of
 * adjacent rows at a time (the head is in L2 by then: pf, the next program's rows, is prefetched a tile
 * ahead as in dot_rows); more than eight vectors take the rows' tile again from L1 per eight. Lengths that are
 * not a multiple of 8, and the rows past the last whole tile, take dot_row per vector. */
static inline void SUF(dot_block)(const STYPE *S, size_t rs, int R, const float *Cm, int nx, int N, float *out,
                                  size_t os, const STYPE *pf)
{
    int r = 0;
    if (N % 8 == 0 && nx <= 4) {
        for (; r + 4 <= R; r += 4) {
            if (pf) for (int i = 0; i < 4; i++) SUF(prefetch_l2)(pf + (r + i) * rs, N);
            SUF(dot_tile4x4)(S + r * rs, rs, Cm, nx, N, out + r, os);
        }
    } else if (N % 8 == 0) {
        for (; r + 2 <= R; r += 2) {
            if (pf) { SUF(prefetch_l2)(pf + r * rs, N); SUF(prefetch_l2)(pf + (r + 1) * rs, N); }
            for (int x0 = 0; x0 < nx; x0 += 8)
                SUF(dot_tile2x8)(S + r * rs, rs, Cm + (size_t)x0 * N, nx - x0 < 8 ? nx - x0 : 8, N,
                                 out + x0 * os + r, os);
        }
    }
    for (; r < R; r++) {
        if (pf) SUF(prefetch_l2)(pf + r * rs, N);
        for (int x = 0; x < nx; x++) out[x * os + r] = SUF(dot_row)(S + r * rs, Cm + (size_t)x * N, N);
    }
}

/* Mamba-2 serial spec verify, two methods:
 *   native (vLLM, `last` given): state [S, T, H, P, N]; each state row is loaded once from snapshot last[slot],
 *     the T window tokens run serially on it, and the row after token t is stored into snapshot t;
 *   commit-replay verify (`last` NULL): state [S, H, P, N] is the frozen checkpoint, read once, never written;
 *     the window's x [S, H, T, P], B [S, G, T, N] (group's first head) and processed dt [S, H, T] are stashed.
 * x, z, out [b, T, H, P]; dt [b, T, H] raw fp32; B, C [b, T, G, N]. */
void SUF(m2_spec_native)(STYPE *state, const int32_t *last, ATYPE *stash_x, ATYPE *stash_B, float *stash_dt,
                         const ATYPE *x, const float *dt, const float *A,
                         const ATYPE *Bm, const ATYPE *Cm, const float *D, const ATYPE *z, const float *dt_bias,
                         int softplus, ATYPE *out, const int32_t *slots, int batch, int T, int H, int P, int N, int G,
                         int nt)
{
    const int hpg = H / G;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
    for (int b = 0; b < batch; b++) {
        for (int h = 0; h < H; h++) {
            const int s = slots[b];
            if (s < 0) continue;
            const int g = h / hpg;
            float Bl[T * N], Cl[T * N], dts[MAXT], as[MAXT], r[N];
            for (int t = 0; t < T; t++) {
                const size_t o = (((size_t)b * T + t) * G + g) * N;
                for (int n = 0; n < N; n++) { Bl[t * N + n] = LDA(Bm + o + n); Cl[t * N + n] = LDA(Cm + o + n); }
                float d = dt[((size_t)b * T + t) * H + h] + (dt_bias ? dt_bias[h] : 0.0f);
                if (softplus) d = softplus_f(d);
                dts[t] = d; as[t] = expf(A[h] * d);
            }
            const size_t snap = (size_t)H * P * N;     /* elements between snapshots of one slot */
            const int native = last != NULL;
            const STYPE *src = SUF(spec_src)(state, last, s, h, H, T, (size_t)P * N);
            STYPE *dst0 = state + (size_t)s * T * snap + (size_t)h * P * N;
            int s2, h2;
            const STYPE *pf = next_program(slots, batch, b, h, H, &s2, &h2)
                                  ? SUF(spec_src)(state, last, s2, h2, H, T, (size_t)P * N) : NULL;
            for (int p = 0; p < P; p++) {
                if (pf) SUF(prefetch_l2)(pf + (size_t)p * N, N);
                for (int n = 0; n < N; n++) r[n] = LDS(src + (size_t)p * N + n);
                for (int t = 0; t < T; t++) {
                    const size_t io = (((size_t)b * T + t) * H + h) * P + p;
                    const float xv = LDA(x + io), xd = dts[t] * xv;
                    STYPE *row = dst0 + (size_t)t * snap + (size_t)p * N;
                    const float *Bt = Bl + (size_t)t * N, *Ct = Cl + (size_t)t * N;
                    float acc = 0.0f;
                    if (N % 16 == 0) {
                        v8f a0 = {0}, a1 = {0};
                        for (int n = 0; n < N; n += 16) {
                            const v8f v0 = as[t] * v8_load(r + n) + xd * v8_load(Bt + n);
                            const v8f v1 = as[t] * v8_load(r + n + 8) + xd * v8_load(Bt + n + 8);
                            v8_store(r + n, v0); v8_store(r + n + 8, v1);
                            if (native) { STS8(row + n, v0); STS8(row + n + 8, v1); }
                            a0 += v0 * v8_load(Ct + n); a1 += v1 * v8_load(Ct + n + 8);
                        }
                        acc = hsum8(a0 + a1);
                    } else {
                        for (int n = 0; n < N; n++) {
                            r[n] = as[t] * r[n] + xd * Bt[n];
                            if (native) STS(row + n, r[n]);
                            acc += r[n] * Ct[n];
                        }
                    }
                    float y = acc + (D ? D[h] * xv : 0.0f);
                    if (z) { const float zv = LDA(z + io); y *= zv * sigmoid_f(zv); }
                    STA(out + io, y);
                }
            }
            if (!native)
                for (int t = 0; t < T; t++) {
                    memcpy(stash_x + (((size_t)s * H + h) * T + t) * P, x + (((size_t)b * T + t) * H + h) * P,
                           (size_t)P * sizeof(ATYPE));
                    stash_dt[((size_t)s * H + h) * T + t] = dts[t];
                    if (h % hpg == 0)
                        memcpy(stash_B + (((size_t)s * G + g) * T + t) * N, Bm + (((size_t)b * T + t) * G + g) * N,
                               (size_t)N * sizeof(ATYPE));
                }
        }
    }
}

/* Mamba-2 commit-replay commit: the first a = accepted[b] stashed tokens folded into the checkpoint in closed
 * form, S <- exp(A sum_{t<a} dt_t) S + sum_{t<a} dt_t exp(A sum_{t<k<a} dt_k) x_t B_t^T: one read and one write
 * of each state row (the blocked rebuild). */
void SUF(m2_cr_commit)(STYPE *state, const ATYPE *stash_x, const ATYPE *stash_B, const float *stash_dt,
                       const int32_t *accepted, const float *A, const int32_t *slots, int batch, int T, int H, int P,
                       int N, int G, int nt)
{
    const int hpg = H / G;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
    for (int b = 0; b < batch; b++) {
        for (int h = 0; h < H; h++) {
            const int s = slots[b];
            if (s < 0) continue;
            const int g = h / hpg, a = accepted[b];
            const float *dts = stash_dt + ((size_t)s * H + h) * T;
            float after[MAXT], Xm[T * P], Ym[T * N];
            float run = 0.0f;
            for (int t = a - 1; t >= 0; t--) { after[t] = run; run += dts[t]; }
            for (int t = 0; t < a; t++) {
                const float w = dts[t] * expf(A[h] * after[t]);
                const ATYPE *xt = stash_x + (((size_t)s * H + h) * T + t) * P;
                const ATYPE *Bt = stash_B + (((size_t)s * G + g) * T + t) * N;
                for (int p = 0; p < P; p++) Xm[(size_t)t * P + p] = w * LDA(xt + p);
                for (int n = 0; n < N; n++) Ym[(size_t)t * N + n] = LDA(Bt + n);
            }
            int s2, h2;
            const STYPE *pf = next_program(slots, batch, b, h, H, &s2, &h2)
                                  ? state + ((size_t)s2 * H + h2) * (size_t)P * N : NULL;
            SUF(rebuild_rows)(state + ((size_t)s * H + h) * (size_t)P * N, N, P, N, expf(A[h] * run), Xm, Ym, a, 1,
                              NULL, NULL, pf);
        }
    }
}

/* B_j . C_t for every logical position j < h + T of the ring (history rows, then the T window / tree nodes)
 * and window token t, once per (row, group), into the ring's bc scratch [S, G, R, T] at index j: every head of
 * the group shares it. The chain and tree verifies both start with it. */
static void SUF(m2_ring_bc)(const ATYPE *Br, float *bcs, const int32_t *wp, const int32_t *origin, const ATYPE *Bm,
                            const ATYPE *Cm, const int32_t *slots, int batch, int T, int G, int N, int R, int nt)
{
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
    for (int b = 0; b < batch; b++) {
        for (int g = 0; g < G; g++) {
            const int s = slots[b];
            if (s < 0) continue;
            const int h0 = wp[s], org = origin[s], J = h0 + T;
            float Cl[T * N];
            for (int t = 0; t < T; t++) {
                const ATYPE *Ct = Cm + (((size_t)b * T + t) * G + g) * N;
                for (int n = 0; n < N; n++) Cl[t * N + n] = LDA(Ct + n);
            }
            for (int j = 0; j < J; j++) {
                const ATYPE *Bp = j < h0 ? Br + (((size_t)s * G + g) * R + ((org + j) & (R - 1))) * N
                                         : Bm + (((size_t)b * T + (j - h0)) * G + g) * N;
                float Bv[N];
                for (int n = 0; n < N; n++) Bv[n] = LDA(Bp + n);
                for (int t = 0; t < T; t++) {
                    float acc = 0.0f;
#pragma omp simd reduction(+:acc)
                    for (int n = 0; n < N; n++) acc += Bv[n] * Cl[t * N + n];
                    bcs[(((size_t)s * G + g) * R + j) * T + t] = acc;
                }
            }
        }
    }
}

/* The two ends of a Mamba-2 ring verify that the chain (m2_spec_replay) and tree (m2_tree_replay) kernels
 * share, per (row b, head h, slot s):
 *   m2_fold_history: on a flush row, the committed history folded into the checkpoint,
 *     S1 = e(tot) S0 + sum_{j<h0} dt_j e(tot - cum_j) x_j B_j^T, e(a) = exp(min(A a, 0)) (the blocked rebuild;
 *     the rows were read by the verify just before, so they come from cache);
 *   m2_ring_append: the window's x, processed dt (dtw [T]) and, by the group's first head, B into ring rows
 *     (row0 + t) & (R - 1). */
static inline void SUF(m2_fold_history)(STYPE *S, int h0, const float *dts, const float *cum, float tot, float etot,
                                        float Ah, const ATYPE *const *xj, const ATYPE *const *Bj, int P, int N)
{
    float Xm[h0 * P], Ym[h0 * N];
    for (int j = 0; j < h0; j++) {
        const float w = dts[j] * expf(fminf(Ah * (tot - cum[j]), 0.0f));
        for (int p = 0; p < P; p++) Xm[(size_t)j * P + p] = w * LDA(xj[j] + p);
        for (int n = 0; n < N; n++) Ym[(size_t)j * N + n] = LDA(Bj[j] + n);
    }
    SUF(rebuild_rows)(S, N, P, N, etot, Xm, Ym, h0, 1, NULL, NULL, NULL);
}

static inline void SUF(m2_ring_append)(ATYPE *xr, float *dtr, ATYPE *Br, const ATYPE *x, const ATYPE *Bm,
                                       const float *dtw, int s, int b, int h, int g, int writes_B, int row0, int T,
                                       int H, int G, int P, int N, int R)
{
    for (int t = 0; t < T; t++) {
        const int row = (row0 + t) & (R - 1);
        memcpy(xr + (((size_t)s * H + h) * R + row) * P, x + (((size_t)b * T + t) * H + h) * P,
               (size_t)P * sizeof(ATYPE));
        dtr[((size_t)s * H + h) * R + row] = dtw[t];
        if (writes_B)
            memcpy(Br + (((size_t)s * G + g) * R + row) * N, Bm + (((size_t)b * T + t) * G + g) * N,
                   (size_t)N * sizeof(ATYPE));
    }
}

/* The window's outputs of a Mamba-2 ring verify, chain or tree, from the checkpoint dots yv [T, P] (C_t . S0
 * rows, dot_block): y_t = E_t yv_t + sum_j coef[j, t] x_j with E_t as m2_spec_replay's comment defines it
 * (the node's own cum in a tree), then the D skip and gate (m2_finish) into out [b, T, H, P]. coef [J, cs] is 0
 * where token t does not read entry j (a later token, or a tree node off its branch): such x_j are never
 * multiplied in, so a NaN there cannot leak. */
static inline void SUF(m2_window_outputs)(float *yv, const float *coef, int cs, const ATYPE *const *xj, int J,
                                          const float *cum, int h0, int fl, float Ah, float tot, float etot,
                                          const ATYPE *x, const ATYPE *z, const float *D, ATYPE *out, int b, int h,
                                          int T, int H, int P)
{
    for (int t = 0; t < T; t++) {
        const float cp = cum[h0 + t];
        const float e = fl ? expf(fminf(Ah * (cp - tot), 0.0f)) * etot : expf(fminf(Ah * cp, 0.0f));
        float *yt = yv + (size_t)t * P;
#pragma omp simd
        for (int p = 0; p < P; p++) yt[p] *= e;
    }
    for (int j = 0; j < J; j++)
        for (int t = 0; t < T; t++) {
            const float c = coef[j * cs + t];
            if (c == 0.0f) continue;
            float *yt = yv + (size_t)t * P;
#pragma omp simd
            for (int p = 0; p < P; p++) yt[p] += c * LDA(xj[j] + p);
        }
    for (int t = 0; t < T; t++) {
        const size_t io = (((size_t)b * T + t) * H + h) * P;
        SUF(m2_finish)(yv + (size_t)t * P, x + io, z ? z + io : NULL, D, h, out + io, P);
    }
}

/* Mamba-2 ReplaySSM spec verify (replayssm/mamba2/spec_ref.py has the protocol). Per (row, head), h = write_pos,
 * logical position j at ring row (origin + j) & (R-1); window token t at p_t = h + t (its x, B, dt taken from the
 * inputs: the ring rows are written after every read), cum_j the inclusive prefix of processed dt:
 *   y_t = E_t (S0 C_t) + sum_j coef[j, t] x_j, one read of the checkpoint for all T readouts, where
 *   non-flush: E_t = e(cum_p), coef = dt_j e(cum_p - cum_j) (B_j . C_t) for j <= p_t;
 *   flush:     E_t = e(cum_p - tot) e(tot), the history (j < h) weighted e(cum_p - tot) dt_j e(tot - cum_j), the
 *              window as above; tot = cum_{h-1}; e(a) = exp(min(A a, 0)). The folded checkpoint
 *              S1 = e(tot) S0 + sum_{j<h} dt_j e(tot - cum_j) x_j B_j^T is stored when h > 0 (rows re-read from cache).
 * The window's x, B (group's first head) and processed dt are then written into the ring. */
void SUF(m2_spec_replay)(STYPE *state, ATYPE *xr, ATYPE *Br, float *dtr, float *bcs, const int32_t *wp,
                         const int32_t *origin,
                         const int32_t *is_flush, const ATYPE *x, const float *dt, const float *A, const ATYPE *Bm,
                         const ATYPE *Cm, const float *D, const ATYPE *z, const float *dt_bias, int softplus,
                         ATYPE *out, const int32_t *slots, int batch, int T, int H, int P, int N, int G, int R, int nt)
{
    const int hpg = H / G;
    SUF(m2_ring_bc)(Br, bcs, wp, origin, Bm, Cm, slots, batch, T, G, N, R, nt);
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
    for (int b = 0; b < batch; b++) {
        for (int h = 0; h < H; h++) {
            const int s = slots[b];
            if (s < 0) continue;
            const int g = h / hpg, h0 = wp[s], org = origin[s], fl = is_flush[s] != 0, J = h0 + T;
            const float Ah = A[h];
            float dts[MAXL], cum[MAXL], Cl[T * N], coef[MAXL * MAXT], yv[T * P];
            const ATYPE *Bj[MAXL], *xj[MAXL];
            float run = 0.0f;
            for (int j = 0; j < J; j++) {
                if (j < h0) {
                    const int row = (org + j) & (R - 1);
                    dts[j] = dtr[((size_t)s * H + h) * R + row];
                    Bj[j] = Br + (((size_t)s * G + g) * R + row) * N;
                    xj[j] = xr + (((size_t)s * H + h) * R + row) * P;
                } else {
                    const int t = j - h0;
                    float d = dt[((size_t)b * T + t) * H + h] + (dt_bias ? dt_bias[h] : 0.0f);
                    dts[j] = softplus ? softplus_f(d) : d;
                    Bj[j] = Bm + (((size_t)b * T + t) * G + g) * N;
                    xj[j] = x + (((size_t)b * T + t) * H + h) * P;
                }
                run += dts[j];
                cum[j] = run;
            }
            for (int t = 0; t < T; t++) {
                const ATYPE *Ct = Cm + (((size_t)b * T + t) * G + g) * N;
                for (int n = 0; n < N; n++) Cl[t * N + n] = LDA(Ct + n);
            }
            const float tot = h0 > 0 ? cum[h0 - 1] : 0.0f, etot = expf(fminf(Ah * tot, 0.0f));
            for (int j = 0; j < J; j++) {
                const float *bc = bcs + (((size_t)s * G + g) * R + j) * T;
                for (int t = 0; t < T; t++) {
                    const int p = h0 + t;
                    float c = 0.0f;
                    if (j <= p) {
                        if (fl && j < h0)
                            c = expf(fminf(Ah * (cum[p] - tot), 0.0f)) * dts[j] * expf(fminf(Ah * (tot - cum[j]), 0.0f));
                        else
                            c = dts[j] * expf(fminf(Ah * (cum[p] - cum[j]), 0.0f));
                    }
                    coef[j * MAXT + t] = c * bc[t];
                }
            }
            STYPE *S = state + ((size_t)s * H + h) * (size_t)P * N;
            int s2, h2;
            const STYPE *pf = next_program(slots, batch, b, h, H, &s2, &h2)
                                  ? state + ((size_t)s2 * H + h2) * (size_t)P * N : NULL;
            if (pf) {
                prefetch_ring_l2(xr + ((size_t)s2 * H + h2) * R * P, origin[s2], wp[s2] + T, R, P * sizeof(ATYPE));
                if (h2 % hpg == 0)
                    prefetch_ring_l2(Br + ((size_t)s2 * G + h2 / hpg) * R * N, origin[s2], wp[s2] + T, R,
                                     N * sizeof(ATYPE));
            }
            SUF(dot_block)(S, N, P, Cl, T, N, yv, P, pf);
            SUF(m2_window_outputs)(yv, coef, MAXT, xj, J, cum, h0, fl, Ah, tot, etot, x, z, D, out, b, h, T, H, P);
            if (fl && h0 > 0) SUF(m2_fold_history)(S, h0, dts, cum, tot, etot, Ah, xj, Bj, P, N);
            SUF(m2_ring_append)(xr, dtr, Br, x, Bm, dts + h0, s, b, h, g, h % hpg == 0, org + h0, T, H, G, P, N, R);
        }
    }
}

#include "gdn_spec_body.h"   /* the GDN / KDA speculative kernels (same dtype instantiation) */
