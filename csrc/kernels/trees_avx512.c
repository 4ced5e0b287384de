/* trees_avx512.c: the tree-ensemble evaluator with AVX-512 gathers: a group of 16 perfect
 * trees is one vector; four groups walk level by level together so their gathers overlap.
 * The comparison lands in a mask register, so a level is idx = 2 idx + 2 - mask; the first
 * three levels pick their nodes by mask blends of plain loads instead of gathers. */
#include "../fp_trees.h"
#if FP_HAVE_X86
#include <immintrin.h>

#define FP_TV16 4

FP_TARGET_AVX512 static inline void fp_walk16(const fp_trees *t, const float *x, int g0, int n,
                                              __m512 *v) {
    const int D = t->depth;
    const size_t inner = ((size_t)1 << D) - 1, leaves = (size_t)1 << D;
    const int32_t *pf[FP_TV16];
    const float *pt[FP_TV16], *pl[FP_TV16];
    __m512i idx[FP_TV16];
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i two = _mm512_set1_epi32(2), one = _mm512_set1_epi32(1);
    for (int k = 0; k < n; k++) {
        pf[k] = t->pfeat + (size_t)(g0 + k) * inner * FP_TREES_LANES;
        pt[k] = t->pthr + (size_t)(g0 + k) * inner * FP_TREES_LANES;
        pl[k] = t->pleaf + (size_t)(g0 + k) * leaves * FP_TREES_LANES;
        idx[k] = _mm512_setzero_si512();
    }
    /* levels 0-2 hold 1, 2 and 4 nodes: their feature and threshold are plain loads picked
     * by the lanes' earlier comparison masks, not gathers; only x[f] is gathered */
    __mmask16 m0[FP_TV16], m1[FP_TV16];
#define FP_NODE_F(k, i) _mm512_loadu_si512((const void *)(pf[k] + (i) * FP_TREES_LANES))
#define FP_NODE_T(k, i) _mm512_loadu_ps(pt[k] + (i) * FP_TREES_LANES)
    if (D > 0) {
        for (int k = 0; k < n; k++) {
            const __m512 xv = _mm512_i32gather_ps(FP_NODE_F(k, 0), x, 4);
            m0[k] = _mm512_cmp_ps_mask(xv, FP_NODE_T(k, 0), _CMP_LE_OQ);
            idx[k] = _mm512_mask_sub_epi32(two, m0[k], two, one);
        }
    }
    if (D > 1) {
        for (int k = 0; k < n; k++) {
            const __m512i f = _mm512_mask_blend_epi32(m0[k], FP_NODE_F(k, 2), FP_NODE_F(k, 1));
            const __m512 tv = _mm512_mask_blend_ps(m0[k], FP_NODE_T(k, 2), FP_NODE_T(k, 1));
            const __m512 xv = _mm512_i32gather_ps(f, x, 4);
            m1[k] = _mm512_cmp_ps_mask(xv, tv, _CMP_LE_OQ);
            const __m512i nx = _mm512_add_epi32(_mm512_add_epi32(idx[k], idx[k]), two);
            idx[k] = _mm512_mask_sub_epi32(nx, m1[k], nx, one);
        }
    }
    if (D > 2) {
        for (int k = 0; k < n; k++) {
            const __m512i f = _mm512_mask_blend_epi32(m0[k],
                _mm512_mask_blend_epi32(m1[k], FP_NODE_F(k, 6), FP_NODE_F(k, 5)),
                _mm512_mask_blend_epi32(m1[k], FP_NODE_F(k, 4), FP_NODE_F(k, 3)));
            const __m512 tv = _mm512_mask_blend_ps(m0[k],
                _mm512_mask_blend_ps(m1[k], FP_NODE_T(k, 6), FP_NODE_T(k, 5)),
                _mm512_mask_blend_ps(m1[k], FP_NODE_T(k, 4), FP_NODE_T(k, 3)));
            const __m512 xv = _mm512_i32gather_ps(f, x, 4);
            const __mmask16 m = _mm512_cmp_ps_mask(xv, tv, _CMP_LE_OQ);
            const __m512i nx = _mm512_add_epi32(_mm512_add_epi32(idx[k], idx[k]), two);
            idx[k] = _mm512_mask_sub_epi32(nx, m, nx, one);
        }
    }
#undef FP_NODE_F
#undef FP_NODE_T
    for (int l = 3; l < D; l++) {
        for (int k = 0; k < n; k++) {
            const __m512i o = _mm512_add_epi32(_mm512_slli_epi32(idx[k], 4), iota);
            const __m512i f = _mm512_i32gather_epi32(o, (const void *)pf[k], 4);
            const __m512 tv = _mm512_i32gather_ps(o, pt[k], 4);
            const __m512 xv = _mm512_i32gather_ps(f, x, 4);
            const __mmask16 m = _mm512_cmp_ps_mask(xv, tv, _CMP_LE_OQ);
            const __m512i nx = _mm512_add_epi32(_mm512_add_epi32(idx[k], idx[k]), two);
            idx[k] = _mm512_mask_sub_epi32(nx, m, nx, one);
        }
    }
    const __m512i in = _mm512_set1_epi32((int)inner);
    for (int k = 0; k < n; k++) {
        const __m512i o = _mm512_add_epi32(_mm512_slli_epi32(_mm512_sub_epi32(idx[k], in), 4), iota);
        v[k] = _mm512_i32gather_ps(o, pl[k], 4);
    }
}

