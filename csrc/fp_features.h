/* fp_features.h: raw tick -> feature vector, with per-symbol sliding windows.
 *
 * features = (pre - mean) * inv_std, pre = [ raw[z_idx[0..n_z)],
 *                                            rolling mean of raw[w_idx[k]] over the last W ticks,
 *                                            rolling std  of raw[w_idx[k]] over the last W ticks ]
 * Decision: the window update is split in two. fp_features_compute() reads
 * the ring and running sums and writes the features as if the new tick were
 * in the window, touching no state; fp_window_commit() writes the tick into
 * the ring afterwards: once the tick is known to be good (fp_step_finish), or
 * right away with an undo record that fp_window_restore() puts back if the tick
 * is then refused (fp_step). A rejected tick leaves every window exactly as it was.
 * Running sums are double so that add-new/subtract-old over millions of ticks
 * does not drift (float would lose ~1e-3 relative within 1e5 ticks). Subtracting is still
 * not exact: a finite outlier (a bad print of 1e18 among prices ~100) absorbs the other
 * ticks' share of the sums when it enters, and when it leaves, the sums keep the deficit for
 * good (a wrong mean and std on every later tick of that symbol), and the residues of inexact sums at price-like offsets random-walk
 * (~1% of the std per 1e6 ticks at 1e5 and W = 100). So the sums are renewed from sums
 * with no subtraction in them: beside the running sums each window keeps `fresh` sums of
 * the ticks since the ring last wrapped, which at the next wrap are exactly the window's
 * and replace the running ones; and a field whose departing square outweighs the rest of
 * its window by far (the outlier leaving) has its sums recomputed from the ring on that tick.
 * Every sum is of x - ref, not of x: the std from q/n - mean^2 cancels where the spread is
 * tiny beside the level (sums of raw prices at 1e5 with a std of 0.01 kept a few bits: the
 * std a few % off; at 1e7 / 1, ~1%). ref is a recent tick (the first of the period its
 * sums began in: after a wrap that tick is the ring's row 0, the next to leave, so for most
 * ticks ref is one up to W ticks older than the window, not one of its ticks), so the terms
 * are the size of the window's spread and its drift over 2W ticks, and the cancellation goes
 * with them. The fresh sums are of x - fref, fref the first tick
 * since the last wrap; at the wrap they become the running sums and fref their ref, so a
 * window's state after a wrap is a function of the ticks in it alone (an engine that saw
 * only those ticks holds the same bits).
 */
#ifndef FP_FEATURES_H
#define FP_FEATURES_H

#include "fp_simd.h"
#include <math.h>
#include <string.h>

typedef struct {
    int raw_len;      /* values per tick */
    int n_z;          /* z-scored raw fields */
    int n_w;          /* fields with rolling stats */
    int window;       /* W, ticks in the rolling window (>= 1 when n_w > 0) */
    int n_feat;       /* n_z + 2 * n_w */
    int32_t *z_idx;   /* n_z indices into raw */
    int32_t *w_idx;   /* n_w indices into raw */
    float *mean;      /* n_feat */
    float *inv_std;   /* n_feat */
    int32_t *runs;    /* z_idx as runs of consecutive indices: (raw start, out start, length) */
    int n_runs;       /* 0: gather index by index instead */
    fp_zstep *zsteps; /* z_idx as a permute plan (fp_zperm_build), or NULL */
    int n_zsteps;     /* > 0: compute the z-scores through the plan (before runs or gather) */
    double inv_window;/* 1.0 / window */
    double *w_thr;    /* n_w + 1: when a full window heals (fp_window_thresholds) */
    float *in_off;    /* n_feat: the model's input scaler after the spec, or NULL (none) */
    float *in_scale;  /* n_feat, NULL with in_off */
} fp_feature_spec;

