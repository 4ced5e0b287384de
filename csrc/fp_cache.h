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
 * the threshold. The vectors are first compared with float32 sums of |f - cached|^2 and
 * |f|^2 - |cached|^2 (the difference form, fp_cache_decide_f32) and a rigorous bound on
 * their error; only a pair within that bound (~1e-11 either side, in cosine, for 128
 * features of similar norms) is summed again in double, and |cached| in double is computed
 * then, once per stored key, instead of on every store.
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

/* The direction and magnitude guards from float32 sums, or FP_CACHE_UNDECIDED when the true
 * cosine or norm ratio may lie within the sums' error of a threshold.
 *
 * Difference form. A cosine from a.b, |a|^2, |b|^2 in float32 is off by ~m 2^-24 (~1e-6
 * for 128 features): at t = 0.999999 that is 1 - t itself, so no hit could be proved. With
 * D = |a - b|^2 and E = sum (a_i - b_i)(a_i + b_i) = |a|^2 - |b|^2 instead,
 *   L = 2 |a||b| (1 - cos) = |a - b|^2 - (|a| - |b|)^2 = D - E^2 / (|a| + |b|)^2,
 * and the direction guard passes iff L <= 2 tau |a||b|, tau = 1 - t. D's terms are all
 * >= 0, so its error is relative to D, which near a hit is ~2 tau |a||b| (plus the norms'
 * own difference squared), not |a||b|: the band the float sums cannot decide shrinks from
 * ~2e-6 to ~1e-11 in cosine for vectors of similar norms.
 *
 * Error bound. D, E, A = |a|^2, B = |b|^2 as diff_norms_f32 sums them: each term meets at
 * most m = FP_DOTF_ROUNDINGS(n) + 2 roundings (the kernel's contract, fp_simd.h), each a
 * factor (1 + d), |d| <= u = 2^-24, or, where a result is below 2^-126, an absolute error
 * < 2^-126: <= 2^-150 with gradual underflow, < 2^-126 where MXCSR flushes to zero (FTZ,
 * which torch.set_flush_denormal or any library built with -ffast-math sets for the whole
 * thread). A difference or sum of two floats below 2^-126 is exact, or flushed only where
 * both are below ~2^-101, which moves its term by < 2^-225; so, but for those, only the n
 * products (fused or not) and at most 63 reduction additions a sum add such an error. So
 * (Higham, sec. 3.1), with g = m u / (1 - m u), e0 = (n + 64) 2^-125 (twice the errors, for
 * their growth and the 2^-225s) and the exact values D*, E*, A*, B*:
 *   |D - D*| <= g D* + e0,   |A - A*| <= g A* + e0 (B alike),
 *   |E - E*| <= g sum |a_i - b_i||a_i + b_i| + e0 <= g r s + e0,
 * r = |a - b| = sqrt(D*), s = |a| + |b| (Cauchy-Schwarz, then |a + b| <= s). Sums below
 * 2^-64 go to the double path, so e0 <= x min(A, B), x = 3n 2^-53 (3n 2^-117 >= (n + 64)
 * 2^-125 for n >= 1; gradual underflow needs only 2^-96 but this is what FTZ needs, and a
 * look is then UNDECIDED for |f| or |c| < 2^-32 only). Denormals-are-zero (DAZ, set with
 * FTZ) reads a subnormal component as 0: the sums are then those of vectors within
 * sqrt(n) 2^-126 of f and c, both >= 2^-32 long, which moves a cosine or a norm ratio by
 * < sqrt(n) 2^-92: far inside the slack of the margins below (mg keeps 3 2^-54 beyond
 * 1 - t's rounding; eps2 is about twice the double path's error). Then A* is in
 * [A ca_lo, A ca_hi], ca_lo = 1 / (1 + h), ca_hi = 1 / (1 - h), h = g + 2x (B alike),
 * N = |a||b| is in [ca_lo, ca_hi] sqrt(A B), and e0 <= x (1 + h) N.
 *   Upper bound (hit side). Take S = 2 ca_hi (A + B) >= 2 (A* + B*) >= s^2, y = |E| / sqrt(S)
 * and z = g r + e0 / s. |E*| / s >= |E| / s - z >= y - z, so E*^2 / s^2 >= y^2 - 2 y z (if
 * y < z the right side is < 0); and y <= |E| / s <= ||a| - |b|| + z <= r + z. With r <= s and
 * e0 / s^2 <= 1/4, 2 y z <= (2 g + 4 g^2) D* + 3 e0, and D* <= (D + e0) / (1 - g), so
 *   L <= kd D - E^2 / S + 5 e0,   kd = (1 + 2 g + 4 g^2) / (1 - g).
 *   Lower bound (miss side). Any 0 < Q <= s^2 with s^2 / Q <= 9/4 gives y' = |E| / sqrt(Q)
 * <= (3/2)(r + z) and E*^2 / s^2 <= (y' + z)^2 <= y'^2 + 3 r z + 4 z^2, so with D* >=
 * (D - e0) / (1 + g),
 *   L >= kl D - E^2 / Q - 5 e0,   kl = (1 - 3 g - 8 g^2) / (1 + g).
 * Q = ca_lo (A + B + 4 A B / (A + B)) / w: 2 A B / (A + B), the harmonic mean, is <= sqrt(A B)
 * (so Q <= s^2 and s^2 / Q <= 2.01) and costs no square root.
 *   Decisions. The double path (fp_cache_decide_f64) errs by less than eps2 = (n + 8) 2^-52
 * in cosine (each of a.b, |a|^2, |b|^2 summed with at most n roundings of 2^-53 a term,
 * then two square roots and two products); 1 - t in double is off by <= 2^-54 (exact for
 * t >= 1/2); and 5 e0 <= 6 x N is 3x in 1 - cos. With mg = eps2 + 3x + 2^-52, the double
 * path hits (direction) when 1 - cos <= th = 1 - t - mg, and misses when 1 - cos >= tl =
 * 1 - t + mg. N is bounded without a square root too: 2 A B / (A + B) <= sqrt(A B) <=
 * (A + B) / 2, so with N >= ca_lo 2 A B / (A + B) a hit is proved when
 * kd D - E^2 / S <= 4 th ca_lo A B / (A + B), and with N <= ca_hi (A + B) / 2 a miss when
 * kl D - E^2 / Q >= tl ca_hi (A + B). Multiplied through by A + B (hit) or by P =
 * (A + B)^2 + 4 A B (miss; Q = ca_lo P / ((A + B) w)), neither needs a division:
 *   hit:   hx D (A + B) - hy E^2 <= hr A B,         hx = kd, hy = 1 / (2 ca_hi),
 *                                                   hr = 4 th ca_lo;
 *   miss:  P (mx D - mt (A + B)) > my E^2 (A + B),  mx = kl, mt = tl ca_hi, my = w / ca_lo
 * (a miss is strict: with E = 0 and the bracket 0, nothing is proved; the constants are
 * then widened, below). Each of these means gives up a little against sqrt(A B): in
 * cosine, ~(|a| / |b| - 1)^2 / 2 of 1 - t (the HM and AM for N) and ~(|a| / |b| - 1)^4 / 8
 * (S and Q): nothing for ticks of similar norms, 2e-10 and 1e-9 at norms 1% apart and
 * t = 0.999999 (such a pair that close to t goes to the double sums).
 *   In double: A B is exact; with A, B in [2^-64, 2^128], nonzero D, E >= 2^-149 and th, tl
 * >= 2^-100 when not <= 0 (1 - t is a multiple of 2^-53 near 0), every product here is 0
 * or a normal double, and so is the miss side's bracket (a difference of doubles >= 2^-150:
 * 0 or >= 2^-202), so each operation errs by at most 2^-53 relative. Each constant above
 * carries w^2 (w = 1 + 2^-48 covers over 30 such roundings, more than any term has) toward
 * the safe side of its term: on the hit side the computed hx D (A + B) is at least its
 * exact value, hy E^2 and hr A B at most theirs; on the miss side the other way. A
 * difference's own rounding, relative to its result, is then within the margin the other
 * side of the comparison carries.
 *   The magnitude guard |na / nb - 1| <= tol is (1 - tol)^2 B* <= A* <= (1 + tol)^2 B*, on
 * A* in [A c_lo, A c_hi], B* likewise (c_lo, c_hi: ca_lo, ca_hi widened by eps2, which
 * covers the double path's ratio). */