/* the lane walk (fp_trees.h): a batch's 16 trees as one vector of node indices; a step
 * gathers each lane's threshold and feature|offset (8-byte nodes), then x[feature] */
FP_TARGET_AVX512 void fp_trees_lanes_avx512(const fp_trees *t, const float *x, const fp_wbatch *b,
                                            int nb, float *vals) {
    const float *wf = (const float *)t->wnodes;
    const int *wi = (const int *)t->wnodes + 1;
    const __m512i one = _mm512_set1_epi32(1), lo16 = _mm512_set1_epi32(0xffff);
    for (int q = 0; q < nb; q++) {
        __m512i i0 = _mm512_loadu_si512((const void *)b[q].node);
        for (int l = 0; l < b[q].iters; l++) {
            const __m512 t0 = _mm512_i32gather_ps(i0, wf, 8);
            const __m512i m0 = _mm512_i32gather_epi32(i0, wi, 8);
            const __m512i o0 = _mm512_srli_epi32(m0, 16);
            const __m512 x0 = _mm512_i32gather_ps(_mm512_and_si512(m0, lo16), x, 4);
            /* a leaf's threshold is NaN: the ordered x <= NaN is false and its offset 0 */
            const __mmask16 c0 = _mm512_cmp_ps_mask(x0, t0, _CMP_LE_OQ);
            i0 = _mm512_add_epi32(i0, _mm512_mask_blend_epi32(c0, o0, one));
            if (!_mm512_test_epi32_mask(o0, o0)) break;
        }
        int32_t idx[FP_TREES_WALK_LANES];
        _mm512_storeu_si512((void *)idx, i0);
        for (int k = 0; k < FP_TREES_WALK_LANES; k++)
            if (b[q].slot[k] >= 0)
                vals[b[q].slot[k]] = t->wleaf[idx[k]];
    }
}

FP_TARGET_AVX512 void fp_trees_eval_avx512(const fp_trees *t, const float *x, float *out) {
    double acc[FP_TREES_MAX_TARGETS];
    float vals[FP_TREES_WALK_MAX_TREES];
    fp_trees_acc_init(t, acc);
    if (fp_trees_has_nan(x, t->n_feat)) {
        fp_trees_walk_all_compact(t, x, acc);
        fp_trees_finalize(t, acc, out);
        return;
    }
    if (t->mode == FP_TREES_MODE_ALL) {
        (t->gather ? fp_trees_lanes_avx512 : fp_trees_lanes_scalar)(t, x, t->wall, t->n_wall, vals);
        fp_trees_sum_all(t, vals, acc);
        fp_trees_finalize(t, acc, out);
        return;
    }
    if (!t->pgather) {
        fp_trees_perfect_steps(t, x, acc);
    } else {
        __m512 v[FP_TV16];
        for (int g = 0; g < t->n_groups; g += FP_TV16) {
            const int n = t->n_groups - g < FP_TV16 ? t->n_groups - g : FP_TV16;
            fp_walk16(t, x, g, n, v);
            /* the lanes added in double, as the compact walk and the other sets add, in
             * fp_trees_sum16's order (written out: _mm512_reduce_add_pd's order is the
             * compiler's to choose) */
            for (int k = 0; k < n; k++) {
                const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v[k]));
                const __m512d hi = _mm512_cvtps_pd(_mm256_castsi256_ps(
                    _mm512_extracti64x4_epi64(_mm512_castps_si512(v[k]), 1)));
                const __m512d t8 = _mm512_add_pd(lo, hi);
                const __m256d u = _mm256_add_pd(_mm512_castpd512_pd256(t8),
                                                _mm512_extractf64x4_pd(t8, 1));
                const __m128d w = _mm_add_pd(_mm256_castpd256_pd128(u), _mm256_extractf128_pd(u, 1));
                acc[t->ptarget[g + k]] += _mm_cvtsd_f64(_mm_add_sd(w, _mm_unpackhi_pd(w, w)));
            }
        }
    }
    if (t->mode == FP_TREES_MODE_REST) {
        (t->gather ? fp_trees_lanes_avx512 : fp_trees_lanes_scalar)(t, x, t->wrest, t->n_wrest, vals);
        fp_trees_sum_rest(t, vals, acc);
    } else {
        for (int r = 0; r < t->n_rest; r++) fp_trees_walk_compact(t, t->rest[r], x, acc);
    }
    fp_trees_finalize(t, acc, out);
}
#endif