/* When a full window's sums (of x - ref) are recomputed about its newest tick: where its
 * mean m = sum / W is so far from ref that q/W - m^2 cancels more than the model's features
 * can afford. The sums leave the variance off by up to ~2W 2^-53 (m^2 + var), so
 * - relative to the variance, off by up to ~2W 2^-53 2^30 (2^-17 at W = 32) while
 *   m^2 <= 2^30 var: sum^2 <= W (1 - 2^-30) sumsq;
 * - and a std near 0 off by up to ~sqrt(2W 2^-53) |m|, which the feature stage multiplies by
 *   the field's inv_std (the larger of its mean's and its std's): under ~2^-18 (4e-6) in the
 *   features the model reads while |m| inv_std <= 2^8 / sqrt(W): sum^2 <= W 2^16 / inv_std^2.
 * A heal comes only when both fail: thr[j] = W 2^16 / inv_std^2 per field, thr[n_w] =
 * W (1 - 2^-30). A ref from within the window keeps m^2 <= W var, one a few W ticks back
 * keeps m near the window's drift; a ref the window has moved far from does not (an outlier
 * that has left: 1e18 among prices ~100 put the mean 256 off; a counter that jumped 2^24:
 * the std 4% off at W = 100). A window that merely holds a spike (var large) or sits flat a
 * little off its ref (|m| small) is left alone. The bounds above are for sums rounded only
 * at the window's own scale: a departing square up to 2^16 times the rest (the first
 * criterion's margin) leaves up to ~2W 2^-37 of the rest's sumsq behind, which is below
 * them only while m^2 stays near var. The tick whose commit heals takes its features from
 * the ring too (window_zscore's flag), so no tick is served the sums a heal discards. */
static inline void fp_window_thresholds(const fp_feature_spec *fs, double *thr) {
    for (int j = 0; j < fs->n_w; j++) {
        /* an input scaler after the spec multiplies what the model reads by its scale */
        const double sa = fs->in_scale ? fabs((double)fs->in_scale[fs->n_z + j]) : 1.0,
                     sb = fs->in_scale ? fabs((double)fs->in_scale[fs->n_z + fs->n_w + j]) : 1.0;
        const double a = fabs((double)fs->inv_std[fs->n_z + j]) * sa,
                     b = fabs((double)fs->inv_std[fs->n_z + fs->n_w + j]) * sb;
        const double inv = a > b ? a : b;
        thr[j] = inv > 0.0 ? (double)fs->window * 0x1p16 / (inv * inv) : INFINITY;
    }
    thr[fs->n_w] = (double)fs->window * (1.0 - 0x1p-30);
}

/* Split z_idx into runs of consecutive indices; returns the count (runs has room for n_z). */
static inline int fp_feature_runs(const int32_t *z_idx, int n_z, int32_t *runs) {
    int n = 0;
    for (int i = 0; i < n_z; i++) {
        if (n && z_idx[i] == runs[3 * (n - 1)] + runs[3 * (n - 1) + 2]) {
            runs[3 * (n - 1) + 2]++;
        } else {
            runs[3 * n] = z_idx[i]; runs[3 * n + 1] = i; runs[3 * n + 2] = 1;
            n++;
        }
    }
    return n;
}

/* The permute plan for z_idx over a raw of raw_len floats (see fp_zstep): outputs in groups
 * of 16, each group one step per 32-float window of raw it reads, windows in increasing
 * order; then one check-only step (no lane taken, nothing stored) per window no group reads,
 * so the plan loads all of raw and the kernel's finiteness flag covers every value (the
 * engine's non-finite input check, without a pass of its own).
 * Returns the step count; steps has room for ceil(n_z / 16) * ceil(raw_len / 32) (n_z >= 1:
 * the groups' steps plus the check-only ones are at most (groups - 1) * windows + windows). */
