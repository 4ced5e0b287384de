/* scalar.c: the portable kernel set, and the reference every vector set is tested against.
 *
 * Sums keep their declared types (float for the dense layer, double for the cache's cosine,
 * see fp_cache.h) so a vector twin can only differ from these by summation order.
 */
#include "kernels.h"
#include "fp_math.h"
#include <math.h>
#include <string.h>

/* out[i] = (raw[idx[i]] - mean[i]) * inv_std[i] */
static void fp_zscore_gather_scalar(const float *raw, const int32_t *idx, const float *mean,
                                    const float *inv_std, float *out, int n) {
    for (int i = 0; i < n; i++) out[i] = (raw[idx[i]] - mean[i]) * inv_std[i];
}

/* out[o + j] = (raw[r + j] - mean[o + j]) * inv_std[o + j] over each run (r, o, len) */
static void fp_zscore_runs_scalar(const float *raw, const int32_t *runs, int n_runs,
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

/* rolling mean/std over the window with the new tick in (and `old` out), the sums being of
 * values less ref (fp_features.h) */
/* one field of fp_window_stats_scalar; with old and thr (NULL: none), whether the commit of
 * this tick heals the window: its sums (the same doubles as the commit kernel's) against its
 * criteria (fp_simd.h, window_commit) */
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
    /* the root of the variance as a float, scaled below 2^-100: a std of 1e-31 (prices in
     * some tiny unit) has a variance below the smallest float, which as a float was 0 (std
     * 0); scaled by 2^200 (exact) its root is a float's, then scaled back by 2^-100. (A root in double on every tick cost the vector sets ~4 ns: an 8-lane
     * double root's latency on the way to the cache's look.) A variance that a float rounds
     * to Inf (std > 1.8e19) stays Inf, refused as an overflowed feature */
    const int tiny = v < 0x1p-100;
    *ps = v > 0.0 ? sqrtf((float)(tiny ? v * 0x1p200 : v)) * (tiny ? 0x1p-100f : 1.0f) : 0.0f;
    return heal;
}

void fp_window_stats_scalar(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                            const double *sum, const double *sumsq, const float *old,
                            double inv_n, float *pm, float *ps) {
    for (int j = 0; j < n_w; j++)
        fp_wstat1_scalar(raw[w_idx[j]], ref[j], sum[j], sumsq[j], old ? old + j : NULL, inv_n,
                         pm + j, ps + j, NULL, 0.0);
}

/* out[i] = (x[i] - mean[i]) * inv_std[i] */
static void fp_zscore_scalar(const float *x, const float *mean, const float *inv_std, float *out,
                             int n) {
    for (int i = 0; i < n; i++) out[i] = (x[i] - mean[i]) * inv_std[i];
}

/* dot = sum a*b, na2 = sum a*a in double: a product of two floats is exact in double, so
 * the only error is the double sum's (~n * 1e-16 relative), far below any cosine threshold */
void fp_dot_norm2_scalar(const float *a, const float *b, int n, double *dot, double *na2) {
    double d = 0.0, s = 0.0;
    for (int i = 0; i < n; i++) {
        const double x = a[i];
        d += x * (double)b[i];
        s += x * x;
    }
    *dot = d;
    *na2 = s;
}

/* y[o] = act(bias[o] + sum_i w[o][i] x[i]) over the blocked layout; 0 when a pre-activation
 * is NaN/Inf (checked before the activation: relu would turn NaN into 0, tanh Inf into 1) */
static int fp_dense_scalar(const fp_dense_layer *L, const float *x, float *y, int reverse) {
    (void)reverse;   /* the row-group order only matters for the vector set's L1 reuse */
    const int in = L->in;
    int ok = 1;
    for (int b = 0; b < L->nb; b++) {
        const float *wb = L->w + (size_t)b * in * 8;
        float acc[8];
        for (int r = 0; r < 8; r++) acc[r] = 0.0f;
        for (int i = 0; i < in; i++) {
            const float xi = x[i];
            for (int r = 0; r < 8; r++) acc[r] += wb[i * 8 + r] * xi;
        }
        for (int r = 0; r < 8; r++) {
            const float v = acc[r] + L->bias[b * 8 + r];
            ok &= isfinite(v) != 0;
            y[b * 8 + r] = fp_actf(v, L->act);
        }
    }
    return ok;
}

