/* Kernel bodies, included once per (state dtype, activation dtype) pair by the source build.py generates.
 * STYPE / LDS / STS: state storage; ATYPE / LDA / STA: activation storage; SUF(name) names the variant.
 * Shapes are in the docstrings of the Python wrappers (replayssm/cpu/mamba2.py, replayssm/cpu/gdn.py). */

/* ------------------------------------------------------------------------------------------ Mamba-2 AR */

/* Baseline selective state update: per (row, head) S <- exp(A dt) S + dt x B^T; y = S C + D x, * silu(z).
 * The state is read once and written once. */
void SUF(m2_ssu)(STYPE *state, const ATYPE *x, const float *dt, const float *A, const ATYPE *Bm, const ATYPE *Cm,
                 const float *D, const ATYPE *z, const float *dt_bias, int softplus, ATYPE *out,
                 const int32_t *slots, int batch, int H, int P, int N, int G, int64_t ss0, int64_t ss1,
                 int64_t ss2, int nt)
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
            STYPE *S = state + s * ss0 + h * ss1;
            const size_t io = ((size_t)b * H + h) * P;
            for (int p = 0; p < P; p++) {
                const float xv = LDA(x + io + p), xd = d * xv;
                STYPE *row = S + p * ss2;
                float acc = 0.0f;
#pragma omp simd reduction(+:acc)
                for (int n = 0; n < N; n++) {
                    const float v = a * LDS(row + n) + xd * Bv[n];
                    STS(row + n, v);
                    acc += v * Cv[n];
                }
                float y = acc + (D ? D[h] * xv : 0.0f);
                if (z) { const float zv = LDA(z + io + p); y *= zv * sigmoid_f(zv); }
                STA(out + io + p, y);
            }
        }
    }
}

/* ReplaySSM AR step (replayssm/mamba2/decode.py has the protocol). Per (row, head) with h = write_pos:
 *   c_j inclusive prefix of the cached dt, c_tot = sum_{j<h} dt_j + dt, s_j = dt_j exp(A (c_tot - c_j)),
 *   abar = exp(A c_tot).
 *   normal, output_only (route 0): y = abar (S0 C) + sum_j s_j (B_j . C) x_j + dt (B . C) x: S0 read once;
 *   normal, state_and_output (1): each state row S_t = abar S0 + sum_j s_j x_j B_j + dt x B, y = S_t C;
 *   flush (h >= L-1): the state_and_output row, stored into the checkpoint (the only state write).
 * Normal rows append x, dt (processed) and B (by the group's first head) at buffer row h; then the cursors
 * advance in a second loop (after every program has read them). */
