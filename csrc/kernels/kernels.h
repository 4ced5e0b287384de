/* kernels.h: what the kernel sources share: every kernel of the fp_kernels table by kind
 * (features_*, cache_*, dense_*, log1p_*, book_*) and instruction set, and the lane masks of each set.
 *
 * Decision: one source per kind and set, each function named fp_<what>_<isa>, as numpy lays
 * out its dispatch sources; sets.c puts them in one table per set and fp_simd.c only picks
 * the table. A vector kernel carries its set's target attribute (no global -mavx2), so every
 * object loads on any x86-64. The scalar twins are the reference the vector sets are tested
 * against, and a vector set may call them for its tail.
 */
#ifndef FP_KERNELS_H
#define FP_KERNELS_H

#include "fp_simd.h"

/* features_<isa>.c: z-scores, the rolling windows, the finite check on ticks */
void fp_zscore_gather_scalar(const float *raw, const int32_t *idx, const float *mean,
                             const float *inv_std, float *out, int n);
void fp_zscore_runs_scalar(const float *raw, const int32_t *runs, int n_runs, const float *mean,
                           const float *inv_std, float *out);
void fp_window_stats_scalar(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                            const double *sum, const double *sumsq, const float *old,
                            double inv_n, float *pm, float *ps);
void fp_zscore_scalar(const float *x, const float *mean, const float *inv_std, float *out, int n);
int fp_allfinite_scalar(const float *x, int n);
int fp_window_zscore_scalar(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                            const double *sum, const double *sumsq, const float *old,
                            double inv_n, const float *mean, const float *inv_std, float *feat,
                            const double *thr);
int fp_zscore_perm_scalar(const float *raw, const fp_zstep *steps, int n, const float *mean,
                          const float *inv_std, float *out);
int fp_window_commit_scalar(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                            double *sum, double *sumsq, float *row, int full,
                            const double *thr, double *undo, double *fresh);
void fp_window_sums_scalar(const float *ring, int rows, int stride, int n, const float *ref,
                           double *sum, double *sumsq);

/* cache_<isa>.c: the dot products and norms of the cache's look */
void fp_dot_norm2_scalar(const float *a, const float *b, int n, double *dot, double *na2);
void fp_dot_norms_f32_scalar(const float *a, const float *b, int n, float *dot, float *na2,
                             float *nb2);
void fp_dot_norms_f64_scalar(const float *a, const float *b, int n, double *dot, double *na2,
                             double *nb2);
void fp_diff_norms_f32_scalar(const float *a, const float *b, int n, float *dd, float *de,
                              float *na2, float *nb2);

/* log1p_<isa>.c: log1p of a batch of doubles, bit for bit glibc's (log1p_scalar.c) */
void fp_log1p_scalar(const double *x, double *y, int n);

/* book_<isa>.c: the live book's level checks and level differences, its EWMA rows and its
 * float32 rounding with the range check */
int fp_book_ok_scalar(const double *bp, const double *bs, const double *ap, const double *as);
uint64_t fp_book_diff_scalar(const double *x0, const double *x1, const double *x2,
                             const double *x3, const double *old);
void fp_book_prices_scalar(const double *bpx, const double *apx, double mid, double tick,
                           double *o);
void fp_book_imbalance_scalar(const double *b, const double *a, double *out);
void fp_ewma8_scalar(const double *prev, const double *x, const double *alpha, double *out,
                     int rows);
int fp_narrow_f32_scalar(const double *o, float *r, int n);

/* dense_<isa>.c: the fp32 dense layer and the output head */
int fp_dense_scalar(const fp_dense_layer *L, const float *x, float *y, int reverse);
void fp_head_scalar(const float *out, float *signal, float *confidence);

#if FP_HAVE_X86
#include <immintrin.h>

/* AVX2 has no two-table permute and no vector window commit: its table takes the scalar
 * twins of fp_zscore_perm and fp_window_commit (sets.c) */
FP_TARGET_AVX2 void fp_zscore_gather_avx2(const float *raw, const int32_t *idx,
                                          const float *mean, const float *inv_std, float *out,
                                          int n);
FP_TARGET_AVX2 void fp_zscore_runs_avx2(const float *raw, const int32_t *runs, int n_runs,
                                        const float *mean, const float *inv_std, float *out);
FP_TARGET_AVX2 void fp_window_stats_avx2(const float *raw, const int32_t *w_idx, int n_w,
                                         const float *ref, const double *sum,
                                         const double *sumsq, const float *old, double inv_n,
                                         float *pm, float *ps);
FP_TARGET_AVX2 void fp_zscore_avx2(const float *x, const float *mean, const float *inv_std,
                                   float *out, int n);
FP_TARGET_AVX2 int fp_allfinite_avx2(const float *x, int n);
FP_TARGET_AVX2 int fp_window_zscore_avx2(const float *raw, const int32_t *w_idx, int n_w,
                                         const float *ref, const double *sum,
                                         const double *sumsq, const float *old, double inv_n,
                                         const float *mean, const float *inv_std, float *feat,
                                         const double *thr);
FP_TARGET_AVX2 void fp_window_sums_avx2(const float *ring, int rows, int stride, int n,
                                        const float *ref, double *sum, double *sumsq);
