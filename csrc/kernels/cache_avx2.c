/* cache_avx2.c: the cache look's dot products and norms on AVX2/FMA.
 *
 * Decision: the double sums widen each 8 floats to two 4-lane halves, which are also the two
 * FMA chains per quantity; the float32 sums keep 16 or 32 interleaved chains reduced
 * pairwise, inside the rounding bound fp_cache.h relies on (FP_DOTF_ROUNDINGS). Accumulators
 * are named registers, never an array a tail loop indexes. Tails load masked (vmaskmov).
 */
#include "kernels.h"

#if FP_HAVE_X86
FP_TARGET_AVX2 static inline double fp_hsum256d(__m256d v) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

/* 8 floats of a and b into the double accumulators: d += a*b, s += a*a (low / high halves) */
FP_TARGET_AVX2 static inline void fp_dot_norm2_step(__m256 av, __m256 bv, __m256d *d0, __m256d *d1,
                                                    __m256d *s0, __m256d *s1) {
    const __m256d alo = _mm256_cvtps_pd(_mm256_castps256_ps128(av));
    const __m256d ahi = _mm256_cvtps_pd(_mm256_extractf128_ps(av, 1));
    *d0 = _mm256_fmadd_pd(alo, _mm256_cvtps_pd(_mm256_castps256_ps128(bv)), *d0);
    *d1 = _mm256_fmadd_pd(ahi, _mm256_cvtps_pd(_mm256_extractf128_ps(bv, 1)), *d1);
    *s0 = _mm256_fmadd_pd(alo, alo, *s0);
    *s1 = _mm256_fmadd_pd(ahi, ahi, *s1);
}

/* dot = sum a*b, na2 = sum a*a in double (see fp_dot_norm2_scalar): each 8 floats widen to
 * two 4-lane halves, which are also the two FMA chains per quantity; the cheapest form that
 * keeps cosine decisions exact to ~1e-14. */
FP_TARGET_AVX2 void fp_dot_norm2_avx2(const float *a, const float *b, int n, double *dot,
                                      double *na2) {
    __m256d d0 = _mm256_setzero_pd(), d1 = d0, s0 = d0, s1 = d0;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        fp_dot_norm2_step(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), &d0, &d1, &s0, &s1);
    if (i < n) {
        /* masked lanes load as 0.0 and add nothing */
        const __m256i m = fp_tailmask(n - i);
        fp_dot_norm2_step(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m),
                          &d0, &d1, &s0, &s1);
    }
    *dot = fp_hsum256d(_mm256_add_pd(d0, d1));
    *na2 = fp_hsum256d(_mm256_add_pd(s0, s1));
}

FP_TARGET_AVX2 static inline float fp_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* 8 lanes (the first `len` of them, 1..8) of a and b into one chain set: d += a*b, sa += a*a,
 * sb += b*b; masked lanes load as 0.0 and add nothing */
FP_TARGET_AVX2 static inline void fp_dot_norms_tail(const float *a, const float *b, int len,
                                                    __m256 *d, __m256 *sa, __m256 *sb) {
    const __m256i m = fp_tailmask(len < 8 ? len : 8);
    const __m256 x = _mm256_maskload_ps(a, m), y = _mm256_maskload_ps(b, m);
    *d = _mm256_fmadd_ps(x, y, *d);
    *sa = _mm256_fmadd_ps(x, x, *sa);
    *sb = _mm256_fmadd_ps(y, y, *sb);
}

/* dot = sum a*b, na2 = sum a*a, nb2 = sum b*b in float32: 4 accumulators of 8 lanes per sum
 * (32 chains, term i in chain i mod 32), 4 -> 1 then 8 lanes -> 1, pairwise: at most
 * ceil(n/32) + 5 roundings a term, inside FP_DOTF_ROUNDINGS(n). Named accumulators, not an
 * array: an array indexed in the tail loop would live on the stack, every FMA through memory. */
FP_TARGET_AVX2 void fp_dot_norms_f32_avx2(const float *a, const float *b, int n,
                                           float *dot, float *na2, float *nb2) {
    __m256 d0 = _mm256_setzero_ps(), d1 = d0, d2 = d0, d3 = d0;
    __m256 a0 = d0, a1 = d0, a2 = d0, a3 = d0, b0 = d0, b1 = d0, b2 = d0, b3 = d0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 x = _mm256_loadu_ps(a + i), y = _mm256_loadu_ps(b + i);
        d0 = _mm256_fmadd_ps(x, y, d0); a0 = _mm256_fmadd_ps(x, x, a0); b0 = _mm256_fmadd_ps(y, y, b0);
        x = _mm256_loadu_ps(a + i + 8); y = _mm256_loadu_ps(b + i + 8);
        d1 = _mm256_fmadd_ps(x, y, d1); a1 = _mm256_fmadd_ps(x, x, a1); b1 = _mm256_fmadd_ps(y, y, b1);
        x = _mm256_loadu_ps(a + i + 16); y = _mm256_loadu_ps(b + i + 16);
        d2 = _mm256_fmadd_ps(x, y, d2); a2 = _mm256_fmadd_ps(x, x, a2); b2 = _mm256_fmadd_ps(y, y, b2);
        x = _mm256_loadu_ps(a + i + 24); y = _mm256_loadu_ps(b + i + 24);
        d3 = _mm256_fmadd_ps(x, y, d3); a3 = _mm256_fmadd_ps(x, x, a3); b3 = _mm256_fmadd_ps(y, y, b3);
    }
    /* the tail keeps each term's chain (i mod 32) */
    if (i < n) fp_dot_norms_tail(a + i, b + i, n - i, &d0, &a0, &b0);
    if (i + 8 < n) fp_dot_norms_tail(a + i + 8, b + i + 8, n - i - 8, &d1, &a1, &b1);
    if (i + 16 < n) fp_dot_norms_tail(a + i + 16, b + i + 16, n - i - 16, &d2, &a2, &b2);
    if (i + 24 < n) fp_dot_norms_tail(a + i + 24, b + i + 24, n - i - 24, &d3, &a3, &b3);
    *dot = fp_hsum256(_mm256_add_ps(_mm256_add_ps(d0, d1), _mm256_add_ps(d2, d3)));
    *na2 = fp_hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    *nb2 = fp_hsum256(_mm256_add_ps(_mm256_add_ps(b0, b1), _mm256_add_ps(b2, b3)));
}