static inline int fp_zperm_build(const int32_t *z_idx, int n_z, int raw_len, fp_zstep *steps) {
    int n = 0;
    const int n_win = (raw_len + 31) / 32;
    for (int g = 0; g * 16 < n_z; g++) {
        const int lanes = n_z - g * 16 < 16 ? n_z - g * 16 : 16;
        int first = n;
        for (int w = 0; w < n_win; w++) {
            fp_zstep st;
            memset(&st, 0, sizeof(st));
            for (int j = 0; j < lanes; j++) {
                const int32_t x = z_idx[g * 16 + j];
                if (x / 32 == w) {
                    st.take |= (uint16_t)(1u << j);
                    st.p[j] = (uint8_t)(x % 32);
                }
            }
            if (!st.take) continue;
            st.win = 32 * w;
            for (int j = 0; j < 16; j++) {
                if (st.win + j < raw_len) st.ld_lo |= (uint16_t)(1u << j);
                if (st.win + 16 + j < raw_len) st.ld_hi |= (uint16_t)(1u << j);
            }
            st.out = g * 16;
            steps[n++] = st;
        }
        /* every lane of a group has an index in some window, so a group has >= 1 step */
        if (n > first) steps[n - 1].store = (uint16_t)((1u << lanes) - 1u);
    }
    for (int w = 0; w < n_win; w++) {
        int read = 0;
        for (int i = 0; i < n_z && !read; i++) read = z_idx[i] / 32 == w;
        if (read) continue;
        fp_zstep st;
        memset(&st, 0, sizeof(st));
        st.win = 32 * w;
        for (int j = 0; j < 16; j++) {
            if (st.win + j < raw_len) st.ld_lo |= (uint16_t)(1u << j);
            if (st.win + 16 + j < raw_len) st.ld_hi |= (uint16_t)(1u << j);
        }
        steps[n++] = st;
    }
    return n;
}

/* Per-symbol window state, one block of `stride` bytes per symbol:
 *   fp_window_hdr | double sum[n_w] | double sumsq[n_w] | float ref[n_w] | float fref[n_w] |
 *   float ring[W][n_w] | (to 8 bytes) double fresh[2 n_w]
 * sum and sumsq are of x - ref, fresh (sum and sum of squares since the ring last wrapped) of
 * x - fref (see the top of this file); both refs are ticks, so float */
typedef struct {
    uint32_t pos;     /* next ring row to overwrite */
    uint32_t count;   /* ticks in the window, <= W */
    uint32_t pad[14];
} fp_window_hdr;

static inline double *fp_window_sums(unsigned char *win) {
    return (double *)(win + sizeof(fp_window_hdr));
}

/* ref[0..n_w), then fref[0..n_w) */
static inline float *fp_window_ref(const fp_feature_spec *fs, unsigned char *win) {
    return (float *)(fp_window_sums(win) + 2 * fs->n_w);
}

static inline float *fp_window_ring(const fp_feature_spec *fs, unsigned char *win) {
    return fp_window_ref(fs, win) + 2 * fs->n_w;
}

static inline size_t fp_window_fresh_off(const fp_feature_spec *fs) {
    const size_t b = sizeof(fp_window_hdr) + 2 * sizeof(double) * (size_t)fs->n_w +
                     sizeof(float) * (2 + (size_t)fs->window) * (size_t)fs->n_w;
    return FP_ROUND_UP(b, sizeof(double));
}

static inline size_t fp_window_stride(const fp_feature_spec *fs) {
    return FP_ROUND_UP(fp_window_fresh_off(fs) + 2 * sizeof(double) * (size_t)fs->n_w, FP_ALIGN);
}

/* The window features of a tick whose commit heals (window_zscore's flag: features from the
 * running sums would be from the sums the heal throws away, an outlier that leaves takes
 * the rest of the window with it and a ref the window has left keeps a few bits of it: 1e18
 * leaving prices ~100 gave a mean of 128 and a std of 0 or 1e10 on that tick), from the ring: the
 * window's other W - 1 ticks (every row but pos, the one leaving) summed about the new tick
 * (which adds 0 to the sums), then the stats kernel on those sums with the new tick as ref;
 * fields in chunks of 64 so the scratch stays on the stack at any n_w. Every kernel set gives
 * the scalar twin's bits (window_sums and window_stats do), and so do step, step_batch and
 * begin/finish (all compute features here). */
