/* trees_avx2.c: the tree-ensemble evaluator with AVX2 gathers. A group of 16 perfect trees
 * is two vectors of 8 lanes; up to 8 such vectors (4 groups) walk level by level together:
 * a level is a chain of two dependent gathers (feature index, then the feature), ~40+
 * cycles, so many independent chains in flight keep the gather unit busy instead of
 * waiting. The first three levels hold 1, 2 and 4 nodes: plain loads picked by blends on the
 * lanes' earlier comparisons replace the feature and threshold gathers there. */
#include "../fp_trees.h"
#if FP_HAVE_X86
#include <immintrin.h>

#define FP_TV 8   /* vectors of 8 lanes walked together (4 groups) */

/* the 16 lanes of a group (two vectors of 8: a lanes 0-7, b lanes 8-15) added in double, as
 * the compact walk and the scalar set add: a float sum would lose low leaves next to large
 * ones of opposite sign, and lose them differently from the other paths. In
 * fp_trees_sum16's order, which every set uses (lane i with lane i + 8 first): that sum is
 * not exact for leaves of very different sizes, and another order gave another signal. */
FP_TARGET_AVX2 static inline double fp_hsum16d(__m256 a, __m256 b) {
    const __m256d s = _mm256_add_pd(
        _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(a)), _mm256_cvtps_pd(_mm256_castps256_ps128(b))),
        _mm256_add_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)), _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1))));
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    h = _mm_add_sd(h, _mm_unpackhi_pd(h, h));
    return _mm_cvtsd_f64(h);
}

/* walk n (<= FP_TV) half-groups: half h of group gs[k] */
FP_TARGET_AVX2 static inline void fp_walk8(const fp_trees *t, const float *x, const int *gs,
                                           const int *hs, int n, __m256 *v) {
    const int D = t->depth;
    const size_t inner = ((size_t)1 << D) - 1, leaves = (size_t)1 << D;
    const int32_t *pf[FP_TV];
    const float *pt[FP_TV], *pl[FP_TV];
    __m256i idx[FP_TV], lane[FP_TV];
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int k = 0; k < n; k++) {
        pf[k] = t->pfeat + (size_t)gs[k] * inner * FP_TREES_LANES;
        pt[k] = t->pthr + (size_t)gs[k] * inner * FP_TREES_LANES;
        pl[k] = t->pleaf + (size_t)gs[k] * leaves * FP_TREES_LANES;
        lane[k] = _mm256_add_epi32(iota, _mm256_set1_epi32(hs[k] * 8));
        idx[k] = _mm256_setzero_si256();
    }
    const __m256i two = _mm256_set1_epi32(2);
    /* levels 0-2 hold 1, 2 and 4 nodes: their feature and threshold are plain loads picked
     * by the lanes' earlier comparisons (blends), not gathers; only x[f] is gathered */
    __m256 c0[FP_TV], c1[FP_TV];
#define FP_NODE_F(k, i) _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(pf[k] + (i) * FP_TREES_LANES + hs[k] * 8)))
#define FP_NODE_T(k, i) _mm256_loadu_ps(pt[k] + (i) * FP_TREES_LANES + hs[k] * 8)
    if (D > 0) {
        for (int k = 0; k < n; k++) {
            const __m256 xv = _mm256_i32gather_ps(x, _mm256_castps_si256(FP_NODE_F(k, 0)), 4);
            c0[k] = _mm256_cmp_ps(xv, FP_NODE_T(k, 0), _CMP_LE_OQ);
            idx[k] = _mm256_add_epi32(two, _mm256_castps_si256(c0[k]));
        }
    }
    if (D > 1) {
        for (int k = 0; k < n; k++) {
            const __m256 f = _mm256_blendv_ps(FP_NODE_F(k, 2), FP_NODE_F(k, 1), c0[k]);
            const __m256 tv = _mm256_blendv_ps(FP_NODE_T(k, 2), FP_NODE_T(k, 1), c0[k]);
            const __m256 xv = _mm256_i32gather_ps(x, _mm256_castps_si256(f), 4);
            c1[k] = _mm256_cmp_ps(xv, tv, _CMP_LE_OQ);
            idx[k] = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(idx[k], idx[k]), two),
                                      _mm256_castps_si256(c1[k]));
        }
    }
    if (D > 2) {
        for (int k = 0; k < n; k++) {
            const __m256 f = _mm256_blendv_ps(
                _mm256_blendv_ps(FP_NODE_F(k, 6), FP_NODE_F(k, 5), c1[k]),
                _mm256_blendv_ps(FP_NODE_F(k, 4), FP_NODE_F(k, 3), c1[k]), c0[k]);
            const __m256 tv = _mm256_blendv_ps(
                _mm256_blendv_ps(FP_NODE_T(k, 6), FP_NODE_T(k, 5), c1[k]),
                _mm256_blendv_ps(FP_NODE_T(k, 4), FP_NODE_T(k, 3), c1[k]), c0[k]);
            const __m256 xv = _mm256_i32gather_ps(x, _mm256_castps_si256(f), 4);
            const __m256i c = _mm256_castps_si256(_mm256_cmp_ps(xv, tv, _CMP_LE_OQ));
            idx[k] = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(idx[k], idx[k]), two), c);
        }
    }
