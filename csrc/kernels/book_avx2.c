/* book_avx2.c: the live book's elementwise passes four doubles at a time (book_scalar.c
 * holds the twins and what each computes); the same roundings, so the same bits. */
#pragma GCC optimize("fp-contract=off")
#include "kernels.h"
#include <float.h>

#if FP_HAVE_X86
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
