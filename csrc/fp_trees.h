/* fp_trees.h: tree ensembles (ONNX ai.onnx.ml TreeEnsembleRegressor / TreeEnsembleClassifier)
 * packed into one 64-byte aligned arena and evaluated for one feature vector.
 *
 * Decisions:
 * - Every split is normalized to one comparison at load: LT becomes LEQ against the float
 *   just below the threshold (x < t <=> x <= nextafter(t, -inf) for every float x), GT and
 *   GTE become LEQ / LT with the children swapped, NEQ becomes EQ with the children swapped.
 *   Where a NaN goes is decided at load too (the missing-value track, else where the
 *   original comparison sends a NaN: the false branch, the true one for NEQ) and kept as a
 *   per-node flag, so swapping children never changes where a NaN lands. An LT / GTE split
 *   at |t| <= FLT_MIN keeps x < t instead (a compact-walk flag; its tree is not made
 *   perfect): the float below such a t is subnormal or 0, which a thread with MXCSR's
 *   denormals-are-zero reads as 0, so x = 0 would satisfy x <= below but not x < 0.
 * - Trees of depth <= FP_TREES_PERFECT_DEPTH with only LEQ splits and one target per tree
 *   (regressors, boosted classifiers) under SUM / AVERAGE are also expanded to perfect
 *   trees of the ensemble's largest such depth (a short branch is padded with splits that
 *   always go left, its leaf value repeated), 16 trees per group stored lane-interleaved
 *   ([group][node][lane]), all trees of a group adding to one target. A vector lane then
 *   walks one tree with no branch: idx = 2 idx + 1 + !(x[f] <= t), gathers for the feature,
 *   the threshold and the leaf; AVX2 takes a group as two halves of 8 lanes, AVX-512 as one
 *   vector of 16. Lane-interleaving makes the root level a plain load.
 * - Every tree also lives in a compact node array (16-byte nodes in preorder, the true
 *   child next, the false child by index) walked one tree at a time: for deeper trees, EQ
 *   splits, strict LT / GTE splits near 0, multi-target leaves, MIN / MAX, and for any input
 *   holding a NaN (the perfect layout assumes ordered comparisons, so a missing value takes
 *   the exact path). That path still adds a perfect group's trees as one group (ptree names
 *   the tree in each lane), in fp_trees_sum16's order, then the rest: a NaN that changes no
 *   decision changes no bit of the output.
 * - Lane walk (fp_trees_lanes.c): ensembles of one-target trees with only x <= t splits
 *   under SUM / AVERAGE also get 8-byte nodes (threshold, feature, offset of the false
 *   child; the true child next) in the compact order, a leaf being a node whose
 *   threshold is NaN and offset 0 (no ordered x is <= NaN, so it stays there). Trees are
 *   batched 16 at a time by depth and walked in lockstep: 16 independent chains of
 *   dependent loads in flight instead of one, for deep (leaf-wise) trees and for large
 *   ensembles that live in L2 / L3. Each tree's leaf is then added exactly where and in the
 *   order the compact walk adds it, so the lane walk changes no bit of the output. Which of
 *   compact / lanes-for-the-rest / lanes-for-all runs is measured at load (fp_trees_choose,
 *   blocks of rows dealt to the candidates in turn). One batch of 16 at a time stays: 16 lane indices
 *   fit the registers; 2-4 batches interleaved (32-64 chains, each batch exiting alone), a
 *   lane taking the next tree at its leaf, lanes compacted as they finish, and AVX2 gathers
 *   over two batches all ran 10-40% slower on Zen 3, on the 12K-node model (bound by the
 *   steps' instructions) and on the 511K-node one (bound by misses that more chains did
 *   not overlap); batch order is not the waste either (docs/kernels-notes.md).
 * - Leaves add per target in double; the post stage (base values, aggregate, post
 *   transform, the binary classifier rule) is computed in float as onnxruntime does
 *   (core/providers/cpu/ml/tree_ensemble_aggregator.h, ml_common.h), so the outputs are what
 *   it returns: regressors' values, classifiers' class probabilities.
 */
