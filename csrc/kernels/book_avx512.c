/* book_avx512.c: the live book's elementwise passes eight doubles at a time (book_scalar.c
 * holds the twins and what each computes); the same roundings, so the same bits. */
#pragma GCC optimize("fp-contract=off")
#include "kernels.h"
#include <float.h>

#if FP_HAVE_X86
FP_TARGET_AVX512 void fp_ewma8_avx512(const double *prev, const double *x, const double *alpha,
                                      double *out, int rows) {
    const __m512d a = _mm512_loadu_pd(alpha);
    for (int s = 0; s < rows; s++) {
        const __m512d p = _mm512_loadu_pd(prev + 8 * s);
        const __m512d d = _mm512_sub_pd(_mm512_set1_pd(x[s]), p);
        _mm512_storeu_pd(out + 8 * s, _mm512_add_pd(p, _mm512_mul_pd(a, d)));
    }
}

FP_TARGET_AVX512 int fp_narrow_f32_avx512(const double *o, float *r, int n) {
    const __m512 lim = _mm512_set1_ps(FLT_MAX);
    __mmask16 ok = 0xffff;
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = fp_mask16(n - i < 16 ? n - i : 16);
        const __m256 lo = _mm512_cvtpd_ps(_mm512_maskz_loadu_pd((__mmask8)m, o + i));
        const __m256 hi = _mm512_cvtpd_ps(_mm512_maskz_loadu_pd((__mmask8)(m >> 8), o + i + 8));
        const __m512 f = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
        _mm512_mask_storeu_ps(r + i, m, f);
        ok &= _mm512_mask_cmp_ps_mask(m, _mm512_abs_ps(f), lim, _CMP_LE_OQ) | (__mmask16)~m;
    }
    return ok == 0xffff ? -1 : fp_narrow_f32_scalar(o, r, n);
}
#endif
