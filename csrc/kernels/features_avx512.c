/* features_avx512.c: the tick's features on AVX-512 (F+DQ+BW+VL, with FMA): z-scores
 * (gathered, by runs, through a permute plan), the rolling windows (stats, commit, sums) and
 * the finite check on ticks.
 *
 * Decision: tails use opmask loads and stores (cheap on AVX-512, unlike AVX2's vmaskmov), so
 * nothing past a caller's buffer is read and no field goes to a scalar twin. The window
 * kernels widen to double and keep each product out of an FMA (an empty asm statement between
 * them), so they give the scalar twins' doubles bit for bit.
 */
#include "kernels.h"

#if FP_HAVE_X86
/* out = (raw[idx] - mean) * inv_std, gathered 16 at a time; the tail gathers masked */
FP_TARGET_AVX512 void fp_zscore_gather_avx512(const float *raw, const int32_t *idx,
                                              const float *mean, const float *inv_std,
                                              float *out, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i ix = _mm512_loadu_si512((const void *)(idx + i));
        __m512 v = _mm512_i32gather_ps(ix, raw, 4);
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_sub_ps(v, _mm512_loadu_ps(mean + i)),
                                                _mm512_loadu_ps(inv_std + i)));
    }
    if (i < n) {
        const __mmask16 m = fp_mask16(n - i);
        __m512i ix = _mm512_maskz_loadu_epi32(m, idx + i);
        __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, ix, raw, 4);
        __m512 z = _mm512_mul_ps(_mm512_sub_ps(v, _mm512_maskz_loadu_ps(m, mean + i)),
                                 _mm512_maskz_loadu_ps(m, inv_std + i));
        _mm512_mask_storeu_ps(out + i, m, z);
    }
}

/* a permute plan (fp_zstep): each step loads its 32-float window of raw (masked at raw's
 * end), picks lanes with one vpermt2ps and blends them into the group; a group's last step
 * stores it, masked only when the group is partial (a full store is what the lookup's
 * loads of the features can forward from) */
FP_TARGET_AVX512 int fp_zscore_perm_avx512(const float *raw, const fp_zstep *steps, int n,
                                           const float *mean, const float *inv_std,
                                           float *out) {
    __m512 v = _mm512_setzero_ps();
    /* NaN (quiet 0x01, signalling 0x80) or +-Inf (0x08, 0x10) in a loaded lane; masked-off
     * lanes load as 0 */
    __mmask16 bad = 0;
    for (int t = 0; t < n; t++) {
        const fp_zstep *s = &steps[t];
        const float *b = raw + s->win;
        const __m512i ix = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)s->p));
        const __m512 lo = _mm512_maskz_loadu_ps(s->ld_lo, b);
        const __m512 hi = _mm512_maskz_loadu_ps(s->ld_hi, b + 16);
        bad |= (__mmask16)(_mm512_fpclass_ps_mask(lo, 0x99) | _mm512_fpclass_ps_mask(hi, 0x99));
        const __m512 x = _mm512_permutex2var_ps(lo, ix, hi);
        v = _mm512_mask_mov_ps(v, s->take, x);
        if (s->store) {
            const int o = s->out;
            if (s->store == 0xFFFFu) {
                _mm512_storeu_ps(out + o, _mm512_mul_ps(_mm512_sub_ps(v, _mm512_loadu_ps(mean + o)),
                                                        _mm512_loadu_ps(inv_std + o)));
            } else {
                const __mmask16 m = s->store;
                const __m512 z = _mm512_mul_ps(_mm512_sub_ps(v, _mm512_maskz_loadu_ps(m, mean + o)),
                                               _mm512_maskz_loadu_ps(m, inv_std + o));
                _mm512_mask_storeu_ps(out + o, m, z);
            }
        }
    }
    return bad == 0;
}

/* out[o + j] = (raw[r + j] - mean[o + j]) * inv_std[o + j] over each run, 16 lanes a step;
 * the last step of a run is masked on load and store (writes nothing past the run) */