enum { FP_CACHE_UNDECIDED = -1 };

/* The constants of the float32 look for one policy and feature count, computed once per
 * engine (fp_cache_plan_init), so their divisions stay off every lookup's latency. */
typedef struct {
    fp_cache_policy pol;
    int f32;              /* the float32 look can decide anything (t > 0, tol >= 0) */
    int f32_hit;          /* it can prove a hit (th > 0) */
    int all_miss;         /* tl <= 0 (t above 1 by more than the margin): every pair misses */
    double hx, hy, hr;    /* hit test */
    double mx, mt, my;    /* miss test */
    double c_lo, c_hi, up_lo, up_hi, dn_lo, dn_hi;  /* magnitude test */
} fp_cache_plan;

/* cos_threshold less 2^-50 relative: the double bound t |f| |c| rounds up by as much as 3 ulps,
 * and an exact repeat (cosine 1) must not miss on that; set once in the plan, off the lookup */
static inline double fp_cache_cos_bound(double t) { return t - fabs(t) * 0x1p-50; }

/* norm_tol plus (1 + tol) 2^-50: na / nb rounds by as much as 3 ulps, and a tick exactly
 * (1 +- tol) times its key is a tie the guard passes, on every kernel set alike */
static inline double fp_cache_tol_bound(double tol) { return tol + (1.0 + tol) * 0x1p-50; }

