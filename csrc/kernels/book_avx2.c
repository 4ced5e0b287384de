/* book_avx2.c: the live book's elementwise passes four doubles at a time (book_scalar.c
 * holds the twins and what each computes); the same roundings, so the same bits. */
#pragma GCC optimize("fp-contract=off")
#include "kernels.h"
#include <float.h>
#include <math.h>

#if FP_HAVE_X86
/* Ten doubles are loaded as three vectors, at 0, 4 and 6: the last two overlap, which an AND
 * of lanes (a check) or an OR of lane bits (a difference mask) takes twice to the same end. */

/* 0 < x < inf (gt) or 0 <= x < inf, lane by lane; NaN fails both */
FP_TARGET_AVX2 static inline __m256d fp_pos4(__m256d x, int gt) {
    const __m256d z = _mm256_setzero_pd();
    const __m256d lo = gt ? _mm256_cmp_pd(x, z, _CMP_GT_OQ) : _mm256_cmp_pd(x, z, _CMP_GE_OQ);
    return _mm256_and_pd(lo, _mm256_cmp_pd(x, _mm256_set1_pd(INFINITY), _CMP_LT_OQ));
}

/* the lanes of ten values at p that pass fp_pos4, ANDed into three vectors' worth */
FP_TARGET_AVX2 static inline __m256d fp_pos10(const double *p, int gt) {
    return _mm256_and_pd(_mm256_and_pd(fp_pos4(_mm256_loadu_pd(p), gt),
                                       fp_pos4(_mm256_loadu_pd(p + 4), gt)),
                         fp_pos4(_mm256_loadu_pd(p + 6), gt));
}

/* p[i] <= p[i - 1] (desc) or p[i] >= p[i - 1], i = 1..9: levels 1-4, 5-8, 6-9 against the
 * level before each */
FP_TARGET_AVX2 static inline __m256d fp_ordered10(const double *p, int desc) {
    __m256d ok = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
    static const int at[3] = {1, 5, 6};
    for (int j = 0; j < 3; j++) {
        const __m256d c = _mm256_loadu_pd(p + at[j]), b = _mm256_loadu_pd(p + at[j] - 1);
        ok = _mm256_and_pd(ok, desc ? _mm256_cmp_pd(c, b, _CMP_LE_OQ)
                                    : _mm256_cmp_pd(c, b, _CMP_GE_OQ));
    }
    return ok;
}

FP_TARGET_AVX2 int fp_book_ok_avx2(const double *bp, const double *bs, const double *ap,
                                   const double *as) {
    const __m256d px = _mm256_and_pd(fp_pos10(bp, 1), fp_pos10(ap, 1));
    const __m256d sz = _mm256_and_pd(fp_pos10(bs, 0), fp_pos10(as, 0));
    const __m256d ord = _mm256_and_pd(fp_ordered10(bp, 1), fp_ordered10(ap, 0));
    return _mm256_movemask_pd(_mm256_and_pd(_mm256_and_pd(px, sz), ord)) == 0xf;
}

/* bits 0-9: x[i] != old[i] */
FP_TARGET_AVX2 static inline uint64_t fp_diff10(const double *x, const double *old) {
    const int m0 = _mm256_movemask_pd(
        _mm256_cmp_pd(_mm256_loadu_pd(x), _mm256_loadu_pd(old), _CMP_NEQ_UQ));
    const int m1 = _mm256_movemask_pd(
        _mm256_cmp_pd(_mm256_loadu_pd(x + 4), _mm256_loadu_pd(old + 4), _CMP_NEQ_UQ));
    const int m2 = _mm256_movemask_pd(
        _mm256_cmp_pd(_mm256_loadu_pd(x + 6), _mm256_loadu_pd(old + 6), _CMP_NEQ_UQ));
    return (uint64_t)(m0 | m1 << 4 | m2 << 6);
}

FP_TARGET_AVX2 uint64_t fp_book_diff_avx2(const double *x0, const double *x1, const double *x2,
                                          const double *x3, const double *old) {
    return fp_diff10(x0, old) | fp_diff10(x1, old + 10) << 10 | fp_diff10(x2, old + 20) << 20
           | fp_diff10(x3, old + 30) << 30;
}