FP_TARGET_AVX512 void fp_zscore_runs_avx512(const float *raw, const int32_t *runs,
                                            int n_runs, const float *mean,
                                            const float *inv_std, float *out) {
    for (int k = 0; k < n_runs; k++) {
        const float *x = raw + runs[3 * k];
        const int o = runs[3 * k + 1], len = runs[3 * k + 2];
        int j = 0;
        for (; j + 16 <= len; j += 16) {
            __m512 z = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + j),
                                                   _mm512_loadu_ps(mean + o + j)),
                                     _mm512_loadu_ps(inv_std + o + j));
            _mm512_storeu_ps(out + o + j, z);
        }
        if (j < len) {
            const __mmask16 m = fp_mask16(len - j);
            __m512 z = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + j),
                                                   _mm512_maskz_loadu_ps(m, mean + o + j)),
                                     _mm512_maskz_loadu_ps(m, inv_std + o + j));
            _mm512_mask_storeu_ps(out + o + j, m, z);
        }
    }
}

/* rolling mean and std of fields j..j+7 (lanes past n_w masked off) in double, the same
 * operations as the scalar twin (so bit-identical to it); window_stats and window_zscore
 * share it. Each product rounded on its own, as the scalar twin's (built without FMA): GCC
 * contracts a product into the addition or subtraction after it (one vfmadd), and
 * q/n - mu^2 cancels, so the fused form gives another std than scalar, ~1% apart; the empty
 * asm statements keep the products apart. */
FP_TARGET_AVX512 static inline void fp_wstats8_avx512(const float *raw, const int32_t *w_idx,
                                                      const float *ref, const double *sum,
                                                      const double *sumsq, const float *old,
                                                      __m512d vn, int j, __mmask8 m,
                                                      __m256 *pm, __m256 *ps,
                                                      const double *thr, double lim,
                                                      __mmask8 *heal) {
    __m256i ix = _mm256_maskz_loadu_epi32(m, w_idx + j);
    __m256 xf = _mm256_mmask_i32gather_ps(_mm256_setzero_ps(), m, ix, raw, 4);
    const __m512d r = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, ref + j));
    __m512d x = _mm512_sub_pd(_mm512_cvtps_pd(xf), r);
    __m512d xx = _mm512_mul_pd(x, x);
    __asm__("" : "+v"(xx));
    __m512d s = _mm512_maskz_loadu_pd(m, sum + j), q = _mm512_maskz_loadu_pd(m, sumsq + j);
    if (old) {
        /* the commit's order, (sum - o) + x, so that thr's flag is its heal flag */
        __m512d o = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, old + j)), r);
        __m512d oo = _mm512_mul_pd(o, o);
        __asm__("" : "+v"(oo));
        s = _mm512_add_pd(_mm512_sub_pd(s, o), x);
        q = _mm512_add_pd(_mm512_sub_pd(q, oo), xx);
        if (thr) {
            __m512d ss = _mm512_mul_pd(s, s);
            __asm__("" : "+v"(ss));
            *heal |= _mm512_mask_cmp_pd_mask(m, oo, _mm512_mul_pd(_mm512_set1_pd(0x1p16), q),
                                             _CMP_GT_OQ);
            *heal |= _mm512_mask_cmp_pd_mask(
                _mm512_mask_cmp_pd_mask(m, ss, _mm512_maskz_loadu_pd(m, thr + j), _CMP_GT_OQ),
                ss, _mm512_mul_pd(_mm512_set1_pd(lim), q), _CMP_GT_OQ);
        }
    } else {
        s = _mm512_add_pd(s, x);
        q = _mm512_add_pd(q, xx);
    }
    __m512d mu = _mm512_mul_pd(s, vn);
    __m512d qn = _mm512_mul_pd(q, vn), mu2 = _mm512_mul_pd(mu, mu);
    __asm__("" : "+v"(qn), "+v"(mu2));
    __m512d v = _mm512_max_pd(_mm512_sub_pd(qn, mu2), _mm512_setzero_pd());
    *pm = _mm512_cvtpd_ps(_mm512_add_pd(r, mu));
    /* the root of the float variance, scaled below 2^-100 (the scalar twin's comment) */
    const __mmask8 tiny = _mm512_cmp_pd_mask(v, _mm512_set1_pd(0x1p-100), _CMP_LT_OQ);
    const __m256 rt =
        _mm256_sqrt_ps(_mm512_cvtpd_ps(_mm512_mask_mul_pd(v, tiny, v, _mm512_set1_pd(0x1p200))));
    *ps = _mm256_mask_mul_ps(rt, tiny, rt, _mm256_set1_ps(0x1p-100f));
}

