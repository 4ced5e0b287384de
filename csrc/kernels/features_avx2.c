/* features_avx2.c: the tick's features on AVX2/FMA: z-scores (gathered, by runs), the rolling
 * window stats and sums, the finite check on ticks.
 *
 * Decision: caller-owned ticks are read with unaligned loads, and a run's tail is loaded
 * masked so nothing past the caller's buffer is read. The window kernels widen to double and
 * keep each product out of an FMA (an empty asm statement between them), so they give the
 * scalar twins' doubles bit for bit; fields past the last vector go to the twin.
 */
#include "kernels.h"
#include <math.h>

#if FP_HAVE_X86
/* out = (raw[idx] - mean) * inv_std, gathered 8 at a time */
FP_TARGET_AVX2 void fp_zscore_gather_avx2(const float *raw, const int32_t *idx,
                                          const float *mean, const float *inv_std,
                                          float *out, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i ix = _mm256_loadu_si256((const __m256i *)(idx + i));
        __m256 v = _mm256_i32gather_ps(raw, ix, 4);
        __m256 z = _mm256_mul_ps(_mm256_sub_ps(v, _mm256_loadu_ps(mean + i)),
                                 _mm256_loadu_ps(inv_std + i));
        _mm256_storeu_ps(out + i, z);
    }
    for (; i < n; i++) out[i] = (raw[idx[i]] - mean[i]) * inv_std[i];
}

/* out[o + j] = (raw[r + j] - mean[o + j]) * inv_std[o + j] over each run, 8 lanes a step.
 * A run's last step loads raw masked (nothing past the run is read from the caller's
 * buffer) but stores all 8 lanes: masked stores are microcoded and slow on AMD, and the
 * lanes past the run land where the next run (or the window features) will write, or in
 * the slack the engine allocates after its buffers. */
FP_TARGET_AVX2 void fp_zscore_runs_avx2(const float *raw, const int32_t *runs, int n_runs,
                                        const float *mean, const float *inv_std,
                                        float *out) {
    for (int k = 0; k < n_runs; k++) {
        const float *x = raw + runs[3 * k];
        const int o = runs[3 * k + 1], len = runs[3 * k + 2];
        int j = 0;
        for (; j + 8 <= len; j += 8) {
            __m256 z = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j),
                                                   _mm256_loadu_ps(mean + o + j)),
                                     _mm256_loadu_ps(inv_std + o + j));
            _mm256_storeu_ps(out + o + j, z);
        }
        if (j < len) {
            __m256 z = _mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(x + j, fp_tailmask(len - j)),
                                                   _mm256_loadu_ps(mean + o + j)),
                                     _mm256_loadu_ps(inv_std + o + j));
            _mm256_storeu_ps(out + o + j, z);
        }
    }
}

/* rolling mean and std of fields j..j+3 in double (running sums are double, of values less
 * ref, see fp_features.h); window_stats and window_zscore share it so they stay
 * bit-identical. Each product is rounded on its own, as the scalar twin's (built without
 * FMA): GCC contracts a product into the addition or subtraction after it (one vfmadd), and
 * q/n - m^2 cancels, so the fused form gives another std than scalar, ~1% apart; the empty
 * asm statements keep the products apart. */
