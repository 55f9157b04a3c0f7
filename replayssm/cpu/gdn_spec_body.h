/* Speculative-decoding kernels of GDN and Kimi Delta Attention (pc = 1): the native per-draft snapshots, the
 * commit-replay verify and commit, and the ReplaySSM ring verify with its flush (the ring program the tree
 * verify of tree_body.h shares). Included at the end of spec_body.h, so once per (state dtype, activation
 * dtype) pair, free to use kernels_body.h's row primitives (gdn_qk, rebuild_rows, prefetch_l2) and
 * spec_body.h's (spec_src, dot_block, MAXT). */

/* Kimi Delta Attention (pc = 1) runs the GDN kernels below with its per-key-channel decay: g is a K-vector per
 * (value head, token) (window g [b, T, HV, K], cached g [.., HV, rows, K], fp32) that scales the state's key
 * columns, S <- S diag(exp(g)), where GDN (pc = 0) has one scalar per head. Every formula then keeps its
 * shape with the scalar exp(G) moved inside the key dots; the pc = 0 path is GDN's as before (no per-channel
 * exp, the same arithmetic in the same order). A KDA program pays nj * K exps (nj = the decays it needs),
 * eight lanes at a time (vexp_sub, kernels.c). */
#ifndef MAXN
#define MAXN 32   /* largest tree (MAX_TREE_NODES in replayssm/cpu/ops.py): one uint32 bit set per node */
#endif

/* One GDN / KDA state row [K] through the serial delta rule over n tokens: r = a_t r; u = b_t (v_t - r . k_t);
 * r += u k_t; o[t] = r . q_t (when q). a_t: al[t] (pc = 0), or the [K] row al + t K (pc = 1, a per-channel
 * decay; al then has n + 1 rows, row n all ones). The row comes from src; after token t it is stored to
 * dst + t dstride (the native snapshots) when dst, and after the last token to fin (a commit) when fin. Each
 * token is one pass over the row in registers that also forms the next token's r . k: the update, the readout
 * and the next dot product share the loads, and two accumulators per dot keep the FMA chains short (a
 * scalar-accumulator pass for r . k and another for the update is bound by the FMA latency, far below the
 * row's floor). v [n] this row's values; k, q [n, K] fp32. Inlined into the specialised copies below. */
static inline __attribute__((always_inline)) void SUF(gdn_serial_row)(
    const STYPE *src, STYPE *dst, size_t dstride, STYPE *fin, int K, int n, const float *al, int pc,
    const float *bl, const float *vl, const float *kl, const float *ql, float *o)
{
    if (n <= 0) return;                     /* nothing to replay: the row stays as it is */
    if (K % 16 == 0 && K <= MAXV) {
        const int nv = K / 8;
        v8f r[MAXV / 8];
        v8f s0 = {0}, s1 = {0};
        for (int k = 0; k < nv; k += 2) {
            if (pc) {
                r[k] = v8_load(al + 8 * k) * LDS8(src + 8 * k);
                r[k + 1] = v8_load(al + 8 * k + 8) * LDS8(src + 8 * k + 8);
            } else {
                r[k] = al[0] * LDS8(src + 8 * k); r[k + 1] = al[0] * LDS8(src + 8 * k + 8);
            }
            s0 += r[k] * v8_load(kl + 8 * k); s1 += r[k + 1] * v8_load(kl + 8 * k + 8);
        }
        float sk = hsum8(s0 + s1);
        for (int t = 0; t < n; t++) {
            const float u = bl[t] * (vl[t] - sk);
            const int more = t + 1 < n;
            const float an = pc ? 1.0f : more ? al[t + 1] : 1.0f;
            const float *av = pc ? al + (size_t)(t + 1) * K : al;     /* pc: row n is ones */
            const float *kt = kl + (size_t)t * K, *kn = more ? kl + (size_t)(t + 1) * K : kt;
            const float *qt = ql ? ql + (size_t)t * K : kt;
            v8f o0 = {0}, o1 = {0}, n0 = {0}, n1 = {0};
            for (int k = 0; k < nv; k += 2) {
                const v8f a = r[k] + u * v8_load(kt + 8 * k), c = r[k + 1] + u * v8_load(kt + 8 * k + 8);
                if (dst) { STS8(dst + t * dstride + 8 * k, a); STS8(dst + t * dstride + 8 * k + 8, c); }
                o0 += a * v8_load(qt + 8 * k); o1 += c * v8_load(qt + 8 * k + 8);
                if (pc) { r[k] = v8_load(av + 8 * k) * a; r[k + 1] = v8_load(av + 8 * k + 8) * c; }
                else { r[k] = an * a; r[k + 1] = an * c; }
                n0 += r[k] * v8_load(kn + 8 * k); n1 += r[k + 1] * v8_load(kn + 8 * k + 8);
            }
            if (ql) o[t] = hsum8(o0 + o1);
            sk = hsum8(n0 + n1);
        }
        if (fin)
            for (int k = 0; k < nv; k++) STS8(fin + 8 * k, r[k]);
        return;
    }
    float r[K];
    for (int m = 0; m < K; m++) r[m] = LDS(src + m);
    for (int t = 0; t < n; t++) {
        const float *kt = kl + (size_t)t * K;
        float sk = 0.0f;
        for (int m = 0; m < K; m++) { r[m] *= pc ? al[(size_t)t * K + m] : al[t]; sk += r[m] * kt[m]; }
        const float u = bl[t] * (vl[t] - sk);
        float acc = 0.0f;
        for (int m = 0; m < K; m++) {
            r[m] += u * kt[m];
            if (dst) STS(dst + t * dstride + m, r[m]);
            if (ql) acc += r[m] * ql[(size_t)t * K + m];
        }
        if (ql) o[t] = acc;
    }
    if (fin)
        for (int m = 0; m < K; m++) STS(fin + m, r[m]);
}