__attribute__((noinline)) static void fp_window_features_exact(const fp_kernels *k,
                                                               const fp_feature_spec *fs,
                                                               const unsigned char *win,
                                                               const float *raw, float *feat) {
    enum { CH = 64 };
    const int n = fs->n_w, W = fs->window;
    unsigned char *w = (unsigned char *)win;
    const int pos = (int)((const fp_window_hdr *)win)->pos;
    const float *ring = fp_window_ring(fs, w);
    const float *mean = fs->mean + fs->n_z, *inv_std = fs->inv_std + fs->n_z;
    for (int j0 = 0; j0 < n; j0 += CH) {
        const int c = n - j0 < CH ? n - j0 : CH;
        float x[CH], pm[CH], ps[CH];
        double sa[CH], qa[CH], sb[CH], qb[CH];
        for (int i = 0; i < c; i++) x[i] = raw[fs->w_idx[j0 + i]];
        k->window_sums(ring + j0, pos, n, c, x, sa, qa);
        k->window_sums(ring + (size_t)(pos + 1) * n + j0, W - pos - 1, n, c, x, sb, qb);
        for (int i = 0; i < c; i++) {
            sa[i] += sb[i];
            qa[i] += qb[i];
        }
        k->window_stats(raw, fs->w_idx + j0, c, x, sa, qa, NULL, fs->inv_window, pm, ps);
        for (int i = 0; i < c; i++) {
            feat[j0 + i] = (pm[i] - mean[j0 + i]) * inv_std[j0 + i];
            feat[n + j0 + i] = (ps[i] - mean[n + j0 + i]) * inv_std[n + j0 + i];
        }
    }
}

/* The spec's features (z-scores, window stats) for one tick, before any input scaler; reads
 * state only. Returns 1 when every value of raw is finite, else 0 (feat is then junk): the
 * permute plan checks them as it loads, the other paths with a pass of allfinite. The window
 * features go straight from the running sums to z-scores (one kernel): a scratch row of means
 * and stds in between cost a failed store-to-load forward on every tick. */
static inline int fp_features_spec(const fp_kernels *k, const fp_feature_spec *fs,
                                   const unsigned char *win, const float *raw, float *feat) {
    int finite;
    /* contiguous loads beat a gather once runs average 4+ fields */
    if (fs->n_zsteps) {
        finite = k->zscore_perm(raw, fs->zsteps, fs->n_zsteps, fs->mean, fs->inv_std, feat);
    } else {
        finite = k->allfinite(raw, fs->raw_len);
        if (fs->n_runs) k->zscore_runs(raw, fs->runs, fs->n_runs, fs->mean, fs->inv_std, feat);
        else k->zscore_gather(raw, fs->z_idx, fs->mean, fs->inv_std, feat, fs->n_z);
    }
    if (fs->n_w == 0) return finite;
    const fp_window_hdr *h = (const fp_window_hdr *)win;
    unsigned char *w = (unsigned char *)win;
    const double *sum = fp_window_sums(w);
    const double *sumsq = sum + fs->n_w;
    const float *ref = fp_window_ref(fs, w);
    const float *ring = fp_window_ring(fs, w);
    const int full = h->count >= (uint32_t)fs->window;
    /* a full window (every tick once warm) takes 1 / W computed once: the same double, without
     * a division on the way to the window features */
    const double inv_n = full ? fs->inv_window : 1.0 / (double)(h->count + 1);
    if (__builtin_expect(k->window_zscore(raw, fs->w_idx, fs->n_w, ref, sum, sumsq,
                                          full ? ring + (size_t)h->pos * fs->n_w : NULL, inv_n,
                                          fs->mean + fs->n_z, fs->inv_std + fs->n_z,
                                          feat + fs->n_z, fs->w_thr), 0))
        fp_window_features_exact(k, fs, win, raw, feat + fs->n_z);
    return finite;
}

/* The model's input scaler, after the spec: feat = (feat - off) * scale, two float32 ops per
 * feature as onnxruntime runs a Scaler (or Sub then Mul) on the features it is given. Not
 * composed into the spec's mean and inv_std: a spec that centres price-like fields (mean
 * ~6.5e4) followed by a scaler with an offset composes to a mean whose float32 rounding
 * (4e-3) would move the features by that times the scales, visibly off onnxruntime's
 * outputs. Elementwise IEEE ops, no reassociation and nothing to contract into an FMA:
 * the same bits under every kernel set and any vectorization. */