FP_TARGET_AVX2 void fp_dot_norm2_avx2(const float *a, const float *b, int n, double *dot,
                                      double *na2);
FP_TARGET_AVX2 void fp_dot_norms_f32_avx2(const float *a, const float *b, int n, float *dot,
                                          float *na2, float *nb2);
FP_TARGET_AVX2 void fp_dot_norms_f64_avx2(const float *a, const float *b, int n, double *dot,
                                          double *na2, double *nb2);
FP_TARGET_AVX2 void fp_diff_norms_f32_avx2(const float *a, const float *b, int n, float *dd,
                                           float *de, float *na2, float *nb2);
FP_TARGET_AVX2 void fp_log1p_avx2(const double *x, double *y, int n);
FP_TARGET_AVX2 int fp_book_ok_avx2(const double *bp, const double *bs, const double *ap,
                                   const double *as);
FP_TARGET_AVX2 uint64_t fp_book_diff_avx2(const double *x0, const double *x1, const double *x2,
                                          const double *x3, const double *old);
FP_TARGET_AVX2 void fp_book_prices_avx2(const double *bpx, const double *apx, double mid,
                                        double tick, double *o);
FP_TARGET_AVX2 void fp_book_imbalance_avx2(const double *b, const double *a, double *out);
FP_TARGET_AVX2 void fp_ewma8_avx2(const double *prev, const double *x, const double *alpha,
                                  double *out, int rows);
FP_TARGET_AVX2 int fp_narrow_f32_avx2(const double *o, float *r, int n);
FP_TARGET_AVX2 int fp_dense_avx2(const fp_dense_layer *L, const float *x, float *y, int reverse);
FP_TARGET_AVX2 void fp_head_avx2(const float *out, float *signal, float *confidence);

FP_TARGET_AVX512 void fp_zscore_gather_avx512(const float *raw, const int32_t *idx,
                                              const float *mean, const float *inv_std,
                                              float *out, int n);
FP_TARGET_AVX512 void fp_zscore_runs_avx512(const float *raw, const int32_t *runs, int n_runs,
                                            const float *mean, const float *inv_std,
                                            float *out);
FP_TARGET_AVX512 void fp_window_stats_avx512(const float *raw, const int32_t *w_idx, int n_w,
                                             const float *ref, const double *sum,
                                             const double *sumsq, const float *old,
                                             double inv_n, float *pm, float *ps);
FP_TARGET_AVX512 void fp_zscore_avx512(const float *x, const float *mean, const float *inv_std,
                                       float *out, int n);
FP_TARGET_AVX512 int fp_allfinite_avx512(const float *x, int n);
FP_TARGET_AVX512 int fp_window_zscore_avx512(const float *raw, const int32_t *w_idx, int n_w,
                                             const float *ref, const double *sum,
                                             const double *sumsq, const float *old,
                                             double inv_n, const float *mean,
                                             const float *inv_std, float *feat,
                                             const double *thr);
FP_TARGET_AVX512 int fp_zscore_perm_avx512(const float *raw, const fp_zstep *steps, int n,
                                           const float *mean, const float *inv_std, float *out);
FP_TARGET_AVX512 int fp_window_commit_avx512(const float *raw, const int32_t *w_idx, int n_w,
                                             const float *ref, double *sum, double *sumsq,
                                             float *row, int full, const double *thr,
                                             double *undo, double *fresh);
FP_TARGET_AVX512 void fp_window_sums_avx512(const float *ring, int rows, int stride, int n,
                                            const float *ref, double *sum, double *sumsq);
FP_TARGET_AVX512 void fp_dot_norm2_avx512(const float *a, const float *b, int n, double *dot,
                                          double *na2);
FP_TARGET_AVX512 void fp_dot_norms_f32_avx512(const float *a, const float *b, int n, float *dot,
                                              float *na2, float *nb2);
FP_TARGET_AVX512 void fp_dot_norms_f64_avx512(const float *a, const float *b, int n,
                                              double *dot, double *na2, double *nb2);
FP_TARGET_AVX512 void fp_diff_norms_f32_avx512(const float *a, const float *b, int n, float *dd,
                                               float *de, float *na2, float *nb2);
FP_TARGET_AVX512 void fp_log1p_avx512(const double *x, double *y, int n);
FP_TARGET_AVX512 void fp_ewma8_avx512(const double *prev, const double *x, const double *alpha,
                                      double *out, int rows);
FP_TARGET_AVX512 int fp_narrow_f32_avx512(const double *o, float *r, int n);
FP_TARGET_AVX512 int fp_dense_avx512(const fp_dense_layer *L, const float *x, float *y,
                                     int reverse);
FP_TARGET_AVX512 void fp_head_avx512(const float *out, float *signal, float *confidence);

/* AVX2 tail mask: lanes [0, n) set, n in 0..8 */
FP_TARGET_AVX2 static inline __m256i fp_tailmask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* AVX-512 lanes [0, n) of 16, n in 0..16 */
static inline __mmask16 fp_mask16(int n) { return (__mmask16)((1u << n) - 1u); }

/* AVX-512 lanes [0, min(left, 8)) of 8 */
static inline __mmask8 fp_mask8_from(int left) {
    return (__mmask8)(left >= 8 ? 0xff : (1u << left) - 1u);
}
#endif

#endif
