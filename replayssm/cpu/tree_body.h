/* Tree speculation kernels (backend="cpu"), included at the end of kernels_body.h, so once per (state, act)
 * dtype pair like every other kernel (STYPE / LDS / ATYPE / LDA / SUF from there).
 *
 * Both are the chain spec kernels (m2_spec_replay, gdn_spec_replay) with the window's causal mask
 * replaced by the ancestor mask of a draft tree and the window's prefix sums by tree prefix sums
 * cum[s] = cum[parent[s]] + dt[s] (parent -1: the committed history). Node s sits at logical position h + s,
 * ring row (origin + h + s) & (R - 1), exactly where a chain's window token s goes; the protocol is in
 * replayssm/tree_ring.py, the float64 oracles in replayssm/{mamba2,gdn}/spec_ref.py (parents=). For a chain tree every
 * mask and prefix sum is the chain kernel's, term for term in the same order.
 *
 * parents int32 [batch, N] (validated in Python: parents[0] = -1, 0 <= parents[s] < s on live rows). The
 * ancestor-or-self set of node s is a uint32 bit set built in topological order (N <= MAXN = 32, checked in
 * Python before any launch; the ring length <= MAXL = 64 with B >= N implies it anyway). */

#ifndef MAXN
#define MAXN 32   /* largest tree (MAX_TREE_NODES in replayssm/cpu/ops.py): one uint32 bit set per node */
#endif

/* Ancestor-or-self bit sets of row b's nodes; an invalid parent (only possible on a row Python did not
 * validate) is taken as the root, so a bad value never indexes out of bounds. */
static inline void SUF(tree_anc)(const int32_t *parents, int b, int T, uint32_t *anc, int *par)
{
    for (int t = 0; t < T; t++) {
        int p = parents[(size_t)b * T + t];
        if (p < 0 || p >= t) p = -1;
        par[t] = p;
        anc[t] = (p < 0 ? 0u : anc[p]) | (1u << t);
    }
}

/* Mamba-2 ReplaySSM tree verify. As m2_spec_replay, per (row, head) with h = write_pos and node t at p_t = h + t:
 *   cum_j (j < h) the inclusive prefix of the history's dt; cum_{h+t} = cum_{h+parent(t)} + dt_t (tree prefix);
 *   node t sees every history entry and the window entries of its ancestors-or-self (bit c of anc[t]);
 *   non-flush: E_t = e(cum_p), coef = dt_j e(cum_p - cum_j) (B_j . C_t) over the visible j;
 *   flush:     E_t = e(cum_p - tot) e(tot), history weighted e(cum_p - tot) dt_j e(tot - cum_j), the window as
 *              above; the folded checkpoint is stored when h > 0 (its rows re-read after the readouts).
 * The N nodes' x, B (group's first head) and processed dt then go into the ring. The bc scratch
 * [S, G, R, window] holds B_j . C_t at logical index j, as in the chain kernel. */