static inline void fp_features_scale(const fp_feature_spec *fs, float *feat) {
    const float *o = fs->in_off, *s = fs->in_scale;
    for (int j = 0; j < fs->n_feat; j++) feat[j] = (feat[j] - o[j]) * s[j];
}

/* feat (n_feat) for one tick: the spec's features, then the model's input scaler when it has
 * one; fp_features_spec's return. */
static inline int fp_features_compute(const fp_kernels *k, const fp_feature_spec *fs,
                                      const unsigned char *win, const float *raw, float *feat) {
    const int finite = fp_features_spec(k, fs, win, raw, feat);
    if (__builtin_expect(fs->in_scale != NULL, 0)) fp_features_scale(fs, feat);
    return finite;
}

/* where an undo record (see fp_window_undo_bytes) keeps the window's position and count:
 * after the sums, the fresh sums and the old row the commit kernel writes */
static inline size_t fp_window_undo_hdr(const fp_feature_spec *fs) {
    return (4 * sizeof(double) + sizeof(float)) * (size_t)fs->n_w;
}

/* and its copy of ref and fref (after position, count and a flag), written only by a
 * commit that changes them (the flag then 1): one at ring row 0 (a new period: fref), at the
 * wrap (ref) or one that heals (ref) */
static inline size_t fp_window_undo_refs(const fp_feature_spec *fs) {
    return fp_window_undo_hdr(fs) + 3 * sizeof(uint32_t);
}

/* out of line (2 ticks in W), in loops rather than libc memcpy calls of a run-time size */
__attribute__((noinline)) static void fp_window_save_refs(const fp_feature_spec *fs, unsigned char *win,
                                       unsigned char *undo) {
    const float *ref = fp_window_ref(fs, win);
    float *u = (float *)(undo + fp_window_undo_refs(fs));
    for (int j = 0; j < 2 * fs->n_w; j++) u[j] = ref[j];
    ((uint32_t *)(undo + fp_window_undo_hdr(fs)))[2] = 1;
}

/* The rare half of fp_window_commit (a field to heal, see there), out of line: the newest
 * tick (raw, just written to the ring) becomes every field's ref and the sums are recomputed
 * from the ring's count ticks about it (a kernel: fields in vectors, rows in order) */
__attribute__((noinline)) static void fp_window_heal(const fp_kernels *k,
                                                     const fp_feature_spec *fs,
                                                     unsigned char *win, const float *raw) {
    const int n = fs->n_w;
    double *sum = fp_window_sums(win);
    float *ref = fp_window_ref(fs, win);
    for (int j = 0; j < n; j++) ref[j] = raw[fs->w_idx[j]];
    k->window_sums(fp_window_ring(fs, win), (int)((const fp_window_hdr *)win)->count, n, n, ref,
                   sum, sum + n);
}

/* A new period (ring row 0 about to be written), out of line as it comes once per W ticks:
 * its fresh sums start from this tick (fref = x, so the tick adds 0 to them), and an empty
 * window's running sums too (ref = x) */
__attribute__((noinline)) static void fp_window_new_period(const fp_feature_spec *fs,
                                                           unsigned char *win, const float *raw,
                                                           int empty) {
    const int n = fs->n_w;
    float *ref = fp_window_ref(fs, win);
    for (int j = 0; j < n; j++) ref[n + j] = raw[fs->w_idx[j]];
    if (empty)
        for (int j = 0; j < n; j++) ref[j] = ref[n + j];
}

/* push raw's windowed fields into the symbol's ring; undo (NULL: none) receives the record
 * fp_window_restore() undoes the commit with */
