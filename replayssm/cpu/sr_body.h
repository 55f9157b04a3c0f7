/* Stochastic-rounding stores of the AR kernels (float16_sr / bfloat16_sr; the rule and the Philox draws are in
 * kernels.c), included by kernels_body.h once per (state dtype, activation dtype) pair. */

/* State stores that may round stochastically (float16_sr / bfloat16_sr, kernels.c): sr NULL is the plain store
 * (a cast); else SR with the draws of elements e .. (their flat index in the slot's [heads, a, b] block). Only a
 * 16-bit state's instantiation has SR_FMT != 0, so an fp32 state's kernels keep the plain store alone. */
static inline void SUF(st8)(STYPE *p, v8f v, const sr_ctx *sr, uint32_t e)
{
    if (SR_FMT && sr) { float t[8]; v8_store(t, v); sr_store8(p, t, sr, e); }
    else STS8(p, v);
}
static inline void SUF(st1)(STYPE *p, float v, const sr_ctx *sr, uint32_t e)
{
    if (SR_FMT && sr) sr_store1(p, v, sr, e);
    else STS(p, v);
}
/* The SR context of one write of slot s (key: sr_seed and the slot's counter sr_step[s], read here, before the
 * kernel's serial tail advances it), or NULL: no counter passed (a plain format) or an fp32 state. */
static inline const sr_ctx *SUF(sr_of)(sr_ctx *buf, const int32_t *sr_step, uint32_t seed, uint32_t mask, int s)
{
    if (!SR_FMT || !sr_step) return NULL;
    *buf = sr_make(seed, sr_step[s], s, mask, SR_FMT);
    return buf;
}

/* defined in kernels_body.h, after this header */
static inline void SUF(prefetch_l2)(const STYPE *row, int N);
static inline float SUF(ssu_row)(STYPE *row, int N, float a, float xd, const float *Bv, const float *Cv,
                                 const sr_ctx *sr, uint32_t e);
static inline float SUF(gdn_row)(STYPE *row, int K, float alpha, const float *av, float bt, float vi,
                                 const float *kv, const float *qv, const sr_ctx *sr, uint32_t e);

/* The rows of one head of the baseline steps (m2_ssu: yv[p] = new row p . C; gdn_step: out[i] = new row i . q).
 * Each kernel calls them with a literal NULL sr for the plain store, so that inlined copy carries no SR branch per
 * row (and GDN's with a literal NULL av, its scalar decay). */
static inline void SUF(ssu_rows)(STYPE *S, const STYPE *pf, int P, int N, int64_t ss2, float a, float d,
                                 const ATYPE *xp, const float *Bv, const float *Cv, float *yv, const sr_ctx *sr,
                                 uint32_t e0)
{
    for (int p = 0; p < P; p++) {
        if (pf) SUF(prefetch_l2)(pf + p * ss2, N);
        const float xv = LDA(xp + p), xd = d * xv;
        yv[p] = SUF(ssu_row)(S + p * ss2, N, a, xd, Bv, Cv, sr, e0 + (uint32_t)p * N);
    }
}
static inline void SUF(gdn_rows)(STYPE *S, const STYPE *pf, int V, int K, int64_t ss2, float alpha, const float *av,
                                 float bt, const ATYPE *vp, ATYPE *op, const float *kv, const float *qv,
                                 const sr_ctx *sr, uint32_t e0)
{
    for (int i = 0; i < V; i++) {
        if (pf) SUF(prefetch_l2)(pf + i * ss2, K);
        STA(op + i, SUF(gdn_row)(S + i * ss2, K, alpha, av, bt, LDA(vp + i), kv, qv, sr, e0 + (uint32_t)i * K));
    }
}