/* (x - y) / t at o, four lanes */
FP_TARGET_AVX2 static inline void fp_subdiv4(double *o, __m256d x, __m256d y, __m256d t) {
    _mm256_storeu_pd(o, _mm256_div_pd(_mm256_sub_pd(x, y), t));
}

FP_TARGET_AVX2 void fp_book_prices_avx2(const double *bpx, const double *apx, double mid,
                                        double tick, double *o) {
    const __m256d t = _mm256_set1_pd(tick), m = _mm256_set1_pd(mid);
    static const int at[3] = {0, 4, 6}, gap[3] = {0, 4, 5};
    for (int j = 0; j < 3; j++) {
        fp_subdiv4(o + at[j], _mm256_loadu_pd(bpx + at[j]), m, t);
        fp_subdiv4(o + 10 + at[j], _mm256_loadu_pd(apx + at[j]), m, t);
        /* gaps 0-3, 4-7, 5-8 */
        const int g = gap[j];
        fp_subdiv4(o + 84 + g, _mm256_loadu_pd(bpx + g), _mm256_loadu_pd(bpx + g + 1), t);
        fp_subdiv4(o + 93 + g, _mm256_loadu_pd(apx + g + 1), _mm256_loadu_pd(apx + g), t);
    }
    o[60] = (apx[0] - bpx[0]) / tick;
}

FP_TARGET_AVX2 void fp_book_imbalance_avx2(const double *b, const double *a, double *out) {
    static const int at[3] = {0, 4, 6};
    for (int j = 0; j < 3; j++) {
        const __m256d vb = _mm256_loadu_pd(b + at[j]), va = _mm256_loadu_pd(a + at[j]);
        const __m256d tot = _mm256_add_pd(vb, va);
        const __m256d pos = _mm256_cmp_pd(tot, _mm256_setzero_pd(), _CMP_GT_OQ);
        /* a lane with no depth divides by 0 or less and is masked to +0 */
        _mm256_storeu_pd(out + at[j], _mm256_and_pd(pos, _mm256_div_pd(_mm256_sub_pd(vb, va), tot)));
    }
}

FP_TARGET_AVX2 void fp_ewma8_avx2(const double *prev, const double *x, const double *alpha,
                                  double *out, int rows) {
    const __m256d a0 = _mm256_loadu_pd(alpha), a1 = _mm256_loadu_pd(alpha + 4);
    for (int s = 0; s < rows; s++) {
        const __m256d xs = _mm256_set1_pd(x[s]);
        const __m256d p0 = _mm256_loadu_pd(prev + 8 * s), p1 = _mm256_loadu_pd(prev + 8 * s + 4);
        _mm256_storeu_pd(out + 8 * s,
                         _mm256_add_pd(p0, _mm256_mul_pd(a0, _mm256_sub_pd(xs, p0))));
        _mm256_storeu_pd(out + 8 * s + 4,
                         _mm256_add_pd(p1, _mm256_mul_pd(a1, _mm256_sub_pd(xs, p1))));
    }
}

FP_TARGET_AVX2 int fp_narrow_f32_avx2(const double *o, float *r, int n) {
    const __m256 lim = _mm256_set1_ps(FLT_MAX);
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 f = _mm256_set_m128(_mm256_cvtpd_ps(_mm256_loadu_pd(o + i + 4)),
                                         _mm256_cvtpd_ps(_mm256_loadu_pd(o + i)));
        _mm256_storeu_ps(r + i, f);
        ok = _mm256_and_ps(ok, _mm256_cmp_ps(_mm256_and_ps(f, abs), lim, _CMP_LE_OQ));
    }
    const int bad = _mm256_movemask_ps(ok) != 0xff;
    if (i < n || bad) {
        const int k = fp_narrow_f32_scalar(o + i, r + i, n - i);
        if (!bad) return k < 0 ? -1 : i + k;
        return fp_narrow_f32_scalar(o, r, n);
    }
    return -1;
}
#endif