#ifndef FP_TREES_H
#define FP_TREES_H

#include "fp_simd.h"

#define FP_TREES_PERFECT_DEPTH 10
#define FP_TREES_LANES 16
#define FP_TREES_MAX_TARGETS 4096
#define FP_TREES_MAX_DEPTH 4096
/* the largest arena the packer lays out (fastpath.model.trees.MAX_PACKED_BYTES, which refuses
 * first with the numbers): a few-MB description naming thousands of targets on every leaf
 * would otherwise ask for GBs. Checked on the plan, before the arena exists. */
#define FP_TREES_MAX_ARENA_BYTES ((size_t)1 << 30)

/* split modes as ONNX names them; LEAF marks a leaf */
enum { FP_TMODE_LEQ = 0, FP_TMODE_LT = 1, FP_TMODE_GTE = 2, FP_TMODE_GT = 3, FP_TMODE_EQ = 4,
       FP_TMODE_NEQ = 5, FP_TMODE_LEAF = 6 };
enum { FP_TAGG_SUM = 0, FP_TAGG_AVERAGE = 1, FP_TAGG_MIN = 2, FP_TAGG_MAX = 3 };
enum { FP_TPOST_NONE = 0, FP_TPOST_LOGISTIC = 1, FP_TPOST_SOFTMAX = 2, FP_TPOST_SOFTMAX_ZERO = 3,
       FP_TPOST_PROBIT = 4 };

/* A validated ensemble as flat arrays (fastpath.model.trees.TreeEnsemble checks it; the
 * packer re-checks bounds and shape so a bad description is refused, never walked).
 * Tree t owns nodes [tree_off[t], tree_off[t + 1]); its first node is its root; children
 * are node indices local to the tree. Leaf weights are (node, target, value) triples, the
 * node a global index. */
typedef struct {
    int n_feat, n_targets, n_trees, n_nodes, n_weights, n_base;
    int aggregate, post, classifier;
    const int32_t *tree_off;          /* n_trees + 1 */
    const int32_t *feat, *mode, *true_child, *false_child;
    const uint8_t *nan_true;          /* missing_value_tracks_true per node */
    const float *thr;
    const int32_t *w_node, *w_target;
    const float *w_value;
    const float *base;                /* n_base: 0, 1 or n_targets values */
} fp_trees_desc;

/* compact node: leaf when flags & FP_TN_LEAF (then `other` is its offset in the leaf
 * values); else true child = this + 1, false child = other (tree-local index) */
typedef struct {
    float thr;
    int32_t feat;
    int32_t other;
    int32_t flags;
} fp_tnode;
/* FP_TN_LT: true branch when x < thr (an LT / GTE split near 0, see fp_normalize) */
enum { FP_TN_LEAF = 1, FP_TN_EQ = 2, FP_TN_NAN_TRUE = 4, FP_TN_LT = 8 };

typedef struct {
    int32_t root;         /* first node in nodes[] */
    int32_t width;        /* leaf values per leaf: 1 (all to `target`) or n_targets */
    int32_t target;
    int32_t pad;
} fp_ttree;

/* lane-walk node: leaf when thr is NaN (then off is 0); else true child = this + 1, false
 * child = this + off. 8 bytes, read as one load; a leaf's value is wleaf[node] (the same
 * float as leafv[nodes[node].other]), one read at the end of a walk instead of two dependent
 * ones through the 16-byte compact node, which for a large ensemble are two cache misses */
typedef struct {
    float thr;
    uint16_t feat;
    uint16_t off;
} fp_wnode;

#define FP_TREES_WALK_LANES 16
/* the lane walk keeps one float per tree on the stack: larger ensembles walk compactly */
#define FP_TREES_WALK_MAX_TREES 8192

