/* cache_avx512.c: the cache look's dot products and norms on AVX-512 (F+DQ+BW+VL, with FMA).
 *
 * Decision: the double sums widen each 16 floats to two 8-lane halves, the two FMA chains per
 * quantity; the float32 sums keep 32 interleaved chains reduced pairwise, inside the rounding
 * bound fp_cache.h relies on (FP_DOTF_ROUNDINGS). Tails load masked: masked lanes are 0.0,
 * add nothing and read nothing past n.
 */
#include "kernels.h"

#if FP_HAVE_X86
/* 16 floats of a and b into the double accumulators: d += a*b, s += a*a (low / high halves) */
FP_TARGET_AVX512 static inline void fp_dot_norm2_step16(__m512 av, __m512 bv, __m512d *d0,
                                                        __m512d *d1, __m512d *s0, __m512d *s1) {
    const __m512d alo = _mm512_cvtps_pd(_mm512_castps512_ps256(av));
    const __m512d ahi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(av, 1));
    *d0 = _mm512_fmadd_pd(alo, _mm512_cvtps_pd(_mm512_castps512_ps256(bv)), *d0);
    *d1 = _mm512_fmadd_pd(ahi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(bv, 1)), *d1);
    *s0 = _mm512_fmadd_pd(alo, alo, *s0);
    *s1 = _mm512_fmadd_pd(ahi, ahi, *s1);
}

/* dot = sum a*b, na2 = sum a*a in double (see fp_dot_norm2_scalar): products of floats are
 * exact in double, so this differs from the scalar and AVX2 twins only by the order of a
 * double sum (~1e-16 relative), far below any cosine threshold the cache uses */
FP_TARGET_AVX512 void fp_dot_norm2_avx512(const float *a, const float *b, int n,
                                          double *dot, double *na2) {
    __m512d d0 = _mm512_setzero_pd(), d1 = d0, s0 = d0, s1 = d0;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        fp_dot_norm2_step16(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), &d0, &d1, &s0, &s1);
    if (i < n) {
        /* masked lanes load as 0.0 and add nothing */
        const __mmask16 m = fp_mask16(n - i);
        fp_dot_norm2_step16(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i),
                            &d0, &d1, &s0, &s1);
    }
    *dot = _mm512_reduce_add_pd(_mm512_add_pd(d0, d1));
    *na2 = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

/* dot = sum a*b, na2 = sum a*a, nb2 = sum b*b in float32: 2 accumulators of 16 lanes per sum
 * (32 chains, term i in chain i mod 32, the tail keeping each term's chain), 2 -> 1 then
 * 16 lanes -> 1 pairwise: at most ceil(n/32) + 5 roundings a term, inside
 * FP_DOTF_ROUNDINGS(n) (fp_cache.h's error bound relies on it) */
FP_TARGET_AVX512 static inline float fp_hsum512_pairwise(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

/* dot = sum a*b, na2 = sum a*a, nb2 = sum b*b in float32 (the chains described above) */
FP_TARGET_AVX512 void fp_dot_norms_f32_avx512(const float *a, const float *b, int n,
                                              float *dot, float *na2, float *nb2) {
    __m512 d0 = _mm512_setzero_ps(), d1 = d0, a0 = d0, a1 = d0, b0 = d0, b1 = d0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 x = _mm512_loadu_ps(a + i), y = _mm512_loadu_ps(b + i);
        d0 = _mm512_fmadd_ps(x, y, d0); a0 = _mm512_fmadd_ps(x, x, a0); b0 = _mm512_fmadd_ps(y, y, b0);
        x = _mm512_loadu_ps(a + i + 16); y = _mm512_loadu_ps(b + i + 16);
        d1 = _mm512_fmadd_ps(x, y, d1); a1 = _mm512_fmadd_ps(x, x, a1); b1 = _mm512_fmadd_ps(y, y, b1);
    }
    if (i < n) {
        /* masked lanes load as 0.0 and add nothing */
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : fp_mask16(n - i);
        const __m512 x = _mm512_maskz_loadu_ps(m, a + i), y = _mm512_maskz_loadu_ps(m, b + i);
        d0 = _mm512_fmadd_ps(x, y, d0); a0 = _mm512_fmadd_ps(x, x, a0); b0 = _mm512_fmadd_ps(y, y, b0);
    }
    if (i + 16 < n) {
        const __mmask16 m = fp_mask16(n - i - 16);
        const __m512 x = _mm512_maskz_loadu_ps(m, a + i + 16), y = _mm512_maskz_loadu_ps(m, b + i + 16);
        d1 = _mm512_fmadd_ps(x, y, d1); a1 = _mm512_fmadd_ps(x, x, a1); b1 = _mm512_fmadd_ps(y, y, b1);
    }
    *dot = fp_hsum512_pairwise(_mm512_add_ps(d0, d1));
    *na2 = fp_hsum512_pairwise(_mm512_add_ps(a0, a1));
    *nb2 = fp_hsum512_pairwise(_mm512_add_ps(b0, b1));
}