FP_TARGET_AVX2 static inline void fp_wstats4_avx2(const float *raw, const int32_t *w_idx,
                                                  const float *ref, const double *sum,
                                                  const double *sumsq, const float *old,
                                                  __m256d vn, int j, __m128 *pm, __m128 *ps,
                                                  const double *thr, double lim, int *heal) {
    const __m256d r = _mm256_cvtps_pd(_mm_loadu_ps(ref + j));
    __m256d x = _mm256_sub_pd(
        _mm256_cvtps_pd(_mm_i32gather_ps(raw, _mm_loadu_si128((const __m128i *)(w_idx + j)), 4)),
        r);
    __m256d xx = _mm256_mul_pd(x, x);
    __asm__("" : "+x"(xx));
    __m256d s = _mm256_loadu_pd(sum + j), q = _mm256_loadu_pd(sumsq + j);
    if (old) {
        /* the commit's order, (sum - o) + x, so that thr's flag is its heal flag */
        __m256d o = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(old + j)), r);
        __m256d oo = _mm256_mul_pd(o, o);
        __asm__("" : "+x"(oo));
        s = _mm256_add_pd(_mm256_sub_pd(s, o), x);
        q = _mm256_add_pd(_mm256_sub_pd(q, oo), xx);
        if (thr) {
            __m256d ss = _mm256_mul_pd(s, s);
            __asm__("" : "+x"(ss));
            const __m256d a = _mm256_cmp_pd(oo, _mm256_mul_pd(_mm256_set1_pd(0x1p16), q),
                                            _CMP_GT_OQ);
            const __m256d b = _mm256_and_pd(
                _mm256_cmp_pd(ss, _mm256_loadu_pd(thr + j), _CMP_GT_OQ),
                _mm256_cmp_pd(ss, _mm256_mul_pd(_mm256_set1_pd(lim), q), _CMP_GT_OQ));
            *heal |= _mm256_movemask_pd(_mm256_or_pd(a, b));
        }
    } else {
        s = _mm256_add_pd(s, x);
        q = _mm256_add_pd(q, xx);
    }
    __m256d m = _mm256_mul_pd(s, vn);
    __m256d qn = _mm256_mul_pd(q, vn), m2 = _mm256_mul_pd(m, m);
    __asm__("" : "+x"(qn), "+x"(m2));
    __m256d v = _mm256_max_pd(_mm256_sub_pd(qn, m2), _mm256_setzero_pd());
    *pm = _mm256_cvtpd_ps(_mm256_add_pd(r, m));
    /* the root of the float variance, scaled below 2^-100 (the scalar twin's comment) */
    const __m256d tiny = _mm256_cmp_pd(v, _mm256_set1_pd(0x1p-100), _CMP_LT_OQ);
    const __m256d vs = _mm256_mul_pd(v, _mm256_blendv_pd(_mm256_set1_pd(1.0),
                                                         _mm256_set1_pd(0x1p200), tiny));
    *ps = _mm_mul_ps(_mm_sqrt_ps(_mm256_cvtpd_ps(vs)),
                     _mm256_cvtpd_ps(_mm256_blendv_pd(_mm256_set1_pd(1.0),
                                                      _mm256_set1_pd(0x1p-100), tiny)));
}

/* rolling mean/std, 4 fields a step */
FP_TARGET_AVX2 void fp_window_stats_avx2(const float *raw, const int32_t *w_idx, int n_w,
                                         const float *ref, const double *sum,
                                         const double *sumsq, const float *old,
                                         double inv_n, float *pm, float *ps) {
    const __m256d vn = _mm256_set1_pd(inv_n);
    int j = 0;
    for (; j + 4 <= n_w; j += 4) {
        __m128 m, d;
        fp_wstats4_avx2(raw, w_idx, ref, sum, sumsq, old, vn, j, &m, &d, NULL, 0.0, NULL);
        _mm_storeu_ps(pm + j, m);
        _mm_storeu_ps(ps + j, d);
    }
    if (j < n_w)
        fp_window_stats_scalar(raw, w_idx + j, n_w - j, ref + j, sum + j, sumsq + j,
                               old ? old + j : NULL, inv_n, pm + j, ps + j);
}

/* out = (x - mean) * inv_std */
FP_TARGET_AVX2 void fp_zscore_avx2(const float *x, const float *mean, const float *inv_std,
                                   float *out, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 z = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(mean + i)),
                                 _mm256_loadu_ps(inv_std + i));
        _mm256_storeu_ps(out + i, z);
    }
    for (; i < n; i++) out[i] = (x[i] - mean[i]) * inv_std[i];
}

