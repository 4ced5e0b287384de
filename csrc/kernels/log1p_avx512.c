/* log1p_avx512.c: log1p of a batch, eight doubles at a time, bit for bit glibc's (see
 * log1p_scalar.c, its twin, and log1p_avx2.c, the same steps on four lanes).
 *
 * Decision: branch-free, every path on every lane and the lane's own picked by mask
 * register; the six fusions of glibc's build are the fmadd here and fp-contract=off keeps
 * the compiler from fusing any other product into a sum.
 */
#pragma GCC optimize("fp-contract=off")
#include "kernels.h"
#include "log1p_consts.h"
#include <math.h>

#if FP_HAVE_X86
#define I64(v) _mm512_set1_epi64((long long)(v))
#define D(v) _mm512_set1_pd(v)

/* log1p of eight lanes; *fb: the lanes left to libm (x <= -2^-29, -NaN) */
FP_TARGET_AVX512 static inline __m512d fp_log1p8(__m512d x, __mmask8 *fb) {
    const __m512i bits = _mm512_castpd_si512(x);
    const __m512i ab = _mm512_and_si512(bits, I64(0x7fffffffffffffffULL));
    const __mmask8 tiny = _mm512_cmplt_epi64_mask(ab, I64(FP_L1P_TINY));
    const __mmask8 negl = _mm512_cmplt_epi64_mask(ab, I64(FP_L1P_NEGL));
    const __mmask8 kpath = _mm512_cmpge_epi64_mask(ab, I64(FP_L1P_K0));
    const __mmask8 big = _mm512_cmpge_epi64_mask(ab, I64(FP_L1P_BIG));
    const __mmask8 special = _mm512_cmpgt_epi64_mask(ab, I64(0x7fefffffffffffffULL));
    const __mmask8 neg = _mm512_cmplt_epi64_mask(bits, _mm512_setzero_si512());
    *fb = (__mmask8)(neg & ~tiny);
    /* 1 + x = 2^k u, u normalized into [sqrt(2)/2, sqrt(2)), c the rounding of 1 + x / u */
    const __m512d u = _mm512_mask_blend_pd(big, _mm512_add_pd(D(1.0), x), x);
    const __m512i ub = _mm512_castpd_si512(u);
    __m512i k = _mm512_sub_epi64(_mm512_srli_epi64(ub, 52), I64(1023));
    const __m512d num = _mm512_mask_blend_pd(_mm512_cmpgt_epi64_mask(k, I64(0)),
                                             _mm512_sub_pd(x, _mm512_sub_pd(u, D(1.0))),
                                             _mm512_sub_pd(D(1.0), _mm512_sub_pd(u, x)));
    const __m512d c = _mm512_maskz_div_pd((__mmask8)~big, num, u);
    __m512i hu = _mm512_and_si512(_mm512_srli_epi64(ub, 32), I64(0xfffff));
    const __mmask8 half = _mm512_cmpge_epi64_mask(hu, I64(0x6a09e));
    k = _mm512_mask_add_epi64(k, half, k, I64(1));
    const __m512i nb = _mm512_or_si512(
        _mm512_and_si512(ub, I64(0x000fffffffffffffULL)),
        _mm512_mask_blend_epi64(half, I64(0x3ff0000000000000ULL), I64(0x3fe0000000000000ULL)));
    hu = _mm512_mask_srli_epi64(hu, half, _mm512_sub_epi64(I64(0x100000), hu), 2);
    /* k = 0 lanes (x < 0.41422): f = x, and hu is taken as not 0 */
    const __m512d f = _mm512_mask_blend_pd(kpath, x,
                                           _mm512_sub_pd(_mm512_castsi512_pd(nb), D(1.0)));
    k = _mm512_maskz_mov_epi64(kpath, k);
    const __mmask8 hu0 = kpath & _mm512_cmpeq_epi64_mask(hu, _mm512_setzero_si512());
    const __mmask8 k0 = _mm512_cmpeq_epi64_mask(k, _mm512_setzero_si512());
    const __m512d kd = _mm512_cvtepi64_pd(k);
    const __m512d hfsq = _mm512_mul_pd(_mm512_mul_pd(D(0.5), f), f);
    const __m512d t = _mm512_fmadd_pd(kd, D(FP_L1P_LN2_LO), c);
    /* log1p(f) = f - (hfsq - s (hfsq + R(s^2))) */
    const __m512d s = _mm512_div_pd(f, _mm512_add_pd(D(2.0), f)), z = _mm512_mul_pd(s, s);
    const __m512d z2 = _mm512_mul_pd(z, z), z4 = _mm512_mul_pd(z2, z2);
    const __m512d z6 = _mm512_mul_pd(z2, z4);
    const __m512d R2 = _mm512_fmadd_pd(z, D(FP_L1P_LP3), D(FP_L1P_LP2));
    const __m512d R3 = _mm512_fmadd_pd(z, D(FP_L1P_LP5), D(FP_L1P_LP4));
    const __m512d R4 = _mm512_fmadd_pd(z, D(FP_L1P_LP7), D(FP_L1P_LP6));
    __m512d R = _mm512_fmadd_pd(z, D(FP_L1P_LP1), _mm512_mul_pd(z2, R2));
    R = _mm512_fmadd_pd(z4, R3, R);
    R = _mm512_fmadd_pd(z6, R4, R);
    const __m512d w = _mm512_mul_pd(s, _mm512_add_pd(hfsq, R));
    const __m512d main0 = _mm512_sub_pd(f, _mm512_sub_pd(hfsq, w));
    const __m512d maink = _mm512_fmsub_pd(
        kd, D(FP_L1P_LN2_HI), _mm512_sub_pd(_mm512_sub_pd(hfsq, _mm512_add_pd(t, w)), f));
    /* |f| < 2^-20: log1p(f) = f - hfsq (1 - 2/3 f) */
    const __m512d R0 = _mm512_mul_pd(_mm512_fnmadd_pd(f, D(FP_L1P_TWO3), D(1.0)), hfsq);
    const __m512d small0 = _mm512_sub_pd(f, R0);
    const __m512d smallk = _mm512_fmsub_pd(kd, D(FP_L1P_LN2_HI),
                                           _mm512_sub_pd(_mm512_sub_pd(R0, t), f));
    const __m512d zerok = _mm512_maskz_fmadd_pd((__mmask8)~k0, kd, D(FP_L1P_LN2_HI), t);
    const __mmask8 f0 = _mm512_cmp_pd_mask(f, _mm512_setzero_pd(), _CMP_EQ_OQ);
    const __m512d small = _mm512_mask_blend_pd(f0, _mm512_mask_blend_pd(k0, smallk, small0),
                                               zerok);
    __m512d y = _mm512_mask_blend_pd(hu0, _mm512_mask_blend_pd(k0, maink, main0), small);
    y = _mm512_mask_blend_pd(special, y, _mm512_add_pd(x, x));
    y = _mm512_mask_blend_pd(tiny, y, _mm512_fnmadd_pd(_mm512_mul_pd(x, x), D(0.5), x));
    return _mm512_mask_blend_pd(negl, y, x);
}

/* y[i] = log1p(x[i]), i < n */
FP_TARGET_AVX512 void fp_log1p_avx512(const double *x, double *y, int n) {
    __mmask8 fb;
    for (int i = 0; i < n; i += 8) {
        const __mmask8 m = fp_mask8_from(n - i);
        const __m512d v = _mm512_mask_loadu_pd(D(0.5), m, x + i);
        _mm512_mask_storeu_pd(y + i, m, fp_log1p8(v, &fb));
        for (unsigned j = 0, b = fb & m; b; j++, b >>= 1)
            if (b & 1) y[i + j] = log1p(x[i + j]);
    }
}
#endif