static inline void fp_cache_plan_init(fp_cache_plan *pl, const fp_cache_policy *p, int n) {
    const double t = fp_cache_cos_bound(p->cos_threshold), tol = fp_cache_tol_bound(p->norm_tol);
    const double m = FP_DOTF_ROUNDINGS(n) + 2, u = 0x1p-24, w = 1.0 + 0x1p-48, w2 = w * w;
    const double g = m * u / (1.0 - m * u), x = 3.0 * n * 0x1p-53, h = g + 2.0 * x;
    const double eps2 = (n + 8) * 0x1p-52;
    const double ca_lo = 1.0 / (1.0 + h), ca_hi = 1.0 / (1.0 - h);
    const double kd = (1.0 + 2.0 * g + 4.0 * g * g) / (1.0 - g);
    const double kl = (1.0 - 3.0 * g - 8.0 * g * g) / (1.0 + g);
    /* the margin first: added to or subtracted from 1 - t in one rounding, th and tl keep
     * their relative accuracy however close to 0 they are */
    const double mg = eps2 + 3.0 * x + 0x1p-52;
    const double th = (1.0 - t) - mg, tl = (1.0 - t) + mg;
    pl->pol = *p;
    pl->pol.cos_threshold = t;   /* the double path decides on the same slackened bounds */
    pl->pol.norm_tol = tol;
    /* h < 2^-10 (n up to ~250k) keeps the second-order terms inside their bounds above; a
     * NaN threshold or tolerance fails these comparisons and leaves everything to double */
    pl->f32 = t > 0.0 && tol >= 0.0 && h < 0x1p-10;
    pl->f32_hit = th > 0.0;
    pl->all_miss = !(tl > 0.0);
    pl->hx = kd * w2;
    pl->hy = 1.0 / (2.0 * ca_hi) / w2;
    pl->hr = 4.0 * th * ca_lo / w2;
    pl->mx = kl / w2;
    pl->mt = tl * ca_hi * w2;
    pl->my = w * w2 / ca_lo;
    const double gn = h * w + eps2;
    pl->c_lo = 1.0 / (1.0 + gn) / w;
    pl->c_hi = 1.0 / (1.0 - gn) * w;
    const double up = (1.0 + tol) * (1.0 + tol), dn = tol < 1.0 ? (1.0 - tol) * (1.0 - tol) : 0.0;
    pl->up_lo = up / w;
    pl->up_hi = up * w;
    pl->dn_lo = dn / w;
    pl->dn_hi = dn * w;
}