void SUF(m2_tree_replay)(STYPE *state, ATYPE *xr, ATYPE *Br, float *dtr, float *bcs, const int32_t *wp,
                         const int32_t *origin, const int32_t *is_flush, const int32_t *parents, const ATYPE *x,
                         const float *dt, const float *A, const ATYPE *Bm, const ATYPE *Cm, const float *D,
                         const ATYPE *z, const float *dt_bias, int softplus, ATYPE *out, const int32_t *slots,
                         int batch, int T, int H, int P, int N, int G, int R, int nt)
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
            uint32_t anc[MAXN];
            int par[MAXN];
            SUF(tree_anc)(parents, b, T, anc, par);
            float dts[MAXL], cum[MAXL], Cl[T * N], coef[MAXL * MAXN], yv[T * P];
            const ATYPE *Bj[MAXL], *xj[MAXL];
            float run = 0.0f;
            for (int j = 0; j < h0; j++) {
                const int row = (org + j) & (R - 1);
                dts[j] = dtr[((size_t)s * H + h) * R + row];
                Bj[j] = Br + (((size_t)s * G + g) * R + row) * N;
                xj[j] = xr + (((size_t)s * H + h) * R + row) * P;
                run += dts[j];
                cum[j] = run;
            }
            const float tot = run, etot = expf(fminf(Ah * tot, 0.0f));
            for (int t = 0; t < T; t++) {              /* tree prefix: parents come first (topological order) */
                const int j = h0 + t;
                float d = dt[((size_t)b * T + t) * H + h] + (dt_bias ? dt_bias[h] : 0.0f);
                dts[j] = softplus ? softplus_f(d) : d;
                Bj[j] = Bm + (((size_t)b * T + t) * G + g) * N;
                xj[j] = x + (((size_t)b * T + t) * H + h) * P;
                cum[j] = (par[t] < 0 ? tot : cum[h0 + par[t]]) + dts[j];
            }
            for (int t = 0; t < T; t++) {
                const ATYPE *Ct = Cm + (((size_t)b * T + t) * G + g) * N;
                for (int n = 0; n < N; n++) Cl[t * N + n] = LDA(Ct + n);
            }
            for (int j = 0; j < J; j++) {
                const float *bc = bcs + (((size_t)s * G + g) * R + j) * T;
                for (int t = 0; t < T; t++) {
                    const float cp = cum[h0 + t];
                    float c = 0.0f;
                    if (j < h0) {
                        if (fl)
                            c = expf(fminf(Ah * (cp - tot), 0.0f)) * dts[j] * expf(fminf(Ah * (tot - cum[j]), 0.0f));
                        else
                            c = dts[j] * expf(fminf(Ah * (cp - cum[j]), 0.0f));
                    } else if ((anc[t] >> (j - h0)) & 1u) {
                        c = dts[j] * expf(fminf(Ah * (cp - cum[j]), 0.0f));
                    } else {
                        /* another branch: never multiplied in (a NaN there must not leak into this node) */
                        coef[j * MAXN + t] = 0.0f;
                        continue;
                    }
                    coef[j * MAXN + t] = c * bc[t];
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
            SUF(m2_window_outputs)(yv, coef, MAXN, xj, J, cum, h0, fl, Ah, tot, etot, x, z, D, out, b, h, T, H, P);
            if (fl && h0 > 0) SUF(m2_fold_history)(S, h0, dts, cum, tot, etot, Ah, xj, Bj, P, N);
            SUF(m2_ring_append)(xr, dtr, Br, x, Bm, dts + h0, s, b, h, g, h % hpg == 0, org + h0, T, H, G, P, N, R);
        }
    }
}

/* GDN / KDA ReplaySSM tree verify: the chain verify's program (gdn_ring_program, gdn_spec_body.h: the history
 * part, S_h k_s and S_h q_s from one pass over each checkpoint row, and the flush fold are unchanged) with the
 * window's delta-rule system restricted to ancestors: G_s = G_parent(s) + g_s (tree prefix of the log decays, a
 * [K] row per node for KDA),
 *   A[s, c] = beta_s e(s, c) (k_s . k_c) for c a strict ancestor of s,
 *   U_s,i = beta_s (v_s,i - (S_h exp(G_s) k_s)_i) - sum over strict ancestors c of A[s, c] U_c,i
 *   (forward substitution in topological order: an ancestor's U is final before its descendants read it),
 *   o_s,i = (S_h exp(G_s) q_s)_i + sum over ancestors-or-self c of e(s, c) (k_c . q_s) U_c,i,
 * e(s, c) = exp(min(G_s - G_c, 0)) (per key channel inside the dots for KDA). The sums skip other branches
 * outright (a NaN there must not leak). (U_s, k_s, g_s) go to the node's ring row. */
void SUF(gdn_tree_replay)(STYPE *state, ATYPE *ur, ATYPE *kr, float *gr, const int32_t *wp, const int32_t *origin,
                          const int32_t *is_flush, const int32_t *parents, const ATYPE *q, const ATYPE *k,
                          const ATYPE *v, const float *g, const float *beta, float scale, int l2norm, ATYPE *out,
                          const int32_t *slots, int batch, int T, int H, int HV, int K, int V, int R, int pc, int nt)
{
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
    for (int b = 0; b < batch; b++) {
        for (int hv = 0; hv < HV; hv++) {
            if (slots[b] < 0) continue;
            uint32_t anc[MAXN];
            int par[MAXN];
            SUF(tree_anc)(parents, b, T, anc, par);
            SUF(gdn_ring_program)(state, ur, kr, gr, wp, origin, is_flush, par, anc, q, k, v, g, beta, scale, l2norm,
                                  out, slots, batch, b, hv, T, H, HV, K, V, R, pc);
        }
    }
}
