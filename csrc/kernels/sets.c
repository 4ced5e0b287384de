/* sets.c: the kernel table of each set, in fp_kernels' order (fp_simd.h).
 *
 * Decision: the kernels live by kind (features_*, cache_*, dense_*) and the tables here, so
 * what each set runs for each entry, its own kernel or a scalar twin, reads in one place;
 * fp_kernels_for() (fp_simd.c) hands a vector table out only where cpuid says it runs.
 */
#include "kernels.h"

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
    fp_log1p_scalar,
    fp_ewma8_scalar,
    fp_narrow_f32_scalar,
    fp_book_ok_scalar,
    fp_book_diff_scalar,
    fp_book_prices_scalar,
    fp_book_imbalance_scalar,
};

#if FP_HAVE_X86
const fp_kernels fp_kernels_avx2 = {
    "avx2",
    fp_zscore_gather_avx2,
    fp_zscore_runs_avx2,
    fp_window_stats_avx2,
    fp_zscore_avx2,
    fp_dot_norm2_avx2,
    fp_dense_avx2,
    fp_allfinite_avx2,
    fp_head_avx2,
    fp_dot_norms_f32_avx2,
    fp_window_zscore_avx2,
    fp_dot_norms_f64_avx2,
    /* AVX2 has no two-table permute (a 32-float window would take 4 vpermps and 3 blends
     * per 8 lanes), so the engine keeps runs or gathers there; the entry is the twin */
    fp_zscore_perm_scalar,
    fp_diff_norms_f32_avx2,
    fp_window_commit_scalar,
    fp_window_sums_avx2,
    fp_log1p_avx2,
    fp_ewma8_avx2,
    fp_narrow_f32_avx2,
    fp_book_ok_avx2,
    fp_book_diff_avx2,
    fp_book_prices_avx2,
    fp_book_imbalance_avx2,
};

const fp_kernels fp_kernels_avx512 = {
    "avx512",
    fp_zscore_gather_avx512,
    fp_zscore_runs_avx512,
    fp_window_stats_avx512,
    fp_zscore_avx512,
    fp_dot_norm2_avx512,
    fp_dense_avx512,
    fp_allfinite_avx512,
    fp_head_avx512,
    fp_dot_norms_f32_avx512,
    fp_window_zscore_avx512,
    fp_dot_norms_f64_avx512,
    fp_zscore_perm_avx512,
    fp_diff_norms_f32_avx512,
    fp_window_commit_avx512,
    fp_window_sums_avx512,
    fp_log1p_avx512,
    fp_ewma8_avx512,
    fp_narrow_f32_avx512,
    /* ten levels a side are three YMM loads: a ZMM pass would mask most of its lanes; these
     * four are AVX2's */
    fp_book_ok_avx2,
    fp_book_diff_avx2,
    fp_book_prices_avx2,
    fp_book_imbalance_avx2,
};
#endif