/* 1 if all finite: an IEEE float is finite iff its exponent bits are not all 1 */
FP_TARGET_AVX2 int fp_allfinite_avx2(const float *x, int n) {
    const __m256i em = _mm256_set1_epi32(0x7f800000);
    __m256i bad = _mm256_setzero_si256(), b1 = bad, b2 = bad, b3 = bad;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i *p = (const __m256i *)(x + i);
        b1 = _mm256_or_si256(b1, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256(p), em), em));
        b2 = _mm256_or_si256(b2, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256(p + 1), em), em));
        b3 = _mm256_or_si256(b3, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256(p + 2), em), em));
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256(p + 3), em), em));
    }
    bad = _mm256_or_si256(_mm256_or_si256(bad, b1), _mm256_or_si256(b2, b3));
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), em);
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(v, em));
    }
    if (!_mm256_testz_si256(bad, bad)) return 0;
    for (; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* fp_window_sums_scalar 4 fields a vector, each field's rows in the same order; the
 * squares kept out of an FMA (empty asm), as the scalar twin rounds them; fields past the
 * last 4 by the twin */
FP_TARGET_AVX2 void fp_window_sums_avx2(const float *ring, int rows, int stride, int n,
                                        const float *ref, double *sum, double *sumsq) {
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const __m256d r = _mm256_cvtps_pd(_mm_loadu_ps(ref + j));
        __m256d s = _mm256_setzero_pd(), q = _mm256_setzero_pd();
        for (int k = 0; k < rows; k++) {
            const __m256d v = _mm256_sub_pd(
                _mm256_cvtps_pd(_mm_loadu_ps(ring + (size_t)k * stride + j)), r);
            __m256d vv = _mm256_mul_pd(v, v);
            __asm__("" : "+x"(vv));
            s = _mm256_add_pd(s, v);
            q = _mm256_add_pd(q, vv);
        }
        _mm256_storeu_pd(sum + j, s);
        _mm256_storeu_pd(sumsq + j, q);
    }
    if (j < n) fp_window_sums_scalar(ring + j, rows, stride, n - j, ref + j, sum + j, sumsq + j);
}

/* fp_window_stats_avx2 and fp_zscore_avx2 in one pass, the same operations in the same
 * order (so bit-identical to the two calls): pm and ps stay in registers instead of going
 * through a scratch buffer whose 16-byte stores the 32-byte z-score loads could not forward */
FP_TARGET_AVX2 int fp_window_zscore_avx2(const float *raw, const int32_t *w_idx, int n_w,
                                         const float *ref, const double *sum,
                                         const double *sumsq, const float *old,
                                         double inv_n, const float *mean,
                                         const float *inv_std, float *feat,
                                         const double *thr) {
    const __m256d vn = _mm256_set1_pd(inv_n);
    const double *th = old ? thr : NULL;
    const double lim = th ? th[n_w] : 0.0;
    int heal = 0;
    int j = 0;
    for (; j + 4 <= n_w; j += 4) {
        __m128 pm, ps;
        fp_wstats4_avx2(raw, w_idx, ref, sum, sumsq, old, vn, j, &pm, &ps, th, lim, &heal);
        _mm_storeu_ps(feat + j, _mm_mul_ps(_mm_sub_ps(pm, _mm_loadu_ps(mean + j)),
                                           _mm_loadu_ps(inv_std + j)));
        _mm_storeu_ps(feat + n_w + j, _mm_mul_ps(_mm_sub_ps(ps, _mm_loadu_ps(mean + n_w + j)),
                                                 _mm_loadu_ps(inv_std + n_w + j)));
    }
    /* the last fields by the twin, one at a time (its out are feat[j] and feat[n_w + j]) */
    for (; j < n_w; j++) {
        float f[2];
        const float mj[2] = {mean[j], mean[n_w + j]}, ij[2] = {inv_std[j], inv_std[n_w + j]};
        double t[2] = {th ? th[j] : 0.0, lim};
        heal |= fp_window_zscore_scalar(raw, w_idx + j, 1, ref + j, sum + j, sumsq + j,
                                        old ? old + j : NULL, inv_n, mj, ij, f, th ? t : NULL);
        feat[j] = f[0];
        feat[n_w + j] = f[1];
    }
    return heal != 0;
}
#endif