/* The direction and magnitude guards from diff_norms_f32's sums under plan pl (the bounds
 * above); FP_CACHE_UNDECIDED when they cannot settle a guard. A handful of multiplications
 * after the sums, no division, square root or square of a sum: the miss test first (most
 * lookups), the hit test in parallel. */
static inline int fp_cache_decide_f32(const fp_cache_plan *pl, float dd, float de, float a2,
                                      float b2) {
    if (!(pl->f32 && a2 >= 0x1p-64f && a2 <= FLT_MAX && b2 >= 0x1p-64f && b2 <= FLT_MAX &&
          dd <= FLT_MAX && fabsf(de) <= FLT_MAX))
        return FP_CACHE_UNDECIDED;
    const double D = dd, E = de, A = a2, B = b2;
    const double ab = A * B, sum = A + B, e2 = E * E;
    if (pl->all_miss ||
        (sum * sum + 4.0 * ab) * (D * pl->mx - sum * pl->mt) > e2 * (sum * pl->my))
        return FP_MISS_COSINE;
    if (!(pl->f32_hit && D * pl->hx * sum - E * (E * pl->hy) <= ab * pl->hr))
        return FP_CACHE_UNDECIDED;
    /* magnitude, on the true squares: A* in [A c_lo, A c_hi], B* likewise; up_lo = up / w,
     * up_hi = up w (dn alike) cover the rounding of these products */
    const double a_lo = A * pl->c_lo, a_hi = A * pl->c_hi, b_lo = B * pl->c_lo,
                 b_hi = B * pl->c_hi;
    if (a_hi < pl->up_lo * b_lo && a_lo > pl->dn_hi * b_hi) return FP_HIT;
    if (a_lo > pl->up_hi * b_hi || a_hi < pl->dn_lo * b_lo) return FP_MISS_NORM;
    return FP_CACHE_UNDECIDED;
}

/* The float32 first look of features f against a cached key c: one pass of diff_norms_f32,
 * then fp_cache_decide_f32 */
static inline int fp_cache_look_f32(const fp_kernels *k, const fp_cache_plan *pl, const float *f,
                                    const float *c, int n) {
    float dd, de, a2, b2;
    k->diff_norms_f32(f, c, n, &dd, &de, &a2, &b2);
    return fp_cache_decide_f32(pl, dd, de, a2, b2);
}

/* The guards decided in double: the reference the float32 look must agree with. |cached|
 * is summed as dot_norm2 sums |a| (bit-identical either way), once per stored key: in the
 * same pass as the dot product on the first lookup that needs it, kept in the slot. */
static inline int fp_cache_decide_f64(const fp_kernels *k, const fp_cache_policy *p, fp_slot *s,
                                      const float *f, int n, double *norm) {
    double dot, na2, nb2;
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
    if (dot < p->cos_threshold * na * nb) return FP_MISS_COSINE;
    if (fabs(na / nb - 1.0) > p->norm_tol) return FP_MISS_NORM;
    return FP_HIT;
}

/* Check the guards, cheapest first; fills *norm with |f| when the double path computed it
 * (else -1). The vectors are compared with float32 sums first (one pass of diff_norms_f32)
 * and in double only when that cannot settle a guard, which the float32 look's ~1e-11 band
 * in cosine makes rare. A decision is always the one the double sums would make.
 * The slot is written only to keep |cached| once computed (which changes no decision, so a
 * tick refused later changes nothing observable). */
static inline int fp_cache_lookup_plan(const fp_kernels *k, const fp_cache_plan *pl, fp_slot *s,
                                       const float *f, int n, int64_t now, double *norm) {
    const fp_cache_policy *p = &pl->pol;
    *norm = -1.0;
    if (!p->enabled) return FP_MISS_DISABLED;
    if (!s->valid) return FP_MISS_COLD;
    if (now - s->computed_ns > p->max_age_ns) return FP_MISS_AGE;
    if (s->run >= p->max_run) return FP_MISS_RUN;
    const int r = fp_cache_look_f32(k, pl, f, fp_slot_features_c(s), n);
    if (r != FP_CACHE_UNDECIDED) return r;
    return fp_cache_decide_f64(k, p, s, f, n, norm);
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