/* 16 trees walked together: each lane's root (an index into wnodes; wnodes' last entry is a
 * leaf for padding lanes), where its leaf value goes (-1: a padding lane) and the depth
 * of the deepest tree (an upper bound of the steps) */
typedef struct {
    int32_t iters;
    int32_t node[FP_TREES_WALK_LANES];
    int32_t slot[FP_TREES_WALK_LANES];
} fp_wbatch;

/* which walk runs (fp_trees_choose picks one at load; every one gives the same bits):
 * COMPACT perfect groups + compact walk of the rest; REST perfect groups + lane walk of the
 * rest; ALL lane walk of every tree */
enum { FP_TREES_MODE_COMPACT = 0, FP_TREES_MODE_REST = 1, FP_TREES_MODE_ALL = 2 };
/* the (mode, gather, pgather) triples fp_trees_choose times, in its order (fp_trees_lanes.c) */
#define FP_TREES_CHOOSE_CANDS 8

typedef struct fp_trees {
    int n_feat, n_targets, n_trees, n_out;
    int aggregate, post, classifier;
    int n_base;
    const uint8_t *has;   /* per target: every path scores it (onnxruntime's has_score) */
    int bin_single;       /* binary classifier whose weights name one class (ORT's binary_case) */
    int bin_positive;     /* ... and all weights >= 0 */
    const float *base;
    /* perfect part: n_groups groups of 16 lanes, `depth` levels */
    int depth, n_groups;
    const int32_t *pfeat;   /* [g][2^depth - 1][16] */
    const float *pthr;      /* [g][2^depth - 1][16] */
    const float *pleaf;     /* [g][2^depth][16] */
    const int32_t *ptarget; /* [g] */
    const int32_t *ptree;   /* [g][16]: the tree in each lane, -1 for a padding lane */
    /* compact part: every tree; `rest` lists the trees the perfect part does not hold */
    const fp_tnode *nodes;
    const float *leafv;
    const fp_ttree *trees;
    const int32_t *rest;
    int n_rest;
    /* lane walk (walk_ok: the layout exists): wnodes in the compact order plus a padding
     * leaf; wrest batches the `rest` trees (slot: position in rest), wall every tree (slot:
     * tree index) */
    int walk_ok, mode, n_nodes;
    int gather;   /* the vector sets' lane walk: gathers (1) or the scalar steps (0) */
    int pgather;  /* the vector sets' perfect groups: gathers (1) or the scalar steps (0) */
    const fp_wnode *wnodes;
    const float *wleaf;   /* per wnode: its leaf value (0 for a split and the padding leaf) */
    const fp_wbatch *wrest, *wall;
    int n_wrest, n_wall;
    /* what fp_trees_choose measured: each candidate's median ns per row, -1 where a
     * candidate does not apply to this model (for the bench and the tests) */
    int64_t choose_ns[FP_TREES_CHOOSE_CANDS];
    void *arena;
    size_t arena_bytes;
    int arena_external;
} fp_trees;

/* bytes of the arena for this description (0 when it is malformed or would pass
 * FP_TREES_MAX_ARENA_BYTES) */
size_t fp_trees_arena_bytes(const fp_trees_desc *d);
/* pack d into mem (64-byte aligned, fp_trees_arena_bytes long) or a fresh allocation when
 * mem is NULL. 0, -1 on a malformed description or one whose arena would pass
 * FP_TREES_MAX_ARENA_BYTES, -2 when out of memory. */
int fp_trees_init(fp_trees *t, const fp_trees_desc *d, void *mem);
void fp_trees_free(fp_trees *t);

/* out[n_out] = the ensemble at x (n_feat floats; NaN is a missing value) */
typedef void (*fp_trees_eval_fn)(const fp_trees *t, const float *x, float *out);
void fp_trees_eval_scalar(const fp_trees *t, const float *x, float *out);
#if FP_HAVE_X86
void fp_trees_eval_avx2(const fp_trees *t, const float *x, float *out);
void fp_trees_eval_avx512(const fp_trees *t, const float *x, float *out);
#endif
/* the evaluator for an ISA, NULL when this CPU cannot run it */
fp_trees_eval_fn fp_trees_eval_for(fp_isa isa);

