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
 * The decision is made in double: thresholds such as 0.999999 sit ~1e-6 from 1, which is
 * float32's rounding noise over a 128-term dot product (scalar and AVX2 sums would decide
 * differently). The sums run in double (exact products, ~1e-14 relative error), and the
 * thresholds and the stored norm are double, so a decision matches a float64 reference
 * whenever the true cosine is more than ~1e-12 from the threshold.
 */
#ifndef FP_CACHE_H
#define FP_CACHE_H

#include "fp_simd.h"
#include <float.h>
#include <math.h>

typedef struct {
    double norm;          /* |cached features|, from a double sum */
    float signal, confidence;
    uint32_t run;         /* consecutive hits since the last computation */
    uint32_t valid;
    int64_t computed_ns;  /* when the cached result was computed */
    int64_t last_ns;      /* last tick seen for this symbol */
    uint32_t pad[6];
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

/* Check the guards, cheapest first; fills *norm with |f| when it computed it (else -1). */
static inline int fp_cache_lookup(const fp_kernels *k, const fp_cache_policy *p, const fp_slot *s,
                                  const float *f, int n, int64_t now, double *norm) {
    *norm = -1.0;
    if (!p->enabled) return FP_MISS_DISABLED;
    if (!s->valid) return FP_MISS_COLD;
    if (now - s->computed_ns > p->max_age_ns) return FP_MISS_AGE;
    if (s->run >= p->max_run) return FP_MISS_RUN;
    double dot, na2;
    k->dot_norm2(f, fp_slot_features_c(s), n, &dot, &na2);
    /* finite float features cannot overflow a double sum of squares, so this is exactly
     * "f has a NaN/Inf": such a key matches nothing (NaN would fail no comparison below and
     * hit), and the model stage then refuses the tick */
    if (!(na2 <= DBL_MAX)) return FP_MISS_COSINE;
    const double na = sqrt(na2);
    *norm = na;
    const double nb = s->norm;
    if (na == 0.0 || nb == 0.0) {
        /* direction undefined: only an exact zero vector matches another one */
        return (na == 0.0 && nb == 0.0) ? FP_HIT : FP_MISS_COSINE;
    }
    if (dot < p->cos_threshold * na * nb) return FP_MISS_COSINE;
    if (fabs(na / nb - 1.0) > p->norm_tol) return FP_MISS_NORM;
    return FP_HIT;
}

#endif