/* 8 lanes (the first `len`, 1..8) into one chain set of fp_diff_norms_f32_avx2; masked lanes
 * load as 0.0 and add nothing */
FP_TARGET_AVX2 static inline void fp_diff_norms_step(__m256 x, __m256 y, __m256 *d, __m256 *e,
                                                     __m256 *sa, __m256 *sb) {
    const __m256 df = _mm256_sub_ps(x, y);
    *d = _mm256_fmadd_ps(df, df, *d);
    *e = _mm256_fmadd_ps(df, _mm256_add_ps(x, y), *e);
    *sa = _mm256_fmadd_ps(x, x, *sa);
    *sb = _mm256_fmadd_ps(y, y, *sb);
}

/* dd = sum (a-b)^2, de = sum (a-b)(a+b), na2, nb2 in float32: 2 accumulators of 8 lanes per
 * sum (16 chains, term i in chain i mod 16; four sums of 4 accumulators each would not fit
 * the 16 YMM registers), 2 -> 1 then 8 lanes -> 1 pairwise: at most ceil(n/16) + 5
 * roundings a term with the product's, inside FP_DOTF_ROUNDINGS(n), plus the difference
 * and the sum of each term */
FP_TARGET_AVX2 void fp_diff_norms_f32_avx2(const float *a, const float *b, int n,
                                            float *dd, float *de, float *na2, float *nb2) {
    __m256 d0 = _mm256_setzero_ps(), d1 = d0, e0 = d0, e1 = d0, a0 = d0, a1 = d0, b0 = d0,
           b1 = d0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        fp_diff_norms_step(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), &d0, &e0, &a0, &b0);
        fp_diff_norms_step(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), &d1, &e1, &a1,
                           &b1);
    }
    if (i < n) {
        const __m256i m = fp_tailmask(n - i < 8 ? n - i : 8);
        fp_diff_norms_step(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), &d0, &e0,
                           &a0, &b0);
    }
    if (i + 8 < n) {
        const __m256i m = fp_tailmask(n - i - 8);
        fp_diff_norms_step(_mm256_maskload_ps(a + i + 8, m), _mm256_maskload_ps(b + i + 8, m),
                           &d1, &e1, &a1, &b1);
    }
    *dd = fp_hsum256(_mm256_add_ps(d0, d1));
    *de = fp_hsum256(_mm256_add_ps(e0, e1));
    *na2 = fp_hsum256(_mm256_add_ps(a0, a1));
    *nb2 = fp_hsum256(_mm256_add_ps(b0, b1));
}

/* fp_dot_norm2_step's chains for dot and |a|^2, and two more for |b|^2 (low / high halves),
 * each summed and reduced as fp_dot_norm2_avx2 sums and reduces its own */
FP_TARGET_AVX2 static inline void fp_dot_norms3_step(__m256 av, __m256 bv, __m256d *d0,
                                                     __m256d *d1, __m256d *s0, __m256d *s1,
                                                     __m256d *t0, __m256d *t1) {
    const __m256d blo = _mm256_cvtps_pd(_mm256_castps256_ps128(bv));
    const __m256d bhi = _mm256_cvtps_pd(_mm256_extractf128_ps(bv, 1));
    fp_dot_norm2_step(av, bv, d0, d1, s0, s1);
    *t0 = _mm256_fmadd_pd(blo, blo, *t0);
    *t1 = _mm256_fmadd_pd(bhi, bhi, *t1);
}

/* dot = sum a*b, na2 = sum a*a, nb2 = sum b*b in double (fp_dot_norms3_step's chains) */
FP_TARGET_AVX2 void fp_dot_norms_f64_avx2(const float *a, const float *b, int n,
                                           double *dot, double *na2, double *nb2) {
    __m256d d0 = _mm256_setzero_pd(), d1 = d0, s0 = d0, s1 = d0, t0 = d0, t1 = d0;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        fp_dot_norms3_step(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), &d0, &d1, &s0, &s1,
                           &t0, &t1);
    if (i < n) {
        const __m256i m = fp_tailmask(n - i);
        fp_dot_norms3_step(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m),
                           &d0, &d1, &s0, &s1, &t0, &t1);
    }
    *dot = fp_hsum256d(_mm256_add_pd(d0, d1));
    *na2 = fp_hsum256d(_mm256_add_pd(s0, s1));
    *nb2 = fp_hsum256d(_mm256_add_pd(t0, t1));
}
#endif