/* The serial row specialised per use and family, each copy out of line with every constant folded: the verify
 * row (fin NULL, q given) and the commit row (dst, q NULL, stored in place), GDN's being the code gcc's constprop
 * clones of the row were before KDA. A kernel's pc cannot be folded into an inlined row (OpenMP outlines the
 * kernel's loop before inlining), so it picks a copy per row instead of branching per vector inside one. */
static __attribute__((noinline)) void SUF(gdn_verify_row)(const STYPE *src, STYPE *dst, size_t dstride, int K, int n,
                                                          const float *al, const float *bl, const float *vl,
                                                          const float *kl, const float *ql, float *o)
{
    SUF(gdn_serial_row)(src, dst, dstride, NULL, K, n, al, 0, bl, vl, kl, ql, o);
}

static __attribute__((noinline)) void SUF(kda_verify_row)(const STYPE *src, STYPE *dst, size_t dstride, int K, int n,
                                                          const float *al, const float *bl, const float *vl,
                                                          const float *kl, const float *ql, float *o)
{
    SUF(gdn_serial_row)(src, dst, dstride, NULL, K, n, al, 1, bl, vl, kl, ql, o);
}

static __attribute__((noinline)) void SUF(gdn_commit_row)(STYPE *row, int K, int n, const float *al, const float *bl,
                                                          const float *vl, const float *kl)
{
    SUF(gdn_serial_row)(row, NULL, 0, row, K, n, al, 0, bl, vl, kl, NULL, NULL);
}

static __attribute__((noinline)) void SUF(kda_commit_row)(STYPE *row, int K, int n, const float *al, const float *bl,
                                                          const float *vl, const float *kl)
{
    SUF(gdn_serial_row)(row, NULL, 0, row, K, n, al, 1, bl, vl, kl, NULL, NULL);
}

/* The decays a serial kernel multiplies by, al as gdn_serial_row takes it: n tokens of g at gt + t gstride
 * (pc = 0: one float each, al[t] = exp(g_t); pc = 1: [K] rows, al + t K = exp(g_t) per channel, then a row of
 * ones). */
static inline void SUF(gdn_serial_decays)(const float *gt, size_t gstride, int n, int K, int pc, float *al)
{
    for (int t = 0; t < n; t++) {
        if (pc) vexp_sub(al + (size_t)t * K, gt + t * gstride, NULL, K);
        else al[t] = expf(gt[t * gstride]);
    }
    if (pc)
        for (int c = 0; c < K; c++) al[(size_t)n * K + c] = 1.0f;
}

/* The window of a GDN ring verify over whole [V] rows, the rows i as the vector lanes (per row i alone, the
 * T x T recurrence is a serial chain of dependent scalar FMAs). D [2T, V]: the checkpoint
 * dots S0_i . k_s, S0_i . q_s; bkq [2T, V] their history parts; v_s at vw + s vstride. Token s takes the U of
 * the earlier tokens its ancestor bits anc[s] name (anc NULL: all of them, the chain); A, E [T, astride] as
 * gdn_window_system defines them; eb [T] = exp(G_s) (KDA: 1, its decays are inside D and bkq already).
 * Writes U (Ul [T, V]) and the outputs (Ol [T, V]). */
