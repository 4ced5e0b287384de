/* fp_cache.h: one result slot per symbol, looked up by true cosine similarity.
 *
 * Decision: cosine alone is not a safe key, it ignores magnitude and an MLP
 * with biases does not. A hit needs all four guards:
 *   cos(f, cached) >= cos_threshold        (direction)
 *   |norm(f) / norm(cached) - 1| <= norm_tol  (magnitude)
 *   now - computed_at <= max_age_ns        (age)
 *   consecutive hits < max_run             (forced refresh)
 * The cached vector is the one the stored result was computed from; hits do
 * not move it, so a slow drift cannot walk the key away from its result.
 * Each slot is a 64-byte header followed by the features, stride a multiple
 * of 64, so one symbol's lookup never shares a cache line with another's.
 * Decisions are the double ones: thresholds such as 0.999999 sit ~1e-6 from 1, which is
 * float32's rounding noise over a 128-term dot product (scalar and AVX2 sums would decide
 * differently). Sums in double (exact products, ~1e-14 relative error) against double
 * thresholds match a float64 reference whenever the true cosine is more than ~1e-12 from
 * the threshold. Most lookups are nowhere near a threshold, so the vectors are first
 * compared with float32 sums and a rigorous bound on their error; only a pair within that
 * bound (~2e-6 either side, in cosine, for 128 features) is summed again in double, and
 * |cached| in double is computed then, once per stored key, instead of on every store.
 */
#ifndef FP_CACHE_H
#define FP_CACHE_H

#include "fp_simd.h"
#include <float.h>
#include <math.h>

typedef struct {
    double norm;          /* |cached features| in double, or < 0 until a lookup needs it */
    float signal, confidence;
    uint32_t run;         /* consecutive hits since the last computation */
    uint32_t valid;
    int64_t computed_ns;  /* when the cached result was computed */
    int64_t last_ns;      /* last tick seen for this symbol */
    uint32_t near;        /* the last lookup hit or was close: the next one goes straight to
                           * the double sums (fp_cache_plan) */
    uint32_t pad[5];
} fp_slot;               /* 64 bytes, features follow */

typedef char fp_slot_is_64_bytes[sizeof(fp_slot) == 64 ? 1 : -1];

typedef struct {
    double cos_threshold; /* float32 cannot even hold 0.999999 to 1e-8 */
    double norm_tol;
    int64_t max_age_ns;
    uint32_t max_run;
    int enabled;
} fp_cache_policy;

/* why a lookup missed; FP_HIT when it did not */
enum { FP_HIT = 0, FP_MISS_COLD = 1, FP_MISS_AGE = 2, FP_MISS_RUN = 3, FP_MISS_COSINE = 4,
       FP_MISS_NORM = 5, FP_MISS_DISABLED = 6, FP_MISS_NREASONS = 7 };

static inline size_t fp_slot_stride(int n_feat) {
    return sizeof(fp_slot) + FP_ROUND_UP((size_t)n_feat * sizeof(float), FP_ALIGN);
}

static inline float *fp_slot_features(fp_slot *s) { return (float *)(s + 1); }
static inline const float *fp_slot_features_c(const fp_slot *s) { return (const float *)(s + 1); }

/* The direction and magnitude guards from float32 sums, or FP_CACHE_UNDECIDED when the true
 * cosine or norm ratio may lie within the sums' error of a threshold. a2, b2, d: sum a^2,
 * sum b^2, sum a*b as dot_norms_f32 computes them, each term meeting at most m roundings
 * (FP_DOTF_ROUNDINGS(n)), so (Higham, sec. 3.1, with underflow's absolute part):
 *   |a2 - |a|^2| <= g |a|^2 + e0,   |d - a.b| <= g sum|a_i b_i| + e0 <= g |a||b| + e0,
 *   g = m u / (1 - m u), u = 2^-24, e0 = 3 n 2^-149 (every operation may add 2^-150).
 * Sums below 2^-96 (where e0 could matter), non-finite or overflowed sums are left to the
 * double path, so e0 is folded into g (+2^-40); g is also widened by twice the double
 * path's own error ((n + 8) 2^-52, relative to |a||b|) and every bound by 2^-48 for the
 * arithmetic here, so a decision made here is the one fp_cache_decide_f64 would make.
 * No square root or division on the way from the sums to the decision (they would add
 * ~15 ns of latency): with N = |a||b| in [sqrt(a2 b2) c_lo, sqrt(a2 b2) c_hi],
 * c_lo = 1 / (1 + g), c_hi = 1 / (1 - g), the direction guard passes for sure when
 *   d - e0 > (t + g) N   <=  d > 0 and d^2 > (t + g)^2 c_hi^2 a2 b2,
 * and fails for sure when d + e0 < (t - g) N  <=  d < 0 or d^2 < (t - g)^2 c_lo^2 a2 b2;
 * d^2 and a2 b2 are exact in double (products of floats). The magnitude guard
 * |na / nb - 1| <= tol is (1 - tol)^2 b2 <= a2 <= (1 + tol)^2 b2 for the true squares. */
