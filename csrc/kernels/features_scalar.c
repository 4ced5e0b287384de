/* features_scalar.c: the tick's features without vector instructions: z-scores (gathered,
 * by runs, through a permute plan), the rolling windows (stats, commit, sums) and the finite
 * check; the reference every vector set's feature kernels are tested against.
 *
 * Decision: window sums are doubles of values less ref (fp_features.h), and this file is
 * built without FMA, so every product is rounded on its own: the vector twins keep their
 * products out of an FMA to give these doubles bit for bit.
 */
#include "kernels.h"
#include <math.h>

/* out[i] = (raw[idx[i]] - mean[i]) * inv_std[i] */
void fp_zscore_gather_scalar(const float *raw, const int32_t *idx, const float *mean,
                             const float *inv_std, float *out, int n) {
    for (int i = 0; i < n; i++) out[i] = (raw[idx[i]] - mean[i]) * inv_std[i];
}

/* out[o + j] = (raw[r + j] - mean[o + j]) * inv_std[o + j] over each run (r, o, len) */
void fp_zscore_runs_scalar(const float *raw, const int32_t *runs, int n_runs,
                           const float *mean, const float *inv_std, float *out) {
    for (int k = 0; k < n_runs; k++) {
        const float *x = raw + runs[3 * k];
        const int o = runs[3 * k + 1], len = runs[3 * k + 2];
        for (int j = 0; j < len; j++) out[o + j] = (x[j] - mean[o + j]) * inv_std[o + j];
    }
}

/* one loop per case, without a branch inside, so the compiler can pair the double updates;
 * each sum sees "minus the old value, plus the new one" in that order. This file is built
 * without FMA, so every product is rounded on its own (the vector sets keep them apart). */
int fp_window_commit_scalar(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                            double *sum, double *sumsq, float *row, int full,
                            const double *thr, double *undo, double *fresh) {
    const float *fref = ref + n_w;
    const double lim = thr[n_w];
    if (undo) {
        float *undo_row = (float *)(undo + 4 * n_w);
        for (int j = 0; j < n_w; j++) {
            undo[j] = sum[j];
            undo[n_w + j] = sumsq[j];
            undo[2 * n_w + j] = fresh[j];
            undo[3 * n_w + j] = fresh[n_w + j];
            undo_row[j] = row[j];
        }
    }
    int heal = 0;
    if (full) {
        for (int j = 0; j < n_w; j++) {
            const float xf = raw[w_idx[j]];
            const double x = (double)xf - (double)ref[j], o = (double)row[j] - (double)ref[j];
            const double y = (double)xf - (double)fref[j];
            sum[j] = (sum[j] - o) + x;
            sumsq[j] = (sumsq[j] - o * o) + x * x;
            heal |= o * o > 0x1p16 * sumsq[j];
            heal |= sum[j] * sum[j] > thr[j] && sum[j] * sum[j] > lim * sumsq[j];
            fresh[j] += y;
            fresh[n_w + j] += y * y;
            row[j] = xf;
        }
    } else {
        for (int j = 0; j < n_w; j++) {
            const float xf = raw[w_idx[j]];
            const double x = (double)xf - (double)ref[j], y = (double)xf - (double)fref[j];
            sum[j] += x;
            sumsq[j] += x * x;
            fresh[j] += y;
            fresh[n_w + j] += y * y;
            row[j] = xf;
        }
    }
    return heal;
}

/* field by field within a row, row after row (built without FMA: each square rounded) */
void fp_window_sums_scalar(const float *ring, int rows, int stride, int n, const float *ref,
                           double *sum, double *sumsq) {
    for (int j = 0; j < n; j++) sum[j] = sumsq[j] = 0.0;
    for (int r = 0; r < rows; r++) {
        const float *row = ring + (size_t)r * stride;
        for (int j = 0; j < n; j++) {
            const double v = (double)row[j] - (double)ref[j];
            sum[j] += v;
            sumsq[j] += v * v;
        }
    }
}

/* a permute plan (fp_zstep) lane by lane: the reference the AVX-512 permutes must match;
 * 0 when a float the step loads (its window's lanes under ld_lo / ld_hi) is NaN or Inf */