static int fp_allfinite_scalar(const float *x, int n) {
    for (int i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* signal = tanh(out0), confidence = sigmoid(out1), libm (fp_math.h, shared with CUDA) */
static void fp_head_scalar(const float *out, float *signal, float *confidence) {
    fp_head(out, signal, confidence);
}

static void fp_dot_norms_f32_scalar(const float *a, const float *b, int n, float *dot, float *na2,
                                    float *nb2);
int fp_window_zscore_scalar(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                            const double *sum, const double *sumsq, const float *old,
                            double inv_n, const float *mean, const float *inv_std, float *feat,
                            const double *thr);
static void fp_dot_norms_f64_scalar(const float *a, const float *b, int n, double *dot,
                                    double *na2, double *nb2);
static void fp_diff_norms_f32_scalar(const float *a, const float *b, int n, float *dd,
                                     float *de, float *na2, float *nb2);

const fp_kernels fp_kernels_scalar = {
    "scalar",
    fp_zscore_gather_scalar,
    fp_zscore_runs_scalar,
    fp_window_stats_scalar,
    fp_zscore_scalar,
    fp_dot_norm2_scalar,
    fp_dense_scalar,
    fp_allfinite_scalar,
    fp_head_scalar,
    fp_dot_norms_f32_scalar,
    fp_window_zscore_scalar,
    fp_dot_norms_f64_scalar,
    fp_zscore_perm_scalar,
    fp_diff_norms_f32_scalar,
    fp_window_commit_scalar,
    fp_window_sums_scalar,
};

/* dot = sum a*b, na2 = sum a*a, nb2 = sum b*b in float32: 16 chains (term i in chain i mod 16),
 * then pairwise 16 -> 1, the order FP_DOTF_ROUNDINGS bounds (fp_simd.h) */
static void fp_dot_norms_f32_scalar(const float *a, const float *b, int n,
                                    float *dot, float *na2, float *nb2) {
    float d[16] = {0}, sa[16] = {0}, sb[16] = {0};
    int i = 0;
    /* a fixed 16-wide body the compiler keeps in registers (SSE2), same chains as the tail */
    for (; i + 16 <= n; i += 16)
        for (int c = 0; c < 16; c++) {
            d[c] += a[i + c] * b[i + c];
            sa[c] += a[i + c] * a[i + c];
            sb[c] += b[i + c] * b[i + c];
        }
    for (int c = 0; i + c < n; c++) {
        d[c] += a[i + c] * b[i + c];
        sa[c] += a[i + c] * a[i + c];
        sb[c] += b[i + c] * b[i + c];
    }
    for (int w = 8; w >= 1; w /= 2)
        for (int c = 0; c < w; c++) {
            d[c] += d[c + w];
            sa[c] += sa[c + w];
            sb[c] += sb[c + w];
        }
    *dot = d[0];
    *na2 = sa[0];
    *nb2 = sb[0];
}

/* dd = sum (a-b)^2, de = sum (a-b)(a+b), na2, nb2 in float32: the chains and reduction of
 * fp_dot_norms_f32_scalar, one difference and one sum rounded per term on top */
static void fp_diff_norms_f32_scalar(const float *a, const float *b, int n, float *dd,
                                     float *de, float *na2, float *nb2) {
    float d[16] = {0}, e[16] = {0}, sa[16] = {0}, sb[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int c = 0; c < 16; c++) {
            const float x = a[i + c], y = b[i + c], df = x - y;
            d[c] += df * df;
            e[c] += df * (x + y);
            sa[c] += x * x;
            sb[c] += y * y;
        }
    for (int c = 0; i + c < n; c++) {
        const float x = a[i + c], y = b[i + c], df = x - y;
        d[c] += df * df;
        e[c] += df * (x + y);
        sa[c] += x * x;
        sb[c] += y * y;
    }
    for (int w = 8; w >= 1; w /= 2)
        for (int c = 0; c < w; c++) {
            d[c] += d[c + w];
            e[c] += e[c + w];
            sa[c] += sa[c + w];
            sb[c] += sb[c + w];
        }
    *dd = d[0];
    *de = e[0];
    *na2 = sa[0];
    *nb2 = sb[0];
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

/* fp_dot_norm2_scalar's two sums and sum b*b beside them, each in the same order */
static void fp_dot_norms_f64_scalar(const float *a, const float *b, int n, double *dot,
                                    double *na2, double *nb2) {
    double d = 0.0, s = 0.0, t = 0.0;
    for (int i = 0; i < n; i++) {
        const double x = a[i], y = b[i];
        d += x * y;
        s += x * x;
        t += y * y;
    }
    *dot = d;
    *na2 = s;
    *nb2 = t;
}