#undef FP_NODE_F
#undef FP_NODE_T
    for (int l = 3; l < D; l++) {
        for (int k = 0; k < n; k++) {
            const __m256i o = _mm256_add_epi32(_mm256_slli_epi32(idx[k], 4), lane[k]);
            const __m256i f = _mm256_i32gather_epi32((const int *)pf[k], o, 4);
            const __m256 tv = _mm256_i32gather_ps(pt[k], o, 4);
            const __m256 xv = _mm256_i32gather_ps(x, f, 4);
            const __m256i c = _mm256_castps_si256(_mm256_cmp_ps(xv, tv, _CMP_LE_OQ));
            idx[k] = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(idx[k], idx[k]), two), c);
        }
    }
    const __m256i in = _mm256_set1_epi32((int)inner);
    for (int k = 0; k < n; k++) {
        const __m256i o = _mm256_add_epi32(_mm256_slli_epi32(_mm256_sub_epi32(idx[k], in), 4), lane[k]);
        v[k] = _mm256_i32gather_ps(pl[k], o, 4);
    }
}

/* the lane walk (fp_trees.h): a batch's 16 trees as two vectors of 8 node indices; a step
 * gathers each lane's threshold and feature|offset (8-byte nodes), then x[feature] */
FP_TARGET_AVX2 void fp_trees_lanes_avx2(const fp_trees *t, const float *x, const fp_wbatch *b,
                                        int nb, float *vals) {
    const float *wf = (const float *)t->wnodes;
    const int *wi = (const int *)t->wnodes + 1;
    const __m256i one = _mm256_set1_epi32(1), lo16 = _mm256_set1_epi32(0xffff);
    for (int q = 0; q < nb; q++) {
        __m256i i0 = _mm256_loadu_si256((const __m256i *)b[q].node);
        __m256i i1 = _mm256_loadu_si256((const __m256i *)(b[q].node + 8));
        for (int l = 0; l < b[q].iters; l++) {
            const __m256 t0 = _mm256_i32gather_ps(wf, i0, 8), t1 = _mm256_i32gather_ps(wf, i1, 8);
            const __m256i m0 = _mm256_i32gather_epi32(wi, i0, 8), m1 = _mm256_i32gather_epi32(wi, i1, 8);
            const __m256i o0 = _mm256_srli_epi32(m0, 16), o1 = _mm256_srli_epi32(m1, 16);
            const __m256 x0 = _mm256_i32gather_ps(x, _mm256_and_si256(m0, lo16), 4);
            const __m256 x1 = _mm256_i32gather_ps(x, _mm256_and_si256(m1, lo16), 4);
            /* a leaf's threshold is NaN: the ordered x <= NaN is false and its offset 0 */
            const __m256i c0 = _mm256_castps_si256(_mm256_cmp_ps(x0, t0, _CMP_LE_OQ));
            const __m256i c1 = _mm256_castps_si256(_mm256_cmp_ps(x1, t1, _CMP_LE_OQ));
            i0 = _mm256_add_epi32(i0, _mm256_blendv_epi8(o0, one, c0));
            i1 = _mm256_add_epi32(i1, _mm256_blendv_epi8(o1, one, c1));
            const __m256i mv = _mm256_or_si256(o0, o1);
            if (_mm256_testz_si256(mv, mv)) break;
        }
        int32_t idx[FP_TREES_WALK_LANES];
        _mm256_storeu_si256((__m256i *)idx, i0);
        _mm256_storeu_si256((__m256i *)(idx + 8), i1);
        for (int k = 0; k < FP_TREES_WALK_LANES; k++)
            if (b[q].slot[k] >= 0)
                vals[b[q].slot[k]] = t->wleaf[idx[k]];
    }
}

FP_TARGET_AVX2 void fp_trees_eval_avx2(const fp_trees *t, const float *x, float *out) {
    double acc[FP_TREES_MAX_TARGETS];
    float vals[FP_TREES_WALK_MAX_TREES];
    fp_trees_acc_init(t, acc);
    if (fp_trees_has_nan(x, t->n_feat)) {
        fp_trees_walk_all_compact(t, x, acc);
        fp_trees_finalize(t, acc, out);
        return;
    }
    if (t->mode == FP_TREES_MODE_ALL) {
        (t->gather ? fp_trees_lanes_avx2 : fp_trees_lanes_scalar)(t, x, t->wall, t->n_wall, vals);
        fp_trees_sum_all(t, vals, acc);
        fp_trees_finalize(t, acc, out);
        return;
    }
    if (!t->pgather) {
        fp_trees_perfect_steps(t, x, acc);
    } else {
        __m256 v[FP_TV];
        int gs[FP_TV], hs[FP_TV];
        for (int g = 0; g < t->n_groups; g += FP_TV / 2) {
            const int ng = t->n_groups - g < FP_TV / 2 ? t->n_groups - g : FP_TV / 2;
            for (int k = 0; k < 2 * ng; k++) { gs[k] = g + k / 2; hs[k] = k & 1; }
            fp_walk8(t, x, gs, hs, 2 * ng, v);
            for (int k = 0; k < ng; k++)
                acc[t->ptarget[g + k]] += fp_hsum16d(v[2 * k], v[2 * k + 1]);
        }
    }
    if (t->mode == FP_TREES_MODE_REST) {
        (t->gather ? fp_trees_lanes_avx2 : fp_trees_lanes_scalar)(t, x, t->wrest, t->n_wrest, vals);
        fp_trees_sum_rest(t, vals, acc);
    } else {
        for (int r = 0; r < t->n_rest; r++) fp_trees_walk_compact(t, t->rest[r], x, acc);
    }
    fp_trees_finalize(t, acc, out);
}
#endif