void SUF(m2_replay)(STYPE *state, ATYPE *xc, ATYPE *Bc, float *dtc, int32_t *wp,
                    const ATYPE *x, const float *dt, const float *A, const ATYPE *Bm, const ATYPE *Cm,
                    const float *D, const ATYPE *z, const float *dt_bias, int softplus, ATYPE *out,
                    const int32_t *slots, int batch, int H, int P, int N, int G, int L, int route, int nt)
{
    const int hpg = H / G;
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
            const size_t io = ((size_t)b * H + h) * P;
            if (!flush && route == 0) {
                float bc[MAXL];
                float bcur = 0.0f;
                for (int j = 0; j < nj; j++) {
                    float acc = 0.0f;
#pragma omp simd reduction(+:acc)
                    for (int n = 0; n < N; n++) acc += LDA(Bs + (size_t)j * N + n) * Cv[n];
                    bc[j] = sw[j] * acc;
                }
#pragma omp simd reduction(+:bcur)
                for (int n = 0; n < N; n++) bcur += Bv[n] * Cv[n];
                for (int p = 0; p < P; p++) {
                    const STYPE *row = S + (size_t)p * N;
                    float acc = 0.0f;
#pragma omp simd reduction(+:acc)
                    for (int n = 0; n < N; n++) acc += LDS(row + n) * Cv[n];
                    const float xv = LDA(x + io + p);
                    float y = abar * acc + d * bcur * xv;
                    for (int j = 0; j < nj; j++) y += bc[j] * LDA(xs + (size_t)j * P + p);
                    y += D ? D[h] * xv : 0.0f;
                    if (z) { const float zv = LDA(z + io + p); y *= zv * sigmoid_f(zv); }
                    STA(out + io + p, y);
                }
            } else {
                float Bl[(nj > 0 ? nj : 1) * N];
                for (int j = 0; j < nj; j++)
                    for (int n = 0; n < N; n++) Bl[(size_t)j * N + n] = LDA(Bs + (size_t)j * N + n);
                float r[N];
                for (int p = 0; p < P; p++) {
                    STYPE *row = S + (size_t)p * N;
                    const float xv = LDA(x + io + p), xd = d * xv;
#pragma omp simd
                    for (int n = 0; n < N; n++) r[n] = abar * LDS(row + n) + xd * Bv[n];
                    for (int j = 0; j < nj; j++) {
                        const float cj = sw[j] * LDA(xs + (size_t)j * P + p);
                        const float *Bj = Bl + (size_t)j * N;
#pragma omp simd
                        for (int n = 0; n < N; n++) r[n] += cj * Bj[n];
                    }
                    float acc = 0.0f;
                    if (flush) {
#pragma omp simd reduction(+:acc)
                        for (int n = 0; n < N; n++) { STS(row + n, r[n]); acc += r[n] * Cv[n]; }
                    } else {
#pragma omp simd reduction(+:acc)
                        for (int n = 0; n < N; n++) acc += r[n] * Cv[n];
                    }
                    float y = acc + (D ? D[h] * xv : 0.0f);
                    if (z) { const float zv = LDA(z + io + p); y *= zv * sigmoid_f(zv); }
                    STA(out + io + p, y);
                }
            }
            if (!flush) {
                memcpy(xs + (size_t)hp * P, x + io, (size_t)P * sizeof(ATYPE));
                dts[hp] = d;
                if (h % hpg == 0) memcpy(Bs + (size_t)hp * N, Bp, (size_t)N * sizeof(ATYPE));
            }
        }
    }
    for (int b = 0; b < batch; b++) {
        const int s = slots[b];
        if (s >= 0) wp[s] = wp[s] >= L - 1 ? 0 : wp[s] + 1;
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
 * S_i <- r + u k; o_i = S_i . q. One read and one write of the state. */
void SUF(gdn_step)(STYPE *state, const ATYPE *q, const ATYPE *k, const ATYPE *v, const float *g, const float *beta,
                   float scale, int l2norm, ATYPE *out, const int32_t *slots, int batch, int H, int HV, int K, int V,
                   int64_t ss0, int64_t ss1, int64_t ss2, int nt)
{
    const int gq = HV / H;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
    for (int b = 0; b < batch; b++) {
        for (int hv = 0; hv < HV; hv++) {
            const int s = slots[b];
            if (s < 0) continue;
            float qv[K], kv[K], r[K];
            SUF(gdn_qk)(q, k, ((size_t)b * H + hv / gq) * K, K, l2norm, scale, qv, kv);
            const float alpha = expf(g[(size_t)b * HV + hv]), bt = beta[(size_t)b * HV + hv];
            STYPE *S = state + s * ss0 + hv * ss1;
            const size_t io = ((size_t)b * HV + hv) * V;
            for (int i = 0; i < V; i++) {
                STYPE *row = S + i * ss2;
                float sk = 0.0f;
#pragma omp simd reduction(+:sk)
                for (int n = 0; n < K; n++) { r[n] = alpha * LDS(row + n); sk += r[n] * kv[n]; }
                const float u = bt * (LDA(v + io + i) - sk);
                float o = 0.0f;
#pragma omp simd reduction(+:o)
                for (int n = 0; n < K; n++) { const float t = r[n] + u * kv[n]; STS(row + n, t); o += t * qv[n]; }
                STA(out + io + i, o);
            }
        }
    }
}

/* ReplaySSM GDN AR step (replayssm/gdn/decode.py has the protocol). Per (row, value head), h = write_pos:
 *   G_pre_j inclusive prefix of the cached g, G_tot = sum_{j<h} g_j, w_j = exp(G_tot - G_pre_j), d0 = exp(G_tot)
 *   S_h x = d0 (S0 x) + sum_j w_j (k_j . x) u_j  for x in {k, q}: one pass over S0 with two dot products,
 *   u = beta (v - alpha S_h k), o = alpha S_h q + u (k . q).
 *   normal (h < L-1): append (u, k, g) at h; the checkpoint is not written.
 *   flush: each row S0_i <- alpha d0 S0_i + sum_j alpha w_j u_j,i k_j + u_i k, written once, right after its read. */
void SUF(gdn_replay)(STYPE *state, ATYPE *uc, ATYPE *kc, float *gc, int32_t *wp,
                     const ATYPE *q, const ATYPE *k, const ATYPE *v, const float *g, const float *beta,
                     float scale, int l2norm, ATYPE *out, const int32_t *slots, int batch, int H, int HV, int K,
                     int V, int L, int nt)
{
    const int gq = HV / H;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
    for (int b = 0; b < batch; b++) {
        for (int hv = 0; hv < HV; hv++) {
            const int s = slots[b];
            if (s < 0) continue;
            const int hk = hv / gq;
            const int hp = wp[s];
            const int flush = hp >= L - 1;
            const int nj = hp < L - 1 ? hp : L - 1;
            float qv[K], kv[K], bk[V], bq[V], Kl[(nj > 0 ? nj : 1) * K];
            SUF(gdn_qk)(q, k, ((size_t)b * H + hk) * K, K, l2norm, scale, qv, kv);
            const float gt = g[(size_t)b * HV + hv], alpha = expf(gt), bt = beta[(size_t)b * HV + hv];
            ATYPE *us = uc + ((size_t)s * HV + hv) * (size_t)L * V;
            ATYPE *ks = kc + ((size_t)s * H + hk) * (size_t)L * K;
            float *gs = gc + ((size_t)s * HV + hv) * L;
            float Gp[MAXL], w[MAXL];
            float run = 0.0f;
            for (int j = 0; j < nj; j++) { run += gs[j]; Gp[j] = run; }
            const float d0 = expf(run);
            for (int j = 0; j < nj; j++) w[j] = expf(run - Gp[j]);
            float kq = 0.0f;
            for (int n = 0; n < K; n++) kq += kv[n] * qv[n];
            for (int i = 0; i < V; i++) { bk[i] = 0.0f; bq[i] = 0.0f; }
            for (int j = 0; j < nj; j++) {
                float dk = 0.0f, dq = 0.0f;
                float *kj = Kl + (size_t)j * K;
                for (int n = 0; n < K; n++) { kj[n] = LDA(ks + (size_t)j * K + n); dk += kj[n] * kv[n]; dq += kj[n] * qv[n]; }
                const float ck = w[j] * dk, cq = w[j] * dq;
                const ATYPE *uj = us + (size_t)j * V;
#pragma omp simd
                for (int i = 0; i < V; i++) { const float t = LDA(uj + i); bk[i] += ck * t; bq[i] += cq * t; }
            }
            STYPE *S = state + ((size_t)s * HV + hv) * (size_t)V * K;
            const size_t io = ((size_t)b * HV + hv) * V;
            const float keep = alpha * d0;
            for (int i = 0; i < V; i++) {
                STYPE *row = S + (size_t)i * K;
                float a = 0.0f, c = 0.0f;
#pragma omp simd reduction(+:a, c)
                for (int n = 0; n < K; n++) { const float t = LDS(row + n); a += t * kv[n]; c += t * qv[n]; }
                const float u = bt * (LDA(v + io + i) - alpha * (d0 * a + bk[i]));
                STA(out + io + i, alpha * (d0 * c + bq[i]) + u * kq);
                if (flush) {
                    float r[K];
#pragma omp simd
                    for (int n = 0; n < K; n++) r[n] = keep * LDS(row + n) + u * kv[n];
                    for (int j = 0; j < nj; j++) {
                        const float cj = alpha * w[j] * LDA(us + (size_t)j * V + i);
                        const float *kj = Kl + (size_t)j * K;
#pragma omp simd
                        for (int n = 0; n < K; n++) r[n] += cj * kj[n];
                    }
#pragma omp simd
                    for (int n = 0; n < K; n++) STS(row + n, r[n]);
                } else {
                    STA(us + (size_t)hp * V + i, u);
                }
            }
            if (!flush) {
                gs[hp] = gt;
                if (hv % gq == 0)
                    for (int n = 0; n < K; n++) STA(ks + (size_t)hp * K + n, kv[n]);
            }
        }
    }
    for (int b = 0; b < batch; b++) {
        const int s = slots[b];
        if (s >= 0) wp[s] = wp[s] >= L - 1 ? 0 : wp[s] + 1;
    }
}
