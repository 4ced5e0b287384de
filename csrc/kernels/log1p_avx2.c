/* log1p_avx2.c: log1p of a batch, four doubles at a time, bit for bit glibc's (see
 * log1p_scalar.c, its twin).
 *
 * Decision: branch-free. Every lane runs every path of fdlibm's log1p (tiny x, k = 0, the
 * reduction 1 + x = 2^k (1 + f), |f| < 2^-20, f = 0, inf and NaN) and the lane's own path is
 * picked by mask, so the roundings are the scalar path's. The six fusions glibc's build has
 * are the _mm256_fmadd_pd here; fp-contract=off keeps the compiler from fusing the others
 * (GCC fuses a mul intrinsic into an add intrinsic otherwise).
 */
#pragma GCC optimize("fp-contract=off")
#include "kernels.h"
#include "log1p_consts.h"
#include <math.h>

#if FP_HAVE_X86
#define I64(v) _mm256_set1_epi64x((long long)(v))
#define D(v) _mm256_set1_pd(v)

/* log1p of four lanes; *fb: the lanes (bits 0-3) left to libm (x <= -2^-29, -NaN) */
FP_TARGET_AVX2 static inline __m256d fp_log1p4(__m256d x, int *fb) {
    const __m256i bits = _mm256_castpd_si256(x);
    const __m256i ab = _mm256_and_si256(bits, I64(0x7fffffffffffffffULL));
    const __m256i tiny = _mm256_cmpgt_epi64(I64(FP_L1P_TINY), ab);
    const __m256i negl = _mm256_cmpgt_epi64(I64(FP_L1P_NEGL), ab);
    const __m256i kpath = _mm256_cmpgt_epi64(ab, I64(FP_L1P_K0 - 1));
    const __m256i big = _mm256_cmpgt_epi64(ab, I64(FP_L1P_BIG - 1));
    const __m256i special = _mm256_cmpgt_epi64(ab, I64(0x7fefffffffffffffULL));
    const __m256i neg = _mm256_cmpgt_epi64(_mm256_setzero_si256(), bits);
    *fb = _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_andnot_si256(tiny, neg)));
    /* 1 + x = 2^k u, u normalized into [sqrt(2)/2, sqrt(2)), c the rounding of 1 + x / u */
    const __m256d u = _mm256_blendv_pd(_mm256_add_pd(D(1.0), x), x, _mm256_castsi256_pd(big));
    const __m256i ub = _mm256_castpd_si256(u);
    __m256i k = _mm256_sub_epi64(_mm256_srli_epi64(ub, 52), I64(1023));
    const __m256d num = _mm256_blendv_pd(_mm256_sub_pd(x, _mm256_sub_pd(u, D(1.0))),
                                         _mm256_sub_pd(D(1.0), _mm256_sub_pd(u, x)),
                                         _mm256_castsi256_pd(_mm256_cmpgt_epi64(k, I64(0))));
    const __m256d c = _mm256_andnot_pd(_mm256_castsi256_pd(big), _mm256_div_pd(num, u));
    __m256i hu = _mm256_and_si256(_mm256_srli_epi64(ub, 32), I64(0xfffff));
    const __m256i half = _mm256_cmpgt_epi64(hu, I64(0x6a09d));
    k = _mm256_sub_epi64(k, half);
    const __m256i nb = _mm256_or_si256(
        _mm256_and_si256(ub, I64(0x000fffffffffffffULL)),
        _mm256_blendv_epi8(I64(0x3ff0000000000000ULL), I64(0x3fe0000000000000ULL), half));
    hu = _mm256_blendv_epi8(hu, _mm256_srli_epi64(_mm256_sub_epi64(I64(0x100000), hu), 2), half);
    /* k = 0 lanes (x < 0.41422): f = x, and hu is taken as not 0 */
    const __m256d kp = _mm256_castsi256_pd(kpath);
    const __m256d f = _mm256_blendv_pd(x, _mm256_sub_pd(_mm256_castsi256_pd(nb), D(1.0)), kp);
    k = _mm256_and_si256(k, kpath);
    const __m256d hu0 = _mm256_castsi256_pd(
        _mm256_and_si256(kpath, _mm256_cmpeq_epi64(hu, _mm256_setzero_si256())));
    const __m256d k0 = _mm256_castsi256_pd(_mm256_cmpeq_epi64(k, _mm256_setzero_si256()));
    const __m256d kd = _mm256_sub_pd(
        _mm256_castsi256_pd(_mm256_add_epi64(k, _mm256_castpd_si256(D(0x1.8p52)))), D(0x1.8p52));
    const __m256d hfsq = _mm256_mul_pd(_mm256_mul_pd(D(0.5), f), f);
    const __m256d t = _mm256_fmadd_pd(kd, D(FP_L1P_LN2_LO), c);
    /* log1p(f) = f - (hfsq - s (hfsq + R(s^2))) */
    const __m256d s = _mm256_div_pd(f, _mm256_add_pd(D(2.0), f)), z = _mm256_mul_pd(s, s);
    const __m256d z2 = _mm256_mul_pd(z, z), z4 = _mm256_mul_pd(z2, z2);
    const __m256d z6 = _mm256_mul_pd(z2, z4);
    const __m256d R2 = _mm256_fmadd_pd(z, D(FP_L1P_LP3), D(FP_L1P_LP2));
    const __m256d R3 = _mm256_fmadd_pd(z, D(FP_L1P_LP5), D(FP_L1P_LP4));
    const __m256d R4 = _mm256_fmadd_pd(z, D(FP_L1P_LP7), D(FP_L1P_LP6));
    __m256d R = _mm256_fmadd_pd(z, D(FP_L1P_LP1), _mm256_mul_pd(z2, R2));
    R = _mm256_fmadd_pd(z4, R3, R);
    R = _mm256_fmadd_pd(z6, R4, R);
    const __m256d w = _mm256_mul_pd(s, _mm256_add_pd(hfsq, R));
    const __m256d main0 = _mm256_sub_pd(f, _mm256_sub_pd(hfsq, w));
    const __m256d maink = _mm256_fmsub_pd(
        kd, D(FP_L1P_LN2_HI), _mm256_sub_pd(_mm256_sub_pd(hfsq, _mm256_add_pd(t, w)), f));
    /* |f| < 2^-20: log1p(f) = f - hfsq (1 - 2/3 f) */
    const __m256d R0 = _mm256_mul_pd(_mm256_fnmadd_pd(f, D(FP_L1P_TWO3), D(1.0)), hfsq);
    const __m256d small0 = _mm256_sub_pd(f, R0);
    const __m256d smallk = _mm256_fmsub_pd(kd, D(FP_L1P_LN2_HI),
                                           _mm256_sub_pd(_mm256_sub_pd(R0, t), f));
    const __m256d zerok = _mm256_andnot_pd(k0, _mm256_fmadd_pd(kd, D(FP_L1P_LN2_HI), t));
    const __m256d f0 = _mm256_cmp_pd(f, _mm256_setzero_pd(), _CMP_EQ_OQ);
    const __m256d small = _mm256_blendv_pd(_mm256_blendv_pd(smallk, small0, k0), zerok, f0);
    __m256d y = _mm256_blendv_pd(_mm256_blendv_pd(maink, main0, k0), small, hu0);
    y = _mm256_blendv_pd(y, _mm256_add_pd(x, x), _mm256_castsi256_pd(special));
    y = _mm256_blendv_pd(y, _mm256_fnmadd_pd(_mm256_mul_pd(x, x), D(0.5), x),
                         _mm256_castsi256_pd(tiny));
    return _mm256_blendv_pd(y, x, _mm256_castsi256_pd(negl));
}

/* y[i] = log1p(x[i]), i < n */
FP_TARGET_AVX2 void fp_log1p_avx2(const double *x, double *y, int n) {
    int i = 0, fb;
    for (; i + 4 <= n; i += 4) {
        _mm256_storeu_pd(y + i, fp_log1p4(_mm256_loadu_pd(x + i), &fb));
        for (int j = 0; fb; j++, fb >>= 1)
            if (fb & 1) y[i + j] = log1p(x[i + j]);
    }
    if (i < n) {
        double xt[4] = {0.5, 0.5, 0.5, 0.5}, yt[4];
        for (int j = i; j < n; j++) xt[j - i] = x[j];
        _mm256_storeu_pd(yt, fp_log1p4(_mm256_loadu_pd(xt), &fb));
        for (int j = i; j < n; j++) y[j] = (fb >> (j - i)) & 1 ? log1p(x[j]) : yt[j - i];
    }
}
#endif