static inline void fp_window_commit(const fp_kernels *k, const fp_feature_spec *fs, unsigned char *win,
                                    const float *raw, unsigned char *undo) {
    if (fs->n_w == 0) return;
    fp_window_hdr *h = (fp_window_hdr *)win;
    const int n = fs->n_w;
    double *sum = fp_window_sums(win);
    double *sumsq = sum + n;
    float *ref = fp_window_ref(fs, win);
    float *row = fp_window_ring(fs, win) + (size_t)h->pos * n;
    double *fresh = (double *)(win + fp_window_fresh_off(fs));
    const int full = h->count >= (uint32_t)fs->window;
    const int wrap = h->pos + 1 == (uint32_t)fs->window;
    if (undo) {
        uint32_t *u = (uint32_t *)(undo + fp_window_undo_hdr(fs));
        u[0] = h->pos;
        u[1] = h->count;
        u[2] = 0;
        if (h->pos == 0 || wrap) fp_window_save_refs(fs, win, undo);
    }
    if (h->pos == 0) fp_window_new_period(fs, win, raw, h->count == 0);
    /* heal: recompute a window's sums from its ring, about its newest tick, when
     * - a field's departing square outweighs the rest of the window 2^16 times over (256x
     *   in magnitude). While it was in, each update of the sums rounded by up to 2^-53 of
     *   it, so below that ratio what it leaves behind is < W 2^-36 of the rest, and above it
     *   the rest may be gone;
     * - or a full window's mean is so far from its ref that q/n - m^2 would cancel more
     *   than the features can afford (fp_window_thresholds): the ref an outlier that has
     *   left (the first tick of a period, or the newest tick of a heal). The newest tick is
     *   then the ref, and while a window fills its ref is one of its ticks.
     * O(W n_w) when it comes (and the tick's features from the ring as well): never on a
     * price walk, on a few % of ticks for sparse or two-valued fields (docs/kernels-notes.md) */
    const int heal = k->window_commit(raw, fs->w_idx, n, ref, sum, sumsq, row, full, fs->w_thr,
                                      (double *)undo, fresh);
    if (!full) h->count++;
    if (wrap) {
        /* the ring holds exactly the ticks since the last wrap: their sums, free of any
         * subtraction, replace the running ones (healed or not), and their ref with them */
        h->pos = 0;
        memcpy(sum, fresh, 2 * sizeof(double) * (size_t)n);
        for (int j = 0; j < n; j++) ref[j] = ref[n + j];
        memset(fresh, 0, 2 * sizeof(double) * (size_t)n);
        return;
    }
    h->pos++;
    if (heal) {
        if (undo && !((uint32_t *)(undo + fp_window_undo_hdr(fs)))[2])
            fp_window_save_refs(fs, win, undo);
        fp_window_heal(k, fs, win, raw);
    }
}

/* An undo record of one commit: the window's running sums, its fresh sums and the ring row
 * the commit overwrites (as the commit kernel loads them: sum[n_w], sumsq[n_w], fresh[2 n_w]
 * doubles, the row's n_w floats), then the window's position and count and a flag, then
 * (written by a commit at row 0, at the wrap or that heals, the flag then 1) ref[n_w] and
 * fref[n_w] floats; fp_window_undo_bytes() long. fp_step commits a tick's window before
 * the cache has decided (so that on a hit, a rarely taken branch, the decision has less
 * work behind it) and restores the record when the model then refuses the tick: the window
 * is then exactly as it was, bit for bit. */
static inline size_t fp_window_undo_bytes(const fp_feature_spec *fs) {
    return fp_window_undo_refs(fs) + 2 * sizeof(float) * (size_t)fs->n_w;
}

static inline void fp_window_restore(const fp_feature_spec *fs, unsigned char *win,
                                     const unsigned char *undo) {
    const int n = fs->n_w;
    if (n == 0) return;
    fp_window_hdr *h = (fp_window_hdr *)win;
    const double *us = (const double *)undo;
    const float *ur = (const float *)(us + 4 * n);
    const uint32_t *u = (const uint32_t *)(undo + fp_window_undo_hdr(fs));
    h->pos = u[0];
    h->count = u[1];
    double *sums = fp_window_sums(win);
    for (int i = 0; i < 2 * n; i++) sums[i] = us[i];
    double *fresh = (double *)(win + fp_window_fresh_off(fs));
    for (int i = 0; i < 2 * n; i++) fresh[i] = us[2 * n + i];
    float *row = fp_window_ring(fs, win) + (size_t)h->pos * n;
    for (int i = 0; i < n; i++) row[i] = ur[i];
    if (u[2]) memcpy(fp_window_ref(fs, win), undo + fp_window_undo_refs(fs),
                     2 * sizeof(float) * (size_t)n);
}

#endif