int fp_zscore_perm_scalar(const float *raw, const fp_zstep *steps, int n, const float *mean,
                          const float *inv_std, float *out) {
    float v[16] = {0};
    int finite = 1;
    for (int t = 0; t < n; t++) {
        const fp_zstep *s = &steps[t];
        for (int j = 0; j < 16; j++) {
            if (s->ld_lo >> j & 1u) finite &= isfinite(raw[s->win + j]) != 0;
            if (s->ld_hi >> j & 1u) finite &= isfinite(raw[s->win + 16 + j]) != 0;
        }
        for (int j = 0; j < 16; j++)
            if (s->take >> j & 1u) v[j] = raw[s->win + s->p[j]];
        if (s->store)
            for (int j = 0; j < 16; j++)
                if (s->store >> j & 1u) out[s->out + j] = (v[j] - mean[s->out + j]) * inv_std[s->out + j];
    }
    return finite;
}

/* one field of fp_window_stats_scalar: rolling mean/std with the new tick in (and `old` out),
 * the sums being of values less ref (fp_features.h); with old and thr (NULL: none), whether
 * the commit of this tick heals the window: its sums (the same doubles as the commit
 * kernel's) against its criteria (fp_simd.h, window_commit) */
static inline int fp_wstat1_scalar(double xf, double r, double sum, double sumsq,
                                   const float *old, double inv_n, float *pm, float *ps,
                                   const double *thr, double lim) {
    const double x = xf - r;
    double s = sum, q = sumsq;
    int heal = 0;
    if (old) {
        /* the commit's order, (sum - o) + x, so that the flag is its heal flag */
        const double o = (double)*old - r;
        s = (s - o) + x;
        q = (q - o * o) + x * x;
        if (thr) heal = o * o > 0x1p16 * q || (s * s > *thr && s * s > lim * q);
    } else {
        s += x;
        q += x * x;
    }
    const double m = s * inv_n, v = q * inv_n - m * m;
    *pm = (float)(r + m);
    /* the root of the variance as a float (a double root's latency would sit on the way to
     * the cache's look), scaled below 2^-100: a std of 1e-31 (prices in some tiny unit) has a
     * variance below the smallest float, which as a float would be 0; scaled by 2^200
     * (exact) its root is a float's, then scaled back by 2^-100. A variance that a float
     * rounds to Inf (std > 1.8e19) stays Inf, refused as an overflowed feature */
    const int tiny = v < 0x1p-100;
    *ps = v > 0.0 ? sqrtf((float)(tiny ? v * 0x1p200 : v)) * (tiny ? 0x1p-100f : 1.0f) : 0.0f;
    return heal;
}

/* pm[j] = ref + s/n, ps[j] = sqrt(q/n - (s/n)^2) for each window field (fp_wstat1_scalar) */
void fp_window_stats_scalar(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                            const double *sum, const double *sumsq, const float *old,
                            double inv_n, float *pm, float *ps) {
    for (int j = 0; j < n_w; j++)
        fp_wstat1_scalar(raw[w_idx[j]], ref[j], sum[j], sumsq[j], old ? old + j : NULL, inv_n,
                         pm + j, ps + j, NULL, 0.0);
}

/* out[i] = (x[i] - mean[i]) * inv_std[i] */
void fp_zscore_scalar(const float *x, const float *mean, const float *inv_std, float *out,
                      int n) {
    for (int i = 0; i < n; i++) out[i] = (x[i] - mean[i]) * inv_std[i];
}

/* 1 if every x[i] is finite, else 0 */
int fp_allfinite_scalar(const float *x, int n) {
    for (int i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* fp_window_stats_scalar then fp_zscore_scalar's (x - mean) * inv_std on pm and ps, without
 * the round trip through a scratch buffer */
int fp_window_zscore_scalar(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                            const double *sum, const double *sumsq, const float *old,
                            double inv_n, const float *mean, const float *inv_std, float *feat,
                            const double *thr) {
    const double *th = old ? thr : NULL;
    int heal = 0;
    for (int j = 0; j < n_w; j++) {
        float pm, ps;
        heal |= fp_wstat1_scalar(raw[w_idx[j]], ref[j], sum[j], sumsq[j], old ? old + j : NULL,
                                 inv_n, &pm, &ps, th ? th + j : NULL, th ? th[n_w] : 0.0);
        feat[j] = (pm - mean[j]) * inv_std[j];
        feat[n_w + j] = (ps - mean[n_w + j]) * inv_std[n_w + j];
    }
    return heal;
}