enum { FP_CACHE_UNDECIDED = -1 };

/* The constants of the float32 look for one policy and feature count, computed once per
 * engine (fp_cache_plan_init: the divisions alone are ~15 ns of latency a lookup). f32_hit
 * is 0 when the threshold leaves the float32 look no room to prove a hit (k_hi >= 1: only a
 * computed d^2 above the computed a2 b2, which rounding rarely allows, could pass); then the
 * look only proves misses, returning "undecided" where it could have said hit, and the
 * double sums decide as they would have anyway. near_band: such a policy sends the lookup
 * after a close one (true cosine >= t - 2g, where the float32 look cannot decide) straight
 * to the double sums; consecutive ticks of a symbol are alike, so the next one is likely
 * close too and the float32 pass would be wasted. */
typedef struct {
    fp_cache_policy pol;
    int f32;              /* the float32 look can decide anything (t > 0, tol >= 0) */
    int f32_lo;           /* t > g: it can prove a cosine miss */
    int f32_hit;          /* it can prove a hit */
    double k_lo, k_hi, c_lo, c_hi, up, dn, w;
    double near_band;     /* > 0: "close" is cos >= near_band (f32_hit == 0 only) */
} fp_cache_plan;

static inline void fp_cache_plan_init(fp_cache_plan *pl, const fp_cache_policy *p, int n) {
    const double t = p->cos_threshold, tol = p->norm_tol;
    pl->pol = *p;
    pl->f32 = t > 0.0 && tol >= 0.0;
    const double m = FP_DOTF_ROUNDINGS(n), u = 0x1p-24, w = 1.0 + 0x1p-48;
    const double g = m * u / (1.0 - m * u) * w + (n + 8) * 0x1p-52 + 0x1p-40;
    const double c_lo = 1.0 / (1.0 + g) / w, c_hi = 1.0 / (1.0 - g) * w;
    pl->w = w;
    pl->c_lo = c_lo;
    pl->c_hi = c_hi;
    pl->f32_lo = t > g;
    pl->k_lo = (t - g) * (t - g) * c_lo * c_lo / w;
    pl->k_hi = (t + g) * (t + g) * c_hi * c_hi * w;
    pl->up = (1.0 + tol) * (1.0 + tol);
    pl->dn = tol < 1.0 ? (1.0 - tol) * (1.0 - tol) : 0.0;
    pl->f32_hit = pl->k_hi < 1.0;
    pl->near_band = pl->f32_hit ? 0.0 : t - 2.0 * g;
}

/* The direction and magnitude guards from the float32 sums under plan pl (the bounds above);
 * FP_CACHE_UNDECIDED when they cannot settle a guard. */
static inline int fp_cache_decide_f32(const fp_cache_plan *pl, float d, float a2, float b2) {
    if (!(pl->f32 && a2 >= 0x1p-96f && a2 <= FLT_MAX && b2 >= 0x1p-96f && b2 <= FLT_MAX &&
          fabsf(d) <= FLT_MAX))
        return FP_CACHE_UNDECIDED;
    const double dd = (double)d * d, ab = (double)a2 * b2;
    /* direction */
    if (pl->f32_lo && (d < 0.0f || dd < pl->k_lo * ab)) return FP_MISS_COSINE;
    if (!(pl->f32_hit && d > 0.0f && dd > pl->k_hi * ab)) return FP_CACHE_UNDECIDED;
    /* magnitude, on the true squares: a2 in [a2 c_lo, a2 c_hi], b2 likewise */
    const double w = pl->w, up = pl->up, dn = pl->dn;
    const double a_lo = a2 * pl->c_lo, a_hi = a2 * pl->c_hi, b_lo = b2 * pl->c_lo,
                 b_hi = b2 * pl->c_hi;
    if (a_hi < up * b_lo / w && a_lo > dn * b_hi * w) return FP_HIT;
    if (a_lo > up * b_hi * w || a_hi < dn * b_lo / w) return FP_MISS_NORM;
    return FP_CACHE_UNDECIDED;
}