/* rolling mean/std, 8 fields a step */
FP_TARGET_AVX512 void fp_window_stats_avx512(const float *raw, const int32_t *w_idx,
                                             int n_w, const float *ref,
                                             const double *sum, const double *sumsq,
                                             const float *old, double inv_n, float *pm,
                                             float *ps) {
    const __m512d vn = _mm512_set1_pd(inv_n);
    for (int j = 0; j < n_w; j += 8) {
        const __mmask8 m = fp_mask8_from(n_w - j);
        __m256 a, d;
        fp_wstats8_avx512(raw, w_idx, ref, sum, sumsq, old, vn, j, m, &a, &d, NULL, 0.0, NULL);
        _mm256_mask_storeu_ps(pm + j, m, a);
        _mm256_mask_storeu_ps(ps + j, m, d);
    }
}

/* out = (x - mean) * inv_std */
FP_TARGET_AVX512 void fp_zscore_avx512(const float *x, const float *mean,
                                       const float *inv_std, float *out, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i),
                                                              _mm512_loadu_ps(mean + i)),
                                                _mm512_loadu_ps(inv_std + i)));
    if (i < n) {
        const __mmask16 m = fp_mask16(n - i);
        _mm512_mask_storeu_ps(out + i, m,
                              _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i),
                                                          _mm512_maskz_loadu_ps(m, mean + i)),
                                            _mm512_maskz_loadu_ps(m, inv_std + i)));
    }
}

/* 1 if all finite: an IEEE float is finite iff its exponent bits are not all 1 */
FP_TARGET_AVX512 int fp_allfinite_avx512(const float *x, int n) {
    const __m512i em = _mm512_set1_epi32(0x7f800000);
    __mmask16 bad = 0, b1 = 0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512((const void *)(x + i)), em), em);
        b1 |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512((const void *)(x + i + 16)), em), em);
    }
    for (; i < n; i += 16) {
        /* masked-off lanes load as 0, which is finite */
        const __mmask16 m = n - i >= 16 ? 0xffff : fp_mask16(n - i);
        bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_maskz_loadu_epi32(m, x + i), em), em);
    }
    return (bad | b1) == 0;
}

/* fp_window_stats_avx512 and fp_zscore_avx512 in one pass, the same operations in the same
 * order (bit-identical to the two calls; both are elementwise): pm and ps stay in registers */
FP_TARGET_AVX512 int fp_window_zscore_avx512(const float *raw, const int32_t *w_idx,
                                             int n_w, const float *ref,
                                             const double *sum, const double *sumsq,
                                             const float *old, double inv_n,
                                             const float *mean, const float *inv_std,
                                             float *feat, const double *thr) {
    const __m512d vn = _mm512_set1_pd(inv_n);
    const double *th = old ? thr : NULL;
    const double lim = th ? th[n_w] : 0.0;
    __mmask8 heal = 0;
    for (int j = 0; j < n_w; j += 8) {
        const __mmask8 m = fp_mask8_from(n_w - j);
        __m256 pm, ps;
        fp_wstats8_avx512(raw, w_idx, ref, sum, sumsq, old, vn, j, m, &pm, &ps, th, lim, &heal);
        _mm256_mask_storeu_ps(feat + j, m,
                              _mm256_mul_ps(_mm256_sub_ps(pm, _mm256_maskz_loadu_ps(m, mean + j)),
                                            _mm256_maskz_loadu_ps(m, inv_std + j)));
        _mm256_mask_storeu_ps(feat + n_w + j, m,
                              _mm256_mul_ps(_mm256_sub_ps(ps, _mm256_maskz_loadu_ps(m, mean + n_w + j)),
                                            _mm256_maskz_loadu_ps(m, inv_std + n_w + j)));
    }
    return heal != 0;
}

/* fp_window_commit_scalar 8 fields a step: the fields gathered, widened to double, the
 * same operations in the same order (each product kept apart from the sum it goes into by
 * an empty asm statement, so never fused: the scalar twin rounds it on its own); lanes past
 * n_w masked on every load and store */
