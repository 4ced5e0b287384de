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
 */
#ifndef FP_CACHE_H
#define FP_CACHE_H

#include "fp_simd.h"
#include <math.h>

typedef struct {
    float norm;           /* |cached features| */
    float signal, confidence;
    uint32_t run;         /* consecutive hits since the last computation */
    int64_t computed_ns;  /* when the cached result was computed */
    int64_t last_ns;      /* last tick seen for this symbol */
    uint32_t valid;
    uint32_t pad[7];
} fp_slot;               /* 64 bytes, features follow */

typedef struct {
    float cos_threshold;
    float norm_tol;
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

/* Check the guards, cheapest first; fills *norm with |f| when it computed it. */
static inline int fp_cache_lookup(const fp_kernels *k, const fp_cache_policy *p, fp_slot *s,
                                  const float *f, int n, int64_t now, float *norm) {
    *norm = -1.0f;
    if (!p->enabled) return FP_MISS_DISABLED;
    if (!s->valid) return FP_MISS_COLD;
    if (now - s->computed_ns > p->max_age_ns) return FP_MISS_AGE;
    if (s->run >= p->max_run) return FP_MISS_RUN;
    float dot, na2;
    k->dot_norm2(f, fp_slot_features(s), n, &dot, &na2);
    const float na = sqrtf(na2);
    *norm = na;
    const float nb = s->norm;
    if (na == 0.0f || nb == 0.0f) {
        /* direction undefined: only an exact zero vector matches another one */
        return (na == 0.0f && nb == 0.0f) ? FP_HIT : FP_MISS_COSINE;
    }
    if (dot < p->cos_threshold * na * nb) return FP_MISS_COSINE;
    if (fabsf(na / nb - 1.0f) > p->norm_tol) return FP_MISS_NORM;
    return FP_HIT;
}

#endif