static inline void SUF(gdn_window_rows)(const float *D, const float *bkq, const ATYPE *vw, size_t vstride,
                                        const float *eb, const float *bw, float d0, const float *A, const float *E,
                                        int astride, const uint32_t *anc, int T, int V, float *Ul, float *Ol)
{
    for (int t = 0; t < T; t++) {
        const ATYPE *vt = vw + (size_t)t * vstride;
        const float *dk = D + (size_t)t * V, *hb = bkq + (size_t)t * V;
        const float et = eb[t], bt = bw[t];
        float *u = Ul + (size_t)t * V;
#pragma omp simd
        for (int i = 0; i < V; i++) u[i] = bt * (LDA(vt + i) - et * (d0 * dk[i] + hb[i]));
        for (int t2 = 0; t2 < t; t2++) {
            if (anc && !((anc[t] >> t2) & 1u)) continue;
            const float a = A[t * astride + t2];
            const float *u2 = Ul + (size_t)t2 * V;
#pragma omp simd
            for (int i = 0; i < V; i++) u[i] -= a * u2[i];
        }
    }
    for (int t = 0; t < T; t++) {
        const float *dq = D + (size_t)(T + t) * V, *hb = bkq + (size_t)(T + t) * V;
        const float et = eb[t];
        float *o = Ol + (size_t)t * V;
#pragma omp simd
        for (int i = 0; i < V; i++) o[i] = et * (d0 * dq[i] + hb[i]);
        for (int t2 = 0; t2 <= t; t2++) {
            if (anc && !((anc[t] >> t2) & 1u)) continue;
            const float e = E[t * astride + t2];
            const float *u2 = Ul + (size_t)t2 * V;
#pragma omp simd
            for (int i = 0; i < V; i++) o[i] += e * u2[i];
        }
    }
}

/* Pieces the GDN serial and ring verifies (chain and tree) share, per (row b, value head hv, slot s):
 *   gdn_store_window: the window's outputs, gathered per token in Ol [T, V], stored as contiguous rows of out
 *     [b, T, HV, V] (a scalar store per (row, token) lands on T pages 32 KiB apart);
 *   gdn_fold_history: on a flush row, the checkpoint rows become S_h = d0 S0 + sum_{j<h0} w_j u_j k_j^T
 *     (u from this head's ring ur_h [R, V] at rows (org + j) & (R - 1), keys Kl [h0, K]; the blocked rebuild,
 *     rows from cache); KDA (d0v given): S_h = S0 diag(d0v) + sum_j u_j Kl_j^T, Kl the decay-weighted keys;
 *   gdn_ring_append: the window's U (Ul [T, V]), g (a [K] row per token when pc) and, by the key head's first
 *     value head, k (X2 [T, K]) into ring rows (row0 + t) & (R - 1). */
static inline void SUF(gdn_store_window)(ATYPE *out, const float *Ol, int b, int hv, int T, int HV, int V)
{
    for (int t = 0; t < T; t++) {
        ATYPE *ot = out + (((size_t)b * T + t) * HV + hv) * V;
        for (int i = 0; i < V; i++) STA(ot + i, Ol[t * V + i]);
    }
}

static inline void SUF(gdn_fold_history)(STYPE *S, const ATYPE *ur_h, const float *w, float d0, const float *d0v,
                                         const float *Kl, int h0, int org, int R, int V, int K)
{
    float Xm[h0 * V];
    for (int j = 0; j < h0; j++) {
        const ATYPE *uj = ur_h + (size_t)((org + j) & (R - 1)) * V;
        const float wj = d0v ? 1.0f : w[j];
        for (int i = 0; i < V; i++) Xm[(size_t)j * V + i] = wj * LDA(uj + i);
    }
    if (d0v) SUF(rebuild_rows_cs)(S, K, V, K, 1.0f, d0v, Xm, Kl, h0, 1, NULL, NULL, NULL);   /* KDA: per key channel */
    else SUF(rebuild_rows)(S, K, V, K, d0, Xm, Kl, h0, 1, NULL, NULL, NULL);
}