FP_TARGET_AVX512 int fp_window_commit_avx512(const float *raw, const int32_t *w_idx, int n_w,
                                             const float *ref, double *sum,
                                             double *sumsq, float *row, int full,
                                             const double *thr, double *undo,
                                             double *fresh) {
    float *undo_row = undo ? (float *)(undo + 4 * n_w) : NULL;
    const __m512d lim = _mm512_set1_pd(thr[n_w]);
    __mmask8 heal = 0;
    for (int j = 0; j < n_w; j += 8) {
        const __mmask8 m = (__mmask8)(n_w - j >= 8 ? 0xFFu : (1u << (n_w - j)) - 1u);
        const __m256i ix = _mm256_maskz_loadu_epi32(m, w_idx + j);
        const __m256 xf = _mm256_mmask_i32gather_ps(_mm256_setzero_ps(), m, ix, raw, 4);
        const __m512d xd = _mm512_cvtps_pd(xf),
                      r = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, ref + j));
        const __m512d x = _mm512_sub_pd(xd, r),
                      y = _mm512_sub_pd(xd, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, ref + n_w + j)));
        __m512d xx = _mm512_mul_pd(x, x), yy = _mm512_mul_pd(y, y);
        __asm__("" : "+v"(xx), "+v"(yy));
        __m512d s = _mm512_maskz_loadu_pd(m, sum + j), q = _mm512_maskz_loadu_pd(m, sumsq + j);
        const __m256 of = _mm256_maskz_loadu_ps(m, row + j);
        const __m512d fs = _mm512_maskz_loadu_pd(m, fresh + j),
                      fq = _mm512_maskz_loadu_pd(m, fresh + n_w + j);
        if (undo) {
            _mm512_mask_storeu_pd(undo + j, m, s);
            _mm512_mask_storeu_pd(undo + n_w + j, m, q);
            _mm512_mask_storeu_pd(undo + 2 * n_w + j, m, fs);
            _mm512_mask_storeu_pd(undo + 3 * n_w + j, m, fq);
            _mm256_mask_storeu_ps(undo_row + j, m, of);
        }
        if (full) {
            const __m512d o = _mm512_sub_pd(_mm512_cvtps_pd(of), r);
            __m512d oo = _mm512_mul_pd(o, o);
            __asm__("" : "+v"(oo));
            s = _mm512_add_pd(_mm512_sub_pd(s, o), x);
            q = _mm512_add_pd(_mm512_sub_pd(q, oo), xx);
            heal |= _mm512_mask_cmp_pd_mask(m, oo, _mm512_mul_pd(q, _mm512_set1_pd(0x1p16)),
                                            _CMP_GT_OQ);
            const __m512d ss = _mm512_mul_pd(s, s);
            heal |= _mm512_mask_cmp_pd_mask(
                _mm512_mask_cmp_pd_mask(m, ss, _mm512_maskz_loadu_pd(m, thr + j), _CMP_GT_OQ),
                ss, _mm512_mul_pd(lim, q), _CMP_GT_OQ);
        } else {
            s = _mm512_add_pd(s, x);
            q = _mm512_add_pd(q, xx);
        }
        _mm512_mask_storeu_pd(sum + j, m, s);
        _mm512_mask_storeu_pd(sumsq + j, m, q);
        _mm256_mask_storeu_ps(row + j, m, xf);
        _mm512_mask_storeu_pd(fresh + j, m, _mm512_add_pd(fs, y));
        _mm512_mask_storeu_pd(fresh + n_w + j, m, _mm512_add_pd(fq, yy));
    }
    return heal != 0;
}

/* fp_window_sums_scalar 8 fields a vector (lanes past n masked), each field's rows in the
 * same order, the squares kept out of an FMA (empty asm) as the scalar twin rounds them */
FP_TARGET_AVX512 void fp_window_sums_avx512(const float *ring, int rows, int stride,
                                            int n, const float *ref, double *sum,
                                            double *sumsq) {
    for (int j = 0; j < n; j += 8) {
        const __mmask8 m = fp_mask8_from(n - j);
        const __m512d r = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, ref + j));
        __m512d s = _mm512_setzero_pd(), q = _mm512_setzero_pd();
        for (int k = 0; k < rows; k++) {
            const __m512d v = _mm512_sub_pd(
                _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, ring + (size_t)k * stride + j)), r);
            __m512d vv = _mm512_mul_pd(v, v);
            __asm__("" : "+v"(vv));
            s = _mm512_add_pd(s, v);
            q = _mm512_add_pd(q, vv);
        }
        _mm512_mask_storeu_pd(sum + j, m, s);
        _mm512_mask_storeu_pd(sumsq + j, m, q);
    }
}
#endif
