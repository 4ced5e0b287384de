/* trees_scalar.c: the tree-ensemble evaluator without vector instructions (the reference
 * the vector sets are tested against, and what a CPU without AVX2 runs). The perfect part
 * is walked lane by lane in the same layout the vector sets gather from. */
#include "../fp_trees.h"

void fp_trees_eval_scalar(const fp_trees *t, const float *x, float *out) {
    double acc[FP_TREES_MAX_TARGETS];
    fp_trees_acc_init(t, acc);
    if (fp_trees_has_nan(x, t->n_feat)) {
        /* the perfect layout has no missing-value flags: a NaN takes the exact walk, adding
         * the perfect groups' trees in the order the loop below adds them */
        fp_trees_walk_all_compact(t, x, acc);
        fp_trees_finalize(t, acc, out);
        return;
    }
    const int D = t->depth;
    const size_t inner = ((size_t)1 << D) - 1, leaves = (size_t)1 << D;
    for (int g = 0; g < t->n_groups; g++) {
        const int32_t *pf = t->pfeat + (size_t)g * inner * FP_TREES_LANES;
        const float *pt = t->pthr + (size_t)g * inner * FP_TREES_LANES;
        const float *pl = t->pleaf + (size_t)g * leaves * FP_TREES_LANES;
        /* in double, as the compact walk adds: a float sum of 16 leaves (1e8, 1, ..., -1e8)
         * loses what the same trees add on the compact path (taken when any feature is NaN);
         * in the vector sets' pairwise order (fp_trees_sum16), not lane by lane */
        double d[FP_TREES_LANES];
        for (int lane = 0; lane < FP_TREES_LANES; lane++) {
            size_t idx = 0;
            for (int l = 0; l < D; l++) {
                const size_t o = idx * FP_TREES_LANES + lane;
                idx = 2 * idx + 2 - (size_t)(x[pf[o]] <= pt[o]);
            }
            d[lane] = pl[(idx - inner) * FP_TREES_LANES + lane];
        }
        acc[t->ptarget[g]] += fp_trees_sum16(d);
    }
    for (int r = 0; r < t->n_rest; r++) fp_trees_walk_compact(t, t->rest[r], x, acc);
    fp_trees_finalize(t, acc, out);
}