static inline void SUF(gdn_ring_append)(ATYPE *ur, float *gr, ATYPE *kr, const float *Ul, const float *g,
                                        const float *X2, int s, int b, int hv, int hk, int writes_k, int row0, int T,
                                        int H, int HV, int K, int V, int R, int pc)
{
    for (int t = 0; t < T; t++) {
        const int row = (row0 + t) & (R - 1);
        ATYPE *ud = ur + (((size_t)s * HV + hv) * R + row) * V;
        for (int i = 0; i < V; i++) STA(ud + i, Ul[t * V + i]);
        if (pc)
            memcpy(gr + (((size_t)s * HV + hv) * R + row) * K, g + (((size_t)b * T + t) * HV + hv) * K,
                   (size_t)K * sizeof(float));
        else
            gr[((size_t)s * HV + hv) * R + row] = g[((size_t)b * T + t) * HV + hv];
        if (writes_k) {
            ATYPE *kd = kr + (((size_t)s * H + hk) * R + row) * K;
            for (int n = 0; n < K; n++) STA(kd + n, X2[t * K + n]);
        }
    }
}

/* GDN / KDA serial spec verify, two methods:
 *   native (vLLM, `last` given): state [S, T, HV, V, K]; each state row [K] is loaded once from snapshot
 *     last[slot]; per token t: r = exp(g_t) r (KDA: per column); u = beta_t (v_t - r . k_t); r += u k_t;
 *     stored into snapshot t; o_t = r . q_t;
 *   commit-replay verify (`last` NULL): state [S, HV, V, K] is the frozen checkpoint, read once, never written;
 *     the window is stashed: k [S, H, T, K] (normalised, by the key head's first value head), raw v
 *     [S, HV, T, V], beta [S, HV, T] and g [S, HV, T] (KDA: [S, HV, T, K]) fp32.
 * q, k [b, T, H, K]; v, out [b, T, HV, V]; beta [b, T, HV] fp32; g [b, T, HV] (pc = 0) or [b, T, HV, K]. */
void SUF(gdn_spec_native)(STYPE *state, const int32_t *last, ATYPE *stash_k, ATYPE *stash_v, float *stash_g,
                          float *stash_beta, const ATYPE *q, const ATYPE *k, const ATYPE *v,
                          const float *g, const float *beta, float scale, int l2norm, ATYPE *out,
                          const int32_t *slots, int batch, int T, int H, int HV, int K, int V, int pc, int nt)
{
    const int gq = HV / H, gK = pc ? K : 1;     /* floats of g per (token, value head) */
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
    for (int b = 0; b < batch; b++) {
        for (int hv = 0; hv < HV; hv++) {
            const int s = slots[b];
            if (s < 0) continue;
            const int hk = hv / gq;
            float ql[T * K], kl[T * K], al[pc ? (T + 1) * K : MAXT], bl[MAXT];
            for (int t = 0; t < T; t++) {
                SUF(gdn_qk)(q, k, (((size_t)b * T + t) * H + hk) * K, K, l2norm, scale, ql + t * K, kl + t * K);
                bl[t] = beta[((size_t)b * T + t) * HV + hv];
            }
            SUF(gdn_serial_decays)(g + ((size_t)b * T * HV + hv) * gK, (size_t)HV * gK, T, K, pc, al);
            const size_t snap = (size_t)HV * V * K;
            const int native = last != NULL;
            const STYPE *src = SUF(spec_src)(state, last, s, hv, HV, T, (size_t)V * K);
            STYPE *dst0 = state + (size_t)s * T * snap + (size_t)hv * V * K;
            int s2, h2;
            const STYPE *pf = next_program(slots, batch, b, hv, HV, &s2, &h2)
                                  ? SUF(spec_src)(state, last, s2, h2, HV, T, (size_t)V * K) : NULL;
            /* the window's values and outputs per row are gathered from / into contiguous [T, V] blocks: a scalar
             * access per (row, token) lands on T pages 32 KiB apart */
            float Vl[T * V], Ol[T * V];
            for (int t = 0; t < T; t++) {
                const ATYPE *vt = v + (((size_t)b * T + t) * HV + hv) * V;
                for (int i = 0; i < V; i++) Vl[t * V + i] = LDA(vt + i);
            }
            for (int i = 0; i < V; i++) {
                if (pf) SUF(prefetch_l2)(pf + (size_t)i * K, K);
                float vl[MAXT], o[MAXT];
                for (int t = 0; t < T; t++) vl[t] = Vl[t * V + i];
                const STYPE *ri = src + (size_t)i * K;
                STYPE *di = native ? dst0 + (size_t)i * K : NULL;
                if (pc) SUF(kda_verify_row)(ri, di, snap, K, T, al, bl, vl, kl, ql, o);
                else SUF(gdn_verify_row)(ri, di, snap, K, T, al, bl, vl, kl, ql, o);
                for (int t = 0; t < T; t++) Ol[t * V + i] = o[t];
            }
            SUF(gdn_store_window)(out, Ol, b, hv, T, HV, V);
            if (!native)
                for (int t = 0; t < T; t++) {
                    const size_t st = ((size_t)s * HV + hv) * T + t;
                    memcpy(stash_v + st * V, v + (((size_t)b * T + t) * HV + hv) * V, (size_t)V * sizeof(ATYPE));
                    memcpy(stash_g + st * gK, g + (((size_t)b * T + t) * HV + hv) * gK, (size_t)gK * sizeof(float));
                    stash_beta[st] = bl[t];
                    if (hv % gq == 0) {
                        ATYPE *kd = stash_k + (((size_t)s * H + hk) * T + t) * K;
                        for (int n = 0; n < K; n++) STA(kd + n, kl[t * K + n]);
                    }
                }
        }
    }
}

