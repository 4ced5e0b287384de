/* trees_scalar.c: the tree-ensemble evaluator without vector instructions (the reference
 * the vector sets are tested against, and what a CPU without AVX2 runs). The perfect part
 * and the lane walk step their 16 trees one after the other inside each level, in the same
 * layout the vector sets gather from, so that 16 chains of loads overlap. */
#include "../fp_trees.h"
#include <string.h>

void fp_trees_lanes_scalar(const fp_trees *t, const float *x, const fp_wbatch *b, int nb, float *vals) {
    const fp_wnode *w = t->wnodes;
    for (int q = 0; q < nb; q++) {
        /* size_t indices and offsets: the node address is one addressing mode and the select
         * one cmov, with no sign or zero extension between them (8 instructions a step; int32
         * indices took 11) */
        size_t idx[FP_TREES_WALK_LANES];
        for (int k = 0; k < FP_TREES_WALK_LANES; k++) idx[k] = (size_t)(uint32_t)b[q].node[k];
        const int iters = b[q].iters;
        for (int l = 0; l < iters; l++) {
            size_t moved = 0;
            for (int k = 0; k < FP_TREES_WALK_LANES; k++) {
                const fp_wnode *n = w + idx[k];
                const size_t off = n->off;
                moved |= off;
                /* a leaf's threshold is NaN: x <= NaN is false and its offset 0 */
                idx[k] += x[n->feat] <= n->thr ? (size_t)1 : off;
            }
            if (!moved) break;
        }
        for (int k = 0; k < FP_TREES_WALK_LANES; k++)
            if (b[q].slot[k] >= 0)
                vals[b[q].slot[k]] = t->wleaf[idx[k]];
    }
}

void fp_trees_perfect_steps(const fp_trees *t, const float *x, double *acc) {
    const int D = t->depth;
    const size_t inner = ((size_t)1 << D) - 1, leaves = (size_t)1 << D;
    for (int g = 0; g < t->n_groups; g++) {
        const int32_t *pf = t->pfeat + (size_t)g * inner * FP_TREES_LANES;
        const float *pt = t->pthr + (size_t)g * inner * FP_TREES_LANES;
        const float *pl = t->pleaf + (size_t)g * leaves * FP_TREES_LANES;
        /* level by level, the 16 lanes inside: a lane's levels are a chain of dependent
         * loads, the lanes are not, so 16 chains overlap instead of one */
        uint32_t idx[FP_TREES_LANES];
        for (int lane = 0; lane < FP_TREES_LANES; lane++) idx[lane] = 0;
        for (int l = 0; l < D; l++)
            for (int lane = 0; lane < FP_TREES_LANES; lane++) {
                const size_t o = (size_t)idx[lane] * FP_TREES_LANES + (size_t)lane;
                idx[lane] = 2 * idx[lane] + 2 - (uint32_t)(x[pf[o]] <= pt[o]);
            }
        /* in double, as the compact walk adds: a float sum of 16 leaves (1e8, 1, ..., -1e8)
         * loses what the same trees add on the compact path (taken when any feature is NaN);
         * in the vector sets' pairwise order (fp_trees_sum16), not lane by lane */
        double d[FP_TREES_LANES];
        for (int lane = 0; lane < FP_TREES_LANES; lane++)
            d[lane] = pl[((size_t)idx[lane] - inner) * FP_TREES_LANES + (size_t)lane];
        acc[t->ptarget[g]] += fp_trees_sum16(d);
    }
}

void fp_trees_eval_scalar(const fp_trees *t, const float *x, float *out) {
    double acc[FP_TREES_MAX_TARGETS];
    float vals[FP_TREES_WALK_MAX_TREES];
    fp_trees_acc_init(t, acc);
    if (fp_trees_has_nan(x, t->n_feat)) {
        /* the perfect layout has no missing-value flags: a NaN takes the exact walk, adding
         * the perfect groups' trees in the order the loop below adds them */
        fp_trees_walk_all_compact(t, x, acc);
        fp_trees_finalize(t, acc, out);
        return;
    }
    if (t->mode == FP_TREES_MODE_ALL) {
        fp_trees_lanes_scalar(t, x, t->wall, t->n_wall, vals);
        fp_trees_sum_all(t, vals, acc);
        fp_trees_finalize(t, acc, out);
        return;
    }
    fp_trees_perfect_steps(t, x, acc);
    if (t->mode == FP_TREES_MODE_REST) {
        fp_trees_lanes_scalar(t, x, t->wrest, t->n_wrest, vals);
        fp_trees_sum_rest(t, vals, acc);
    } else {
        for (int r = 0; r < t->n_rest; r++) fp_trees_walk_compact(t, t->rest[r], x, acc);
    }
    fp_trees_finalize(t, acc, out);
}