/* The guards decided in double: the reference the float32 look must agree with. |cached|
 * is summed as dot_norm2 sums |a| (bit-identical either way), once per stored key: in the
 * same pass as the dot product on the first lookup that needs it, kept in the slot.
 * *close: the true cosine is at least near_band (0 when near_band is 0). */
static inline int fp_cache_decide_f64(const fp_kernels *k, const fp_cache_policy *p, fp_slot *s,
                                      const float *f, int n, double near_band, double *norm,
                                      int *close) {
    double dot, na2, nb2;
    *close = 0;
    if (s->norm >= 0.0) {
        k->dot_norm2(f, fp_slot_features_c(s), n, &dot, &na2);
    } else {
        k->dot_norms_f64(f, fp_slot_features_c(s), n, &dot, &na2, &nb2);
        s->norm = sqrt(nb2);
    }
    /* finite float features cannot overflow a double sum of squares, so this is exactly
     * "f has a NaN/Inf": such a key matches nothing (NaN would fail no comparison below and
     * hit), and the model stage then refuses the tick */
    if (!(na2 <= DBL_MAX)) return FP_MISS_COSINE;
    const double na = sqrt(na2), nb = s->norm;
    *norm = na;
    if (na == 0.0 || nb == 0.0) {
        /* direction undefined: only an exact zero vector matches another one */
        return (na == 0.0 && nb == 0.0) ? FP_HIT : FP_MISS_COSINE;
    }
    *close = near_band > 0.0 && dot >= near_band * na * nb;
    if (dot < p->cos_threshold * na * nb) return FP_MISS_COSINE;
    if (fabs(na / nb - 1.0) > p->norm_tol) return FP_MISS_NORM;
    return FP_HIT;
}

/* Check the guards, cheapest first; fills *norm with |f| when the double path computed it
 * (else -1). The vectors are compared with float32 sums first (one pass, about half the
 * double pass's cost) and in double only when that cannot settle a guard: on the bench
 * stream about 1% of lookups, and every hit at a threshold within ~3e-6 of 1 (float32 sums
 * cannot tell such a hit from a miss). The lookup after a hit (and, at such a threshold,
 * after any close pair) skips the float32 pass: ticks of a symbol are alike. A decision is
 * always the double one. The slot is written only to keep |cached| once computed and the
 * last lookup's outcome (neither changes a decision, so a tick refused later changes
 * nothing observable). */
static inline int fp_cache_lookup_plan(const fp_kernels *k, const fp_cache_plan *pl, fp_slot *s,
                                       const float *f, int n, int64_t now, double *norm) {
    const fp_cache_policy *p = &pl->pol;
    *norm = -1.0;
    if (!p->enabled) return FP_MISS_DISABLED;
    if (!s->valid) return FP_MISS_COLD;
    if (now - s->computed_ns > p->max_age_ns) return FP_MISS_AGE;
    if (s->run >= p->max_run) return FP_MISS_RUN;
    if (!s->near) {
        float d, a2, b2;
        k->dot_norms_f32(f, fp_slot_features_c(s), n, &d, &a2, &b2);
        const int r = fp_cache_decide_f32(pl, d, a2, b2);
        if (r != FP_CACHE_UNDECIDED) return r;
    }
    int close;
    const int r = fp_cache_decide_f64(k, p, s, f, n, pl->near_band, norm, &close);
    s->near = r == FP_HIT || close;
    return r;
}

/* fp_cache_lookup_plan with the plan made on the spot (the kernel tests' entry point; an
 * engine makes its plan once) */
static inline int fp_cache_lookup(const fp_kernels *k, const fp_cache_policy *p, fp_slot *s,
                                  const float *f, int n, int64_t now, double *norm) {
    fp_cache_plan pl;
    fp_cache_plan_init(&pl, p, n);
    return fp_cache_lookup_plan(k, &pl, s, f, n, now, norm);
}

#endif