/* GDN / KDA commit-replay commit: the first a = accepted[b] stashed tokens replayed serially into the
 * checkpoint, per state row r: r = exp(g_t) r (KDA: per column); u = beta_t (v_t - r . k_t); r += u k_t (the
 * stashed k is already normalised). One read and one write of each row. state [S, HV, V, K]; stash as
 * gdn_spec_native writes it. */
void SUF(gdn_cr_commit)(STYPE *state, const ATYPE *stash_k, const ATYPE *stash_v, const float *stash_g,
                        const float *stash_beta, const int32_t *accepted, const int32_t *slots, int batch, int T,
                        int H, int HV, int K, int V, int pc, int nt)
{
    const int gq = HV / H, gK = pc ? K : 1;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
    for (int b = 0; b < batch; b++) {
        for (int hv = 0; hv < HV; hv++) {
            const int s = slots[b];
            if (s < 0) continue;
            const int hk = hv / gq, a = accepted[b];
            float kl[T * K], al[pc ? (T + 1) * K : MAXT], bl[MAXT], vl[T * V];
            for (int t = 0; t < a; t++) {
                const size_t st = ((size_t)s * HV + hv) * T + t;
                const ATYPE *kt = stash_k + (((size_t)s * H + hk) * T + t) * K;
                for (int n = 0; n < K; n++) kl[t * K + n] = LDA(kt + n);
                for (int i = 0; i < V; i++) vl[t * V + i] = LDA(stash_v + st * V + i);
                bl[t] = stash_beta[st];
            }
            SUF(gdn_serial_decays)(stash_g + ((size_t)s * HV + hv) * T * gK, (size_t)gK, a, K, pc, al);
            STYPE *S = state + ((size_t)s * HV + hv) * (size_t)V * K;
            int s2, h2;
            const STYPE *pf = next_program(slots, batch, b, hv, HV, &s2, &h2)
                                  ? state + ((size_t)s2 * HV + h2) * (size_t)V * K : NULL;
            for (int i = 0; i < V; i++) {
                STYPE *row = S + (size_t)i * K;
                if (pf) SUF(prefetch_l2)(pf + (size_t)i * K, K);
                float vi[MAXT];
                for (int t = 0; t < a; t++) vi[t] = vl[t * V + i];
                if (pc) SUF(kda_commit_row)(row, K, a, al, bl, vi, kl);
                else SUF(gdn_commit_row)(row, K, a, al, bl, vi, kl);
            }
        }
    }
}

/* The history part of a GDN ring verify, chain or tree, per (slot s, value head hv, key head hk): the h0
 * committed entries at ring rows (org + j) & (R - 1) give their weights w_j = exp(G_tot - G_pre_j), their keys
 * Kl [h0, K] (fp32, for the flush fold) and bkq [nx, V], bkq[x][i] = sum_j w_j (k_j . X2_x) u_j,i: the history
 * part of (S_h X2_x)_i for the nx window vectors X2 [nx, K], vectorised over i. Returns d0 = exp(G_tot).
 * KDA (pc = 1, gr rows [K]): the weights are per channel and go into the keys, Kl_j = w_j * k_j (w_j from the
 * suffix sums of g, no prefix array), bkq[x][i] = sum_j (Kl_j . X2_x) u_j,i, d0v [K] = exp(G_tot); returns 1. */