/* shared by the kernel sets: acc[n_targets] (+)= the compact walk of tree i; the
 * finishing stage (base values, aggregate, post transform) from the per-target sums */
void fp_trees_walk_compact(const fp_trees *t, int i, const float *x, double *acc);
/* acc (+)= every tree by the compact walk (an input holding a NaN), added in the order the
 * perfect part adds them: group by group, a group's lanes by fp_trees_sum16, then `rest` */
void fp_trees_walk_all_compact(const fp_trees *t, const float *x, double *acc);
void fp_trees_acc_init(const fp_trees *t, double *acc);
void fp_trees_finalize(const fp_trees *t, const double *acc, float *out);
/* the lane walk's sums, in the compact walk's order: acc (+)= vals[r] (the leaf of tree
 * rest[r]) for r in order; every tree from vals[tree] as fp_trees_walk_all_compact adds */
void fp_trees_sum_rest(const fp_trees *t, const float *vals, double *acc);
void fp_trees_sum_all(const fp_trees *t, const float *vals, double *acc);
/* the lane walk of nb batches at x (no NaN) in each set: vals[slot] = leaf value */
void fp_trees_lanes_scalar(const fp_trees *t, const float *x, const fp_wbatch *b, int nb, float *vals);
#if FP_HAVE_X86
void fp_trees_lanes_avx2(const fp_trees *t, const float *x, const fp_wbatch *b, int nb, float *vals);
void fp_trees_lanes_avx512(const fp_trees *t, const float *x, const fp_wbatch *b, int nb, float *vals);
#endif
/* acc (+)= the perfect groups by scalar steps, a group's 16 lanes interleaved level by level
 * (16 independent chains of loads in flight), added as the vector sets add them; what the
 * scalar set runs, and the vector sets where it beats their gathers (t->pgather 0) */
void fp_trees_perfect_steps(const fp_trees *t, const float *x, double *acc);
/* time each walk this model has on rows near its thresholds with `ev` (blocks of 4 of 64
 * rows dealt to the candidates in turn, 6 rounds or more until 5 ms have passed, the
 * median ns per row) and keep the fastest in t->mode,
 * t->gather and t->pgather (COMPACT when the lane walk does not exist), each candidate's
 * median in t->choose_ns: gathers beat the scalar steps on some CPUs, not on others (Zen 3:
 * 2x slower: a gather there costs about one cycle per lane, the scalar steps three loads per
 * level spread over three ports) */
void fp_trees_choose(fp_trees *t, fp_trees_eval_fn ev);
/* 1 when some x[i] is NaN */
int fp_trees_has_nan(const float *x, int n);

/* A group's 16 leaves (lane order) added in double in the one order every set uses: halves
 * first, t[i] = d[i] + d[i+8], then u[i] = t[i] + t[i+4], v[i] = u[i] + u[i+2], v[0] + v[1]
 * (AVX-512: two 8-lane halves, then its 256- and 128-bit halves; AVX2: the same pairs from
 * its two 8-lane vectors). A double sum of floats is exact only while their exponents lie
 * within ~2^25 of each other: leaves 1e20, 1, -1e20 gave 0 added in lane order (scalar),
 * 1 in AVX2's pairs and in AVX-512's, so a tick's signal depended on the kernel set. */
static inline double fp_trees_sum16(const double *d) {
    double t[8], u[4];
    for (int i = 0; i < 8; i++) t[i] = d[i] + d[i + 8];
    for (int i = 0; i < 4; i++) u[i] = t[i] + t[i + 4];
    return (u[0] + u[2]) + (u[1] + u[3]);
}

#endif