FP_TARGET_AVX512 static inline void fp_diff_norms_step16(__m512 x, __m512 y, __m512 *d,
                                                         __m512 *e, __m512 *sa, __m512 *sb) {
    const __m512 df = _mm512_sub_ps(x, y);
    *d = _mm512_fmadd_ps(df, df, *d);
    *e = _mm512_fmadd_ps(df, _mm512_add_ps(x, y), *e);
    *sa = _mm512_fmadd_ps(x, x, *sa);
    *sb = _mm512_fmadd_ps(y, y, *sb);
}

/* dd = sum (a-b)^2, de = sum (a-b)(a+b), na2, nb2 in float32 with fp_dot_norms_f32_avx512's
 * chains and reduction (32 chains, 2 -> 1, 16 lanes -> 1 pairwise); masked lanes load as 0.0,
 * add nothing and read nothing past n */
FP_TARGET_AVX512 void fp_diff_norms_f32_avx512(const float *a, const float *b, int n,
                                               float *dd, float *de, float *na2,
                                               float *nb2) {
    __m512 d0 = _mm512_setzero_ps(), d1 = d0, e0 = d0, e1 = d0, a0 = d0, a1 = d0, b0 = d0,
           b1 = d0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        fp_diff_norms_step16(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), &d0, &e0, &a0, &b0);
        fp_diff_norms_step16(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), &d1, &e1,
                             &a1, &b1);
    }
    if (i < n) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : fp_mask16(n - i);
        fp_diff_norms_step16(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i),
                             &d0, &e0, &a0, &b0);
    }
    if (i + 16 < n) {
        const __mmask16 m = fp_mask16(n - i - 16);
        fp_diff_norms_step16(_mm512_maskz_loadu_ps(m, a + i + 16),
                             _mm512_maskz_loadu_ps(m, b + i + 16), &d1, &e1, &a1, &b1);
    }
    *dd = fp_hsum512_pairwise(_mm512_add_ps(d0, d1));
    *de = fp_hsum512_pairwise(_mm512_add_ps(e0, e1));
    *na2 = fp_hsum512_pairwise(_mm512_add_ps(a0, a1));
    *nb2 = fp_hsum512_pairwise(_mm512_add_ps(b0, b1));
}

/* fp_dot_norm2_avx512's chains for dot and |a|^2, and two more for |b|^2 in the same order
 * and reduction, so *dot and *na2 equal dot_norm2(a, b) and *nb2 equals dot_norm2(b, b)'s
 * na2 bit for bit (the cache keeps |b|^2 from one and compares with the other) */
FP_TARGET_AVX512 static inline void fp_dot_norms3_step16(__m512 av, __m512 bv, __m512d *d0,
                                                         __m512d *d1, __m512d *s0, __m512d *s1,
                                                         __m512d *t0, __m512d *t1) {
    const __m512d blo = _mm512_cvtps_pd(_mm512_castps512_ps256(bv));
    const __m512d bhi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(bv, 1));
    fp_dot_norm2_step16(av, bv, d0, d1, s0, s1);
    *t0 = _mm512_fmadd_pd(blo, blo, *t0);
    *t1 = _mm512_fmadd_pd(bhi, bhi, *t1);
}

/* dot = sum a*b, na2 = sum a*a, nb2 = sum b*b in double (fp_dot_norms3_step16's chains) */
FP_TARGET_AVX512 void fp_dot_norms_f64_avx512(const float *a, const float *b, int n,
                                              double *dot, double *na2, double *nb2) {
    __m512d d0 = _mm512_setzero_pd(), d1 = d0, s0 = d0, s1 = d0, t0 = d0, t1 = d0;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        fp_dot_norms3_step16(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), &d0, &d1, &s0, &s1,
                             &t0, &t1);
    if (i < n) {
        const __mmask16 m = fp_mask16(n - i);
        fp_dot_norms3_step16(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i),
                             &d0, &d1, &s0, &s1, &t0, &t1);
    }
    *dot = _mm512_reduce_add_pd(_mm512_add_pd(d0, d1));
    *na2 = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    *nb2 = _mm512_reduce_add_pd(_mm512_add_pd(t0, t1));
}
#endif