static inline float SUF(gdn_history)(const float *gr, const ATYPE *kr, const ATYPE *ur, int s, int hv, int hk,
                                     int org, int h0, int R, int H, int HV, int K, int V, const float *X2, int nx,
                                     float *w, float *Kl, float *bkq, int pc, float *d0v)
{
    float dots[(h0 > 0 ? h0 : 1) * nx], d0 = 1.0f;
    if (pc) {
        const float *gs = gr + ((size_t)s * HV + hv) * R * K;
        float suf[K], wv[K];                       /* suf = G_tot - G_pre_j: the decay after entry j */
        for (int c = 0; c < K; c++) suf[c] = 0.0f;
        for (int j = h0 - 1; j >= 0; j--) {
            const int row = (org + j) & (R - 1);
            vexp_sub(wv, suf, NULL, K);
            const ATYPE *kj = kr + (((size_t)s * H + hk) * R + row) * K;
            float *Kj = Kl + (size_t)j * K;
            for (int n = 0; n < K; n++) { Kj[n] = wv[n] * LDA(kj + n); suf[n] += gs[(size_t)row * K + n]; }
            for (int x = 0; x < nx; x++) {
                float acc = 0.0f;
                for (int n = 0; n < K; n++) acc += Kj[n] * X2[x * K + n];
                dots[j * nx + x] = acc;
            }
        }
        vexp_sub(d0v, suf, NULL, K);
    } else {
        const float *gs = gr + ((size_t)s * HV + hv) * R;
        float Gp[MAXL], run = 0.0f;
        for (int j = 0; j < h0; j++) { run += gs[(org + j) & (R - 1)]; Gp[j] = run; }
        for (int j = 0; j < h0; j++) {
            w[j] = expf(run - Gp[j]);
            const ATYPE *kj = kr + (((size_t)s * H + hk) * R + ((org + j) & (R - 1))) * K;
            for (int n = 0; n < K; n++) Kl[(size_t)j * K + n] = LDA(kj + n);
            for (int x = 0; x < nx; x++) {
                float acc = 0.0f;
                for (int n = 0; n < K; n++) acc += Kl[(size_t)j * K + n] * X2[x * K + n];
                dots[j * nx + x] = w[j] * acc;
            }
        }
        d0 = expf(run);
    }
    for (int i = 0; i < nx * V; i++) bkq[i] = 0.0f;
    for (int j = 0; j < h0; j++) {
        const ATYPE *uj = ur + (((size_t)s * HV + hv) * R + ((org + j) & (R - 1))) * V;
        for (int x = 0; x < nx; x++) {
            const float c = dots[j * nx + x];
            float *dst = bkq + (size_t)x * V;
#pragma omp simd
            for (int i = 0; i < V; i++) dst[i] += c * LDA(uj + i);
        }
    }
    return d0;
}

/* The window's log decays and its delta-rule system, per (row b, value head hv), chain (par NULL: token t's
 * predecessor is t - 1) or tree (par[t], -1 for the root):
 *   Gw: G_t = G_pred(t) + g_t, [T] (pc = 0) or [T, K] per channel; bw [T] = beta_t;
 *   A[t, c] = beta_t e(t, c) (k_t . k_c) for c a strict predecessor / ancestor of t, E[t, c] = e(t, c) (k_c . q_t)
 *   for c on t's path up to t itself, 0 elsewhere (A, E [T, astride]); e(t, c) = exp(min(G_t - G_c, 0)), a
 *   scalar (GDN) or, KDA, a [K] row inside both dots (exp of a difference: exp(G_t) exp(-G_c) would overflow once
 *   a channel's window decay passes e^88). X2 [2T, K]: keys, then queries. */
