/* kernels.h: what the per-ISA kernel sources (scalar.c, avx2.c, avx512.c) share.
 *
 * Decision: one source file per kernel set, each function named fp_<what>_<isa>, as numpy
 * lays out its dispatch sources; fp_simd.c only holds the table choice. The scalar twins
 * are exported here because the vector sets reuse them for tails, and so a new set can be
 * written against the same reference.
 */
#ifndef FP_KERNELS_H
#define FP_KERNELS_H

#include "fp_simd.h"

void fp_window_stats_scalar(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                            const double *sum, const double *sumsq, const float *old,
                            double inv_n, float *pm, float *ps);
void fp_dot_norm2_scalar(const float *a, const float *b, int n, double *dot, double *na2);
int fp_window_commit_scalar(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                            double *sum, double *sumsq, float *row, int full,
                            const double *thr, double *undo, double *fresh);
void fp_window_sums_scalar(const float *ring, int rows, int stride, int n, const float *ref,
                           double *sum, double *sumsq);
int fp_window_zscore_scalar(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                            const double *sum, const double *sumsq, const float *old,
                            double inv_n, const float *mean, const float *inv_std, float *feat,
                            const double *thr);
int fp_zscore_perm_scalar(const float *raw, const fp_zstep *steps, int n, const float *mean,
                          const float *inv_std, float *out);

#endif