static inline void SUF(gdn_window_system)(const float *g, const float *beta, const int *par, const uint32_t *anc,
                                          const float *X2, int b, int hv, int T, int HV, int K, int pc, float *Gw,
                                          float *bw, float *A, float *E, int astride)
{
    for (int t = 0; t < T; t++) {
        const int p = par ? par[t] : t - 1;
        if (pc) {
            const float *gt = g + (((size_t)b * T + t) * HV + hv) * K;
            for (int c = 0; c < K; c++) Gw[t * K + c] = (p < 0 ? 0.0f : Gw[p * K + c]) + gt[c];
        } else {
            Gw[t] = (p < 0 ? 0.0f : Gw[p]) + g[((size_t)b * T + t) * HV + hv];
        }
        bw[t] = beta[((size_t)b * T + t) * HV + hv];
    }
    for (int t = 0; t < T; t++)
        for (int t2 = 0; t2 < T; t2++) {
            A[t * astride + t2] = 0.0f;
            E[t * astride + t2] = 0.0f;
            if (t2 > t || (anc && !((anc[t] >> t2) & 1u))) continue;    /* t2 not on t's path */
            const float *kt = X2 + (size_t)t * K, *kc = X2 + (size_t)t2 * K, *qt = X2 + (size_t)(T + t) * K;
            float kk = 0.0f, kq = 0.0f, e = 1.0f;
            if (pc) {
                /* one pass per pair: the clamped difference, its exp and both weighted dots, eight lanes at a
                 * time (fminf is a libm call per element: it may not become a vector min, whose NaN rule differs;
                 * the select keeps a NaN as torch.clamp does) */
                const float *Gt = Gw + (size_t)t * K, *Gc = Gw + (size_t)t2 * K;
                v8f vk = {0}, vq = {0};
                int c = 0;
                for (; c + 8 <= K; c += 8) {
                    const v8f d = v8_load(Gt + c) - v8_load(Gc + c);
                    const v8f e = v8_expf(v8_select(d > v8_set1(0.0f), v8_set1(0.0f), d)), kce = v8_load(kc + c) * e;
                    vk += v8_load(kt + c) * kce; vq += v8_load(qt + c) * kce;
                }
                kk = hsum8(vk); kq = hsum8(vq);
                for (; c < K; c++) {
                    const float d = Gt[c] - Gc[c], kce = kc[c] * expf(d > 0.0f ? 0.0f : d);
                    kk += kt[c] * kce; kq += qt[c] * kce;
                }
            } else {
                for (int n = 0; n < K; n++) { kk += kt[n] * kc[n]; kq += kc[n] * qt[n]; }
                e = expf(fminf(Gw[t] - Gw[t2], 0.0f));
            }
            if (t2 < t) A[t * astride + t2] = bw[t] * e * kk;
            E[t * astride + t2] = e * kq;
        }
}

/* One (row b, value head hv) program of a GDN / KDA ReplaySSM ring verify, chain (par, anc NULL) or tree
 * (gdn_tree_replay, tree_body.h). h0 = write_pos, committed entries j < h0 at ring rows (origin + j) & (R-1):
 *   GDN: w_j = exp(G_tot - G_pre_j), d0 = exp(G_tot), S_h x = d0 (S0 x) + sum_j w_j (k_j . x) u_j for x in
 *     {k_s, q_s}, and the readouts take e^{G_s} (S_h x);
 *   KDA: the decays are K-vectors, so x becomes y = exp(G_s) * x (per channel) before the product:
 *     S_h y = S0 (d0 * y) + sum_j ((w_j * k_j) . y) u_j.
 * One pass over each checkpoint row computes all 2T dots (dot_block); per row i the window is the T x T forward
 * substitution of the chunked delta rule (gdn_window_rows, gdn_window_system):
 *   R_s = beta_s (v_s,i - (S_h exp(G_s) k_s)_i), U_s,i = R_s - sum_{s'} A[s, s'] U_s',i,
 *   o_s,i = (S_h exp(G_s) q_s)_i + sum_{s'} E[s, s'] U_s',i.
 * is_flush and h0 > 0: the checkpoint rows become S_h (the blocked rebuild, after the dots). Then (U_s, k_s, g_s)
 * go into the window's ring rows (k by the key head's first value head). 2T <= MAXT (chain) / T <= MAXN (tree). */
static inline void SUF(gdn_ring_program)(STYPE *state, ATYPE *ur, ATYPE *kr, float *gr, const int32_t *wp,
                                         const int32_t *origin, const int32_t *is_flush, const int *par,
                                         const uint32_t *anc, const ATYPE *q, const ATYPE *k, const ATYPE *v,
                                         const float *g, const float *beta, float scale, int l2norm, ATYPE *out,
                                         const int32_t *slots, int batch, int b, int hv, int T, int H, int HV, int K,
                                         int V, int R, int pc)
{
    const int gq = HV / H, s = slots[b];
    const int hk = hv / gq, h0 = wp[s], org = origin[s], fl = is_flush[s] != 0;
    float X2[2 * T * K], Kl[(h0 > 0 ? h0 : 1) * K], w[MAXL], Gw[pc ? T * K : T], bw[MAXN], eb[MAXN];
    float A[MAXN * MAXN], E[MAXN * MAXN], bkq[2 * T * V], Xw[pc ? 2 * T * K : 1], d0v[pc ? K : 1];
    /* window keys and queries: X2[s] = k_s, X2[T + s] = q_s (normalised, q scaled) */
    for (int t = 0; t < T; t++)
        SUF(gdn_qk)(q, k, (((size_t)b * T + t) * H + hk) * K, K, l2norm, scale, X2 + (T + t) * K, X2 + t * K);
    SUF(gdn_window_system)(g, beta, par, anc, X2, b, hv, T, HV, K, pc, Gw, bw, A, E, MAXN);
    /* history: decays, keys, and their part of S_h x; Xd the vectors the checkpoint rows are dotted with */
    const float *Xd = X2;
    float d0;
    if (pc) {
        for (int t = 0; t < T; t++) {
            float *xk = Xw + (size_t)t * K, *xq = Xw + (size_t)(T + t) * K;
            vexp_sub(xk, Gw + (size_t)t * K, NULL, K);
            for (int c = 0; c < K; c++) { xq[c] = xk[c] * X2[(T + t) * K + c]; xk[c] *= X2[t * K + c]; }
            eb[t] = 1.0f;
        }
        d0 = SUF(gdn_history)(gr, kr, ur, s, hv, hk, org, h0, R, H, HV, K, V, Xw, 2 * T, w, Kl, bkq, 1, d0v);
        for (int x = 0; x < 2 * T; x++)
            for (int c = 0; c < K; c++) Xw[x * K + c] *= d0v[c];
        Xd = Xw;
    } else {
        d0 = SUF(gdn_history)(gr, kr, ur, s, hv, hk, org, h0, R, H, HV, K, V, X2, 2 * T, w, Kl, bkq, 0, NULL);
        for (int t = 0; t < T; t++) eb[t] = expf(Gw[t]);
    }
    STYPE *S = state + ((size_t)s * HV + hv) * (size_t)V * K;
    int s2, h2;
    const STYPE *pf = next_program(slots, batch, b, hv, HV, &s2, &h2)
                          ? state + ((size_t)s2 * HV + h2) * (size_t)V * K : NULL;
    if (pf) {
        prefetch_ring_l2(ur + ((size_t)s2 * HV + h2) * R * V, origin[s2], wp[s2] + T, R, V * sizeof(ATYPE));
        if (h2 % gq == 0)
            prefetch_ring_l2(kr + ((size_t)s2 * H + h2 / gq) * R * K, origin[s2], wp[s2] + T, R, K * sizeof(ATYPE));
        if (pc)     /* KDA's g history is a [K] row per entry, as long as a key row (GDN's: one float) */
            prefetch_ring_l2(gr + ((size_t)s2 * HV + h2) * R * K, origin[s2], wp[s2] + T, R, K * sizeof(float));
    }
    /* D[x][i] = S0_i . Xd_x: all 2T dots of every checkpoint row in one read of the head, then the window over
     * whole rows (gdn_window_rows). The outputs are gathered per token and stored as contiguous rows after (a
     * scalar store per (row, token) lands on T pages HV x V elements apart). */
    float D[2 * T * V], Ul[T * V], Ol[T * V];
    SUF(dot_block)(S, K, V, Xd, 2 * T, K, D, V, pf);
    SUF(gdn_window_rows)(D, bkq, v + ((size_t)b * T * HV + hv) * V, (size_t)HV * V, eb, bw, d0, A, E, MAXN, anc, T,
                         V, Ul, Ol);
    SUF(gdn_store_window)(out, Ol, b, hv, T, HV, V);
    if (fl && h0 > 0)
        SUF(gdn_fold_history)(S, ur + ((size_t)s * HV + hv) * R * V, w, d0, pc ? d0v : NULL, Kl, h0, org, R, V, K);
    SUF(gdn_ring_append)(ur, gr, kr, Ul, g, X2, s, b, hv, hk, hv % gq == 0, org + h0, T, H, HV, K, V, R, pc);
}

/* GDN / KDA ReplaySSM spec verify (replayssm/gdn/spec_ref.py has the protocol; the math: gdn_ring_program).
 * ur [S, HV, R, V], kr [S, H, R, K], gr [S, HV, R] (KDA: [S, HV, R, K]); window inputs as gdn_spec_native. */
void SUF(gdn_spec_replay)(STYPE *state, ATYPE *ur, ATYPE *kr, float *gr, const int32_t *wp, const int32_t *origin,
                          const int32_t *is_flush, const ATYPE *q, const ATYPE *k, const ATYPE *v, const float *g,
                          const float *beta, float scale, int l2norm, ATYPE *out, const int32_t *slots, int batch,
                          int T, int H, int HV, int K, int V, int R, int pc, int nt)
{
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
    for (int b = 0; b < batch; b++)
        for (int hv = 0; hv < HV; hv++)
            if (slots[b] >= 0)
                SUF(gdn_ring_program)(state, ur, kr, gr, wp, origin, is_flush, NULL, NULL, q, k, v, g, beta, scale,
                                      l2norm, out, slots, batch, b, hv, T, H, HV, K, V, R, pc);
}
