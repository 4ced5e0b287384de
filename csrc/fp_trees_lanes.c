/* fp_trees_lanes.c: what the kernel sets share around the lane walk (fp_trees.h): adding
 * its leaves in the compact walk's order, and choosing at load which walk a model runs by
 * timing each on rows near its own thresholds. */
#include "fp_trees.h"
#include "fp_clock.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

void fp_trees_sum_rest(const fp_trees *t, const float *vals, double *acc) {
    for (int r = 0; r < t->n_rest; r++) acc[t->trees[t->rest[r]].target] += vals[r];
}

void fp_trees_sum_all(const fp_trees *t, const float *vals, double *acc) {
    for (int g = 0; g < t->n_groups; g++) {
        const int32_t *lt = t->ptree + (size_t)g * FP_TREES_LANES;
        double d[FP_TREES_LANES];
        for (int lane = 0; lane < FP_TREES_LANES; lane++) d[lane] = lt[lane] < 0 ? 0.0 : (double)vals[lt[lane]];
        acc[t->ptarget[g]] += fp_trees_sum16(d);
    }
    for (int r = 0; r < t->n_rest; r++) {
        const int tr = t->rest[r];
        acc[t->trees[tr].target] += vals[tr];
    }
}

static uint64_t fp_lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

#define FP_CHOOSE_ROWS 64
#define FP_CHOOSE_BLOCK 4
/* rounds over the rows: at least MIN_REPS, then more in pairs until MIN_NS have passed (a
 * small model's few microseconds fall in one scheduler slice, or one preemption) */
#define FP_CHOOSE_MIN_REPS 6
#define FP_CHOOSE_MAX_REPS 64
#define FP_CHOOSE_MIN_NS 5000000

static int fp_cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void fp_trees_choose(fp_trees *t, fp_trees_eval_fn ev) {
    t->mode = FP_TREES_MODE_COMPACT;
    t->gather = 0;
    t->pgather = 1;
    for (int c = 0; c < FP_TREES_CHOOSE_CANDS; c++) t->choose_ns[c] = -1;
    if (!ev || (!t->walk_ok && !t->n_groups)) return;
    const size_t nf = (size_t)t->n_feat;
    float *rows = (float *)malloc(sizeof(float) * nf * FP_CHOOSE_ROWS);
    float *out = (float *)malloc(sizeof(float) * ((size_t)t->n_out + 1));
    int64_t *ns = (int64_t *)malloc(sizeof(int64_t) * FP_TREES_CHOOSE_CANDS * FP_CHOOSE_ROWS * FP_CHOOSE_MAX_REPS);
    if (!rows || !out || !ns) { free(rows); free(out); free(ns); return; }
    /* each feature from a random split's threshold, just above or below it: paths as real
     * rows take them, not all-left ones (a feature no split reads stays 0) */
    const int n_nodes = t->n_nodes;
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    memset(rows, 0, sizeof(float) * nf * FP_CHOOSE_ROWS);
    for (int i = 0; i < FP_CHOOSE_ROWS; i++) {
        float *x = rows + (size_t)i * nf;
        for (size_t k = 0; k < 4 * nf; k++) {
            const fp_tnode *n = &t->nodes[fp_lcg(&s) % (uint64_t)n_nodes];
            if (n->flags & FP_TN_LEAF) continue;
            x[n->feat] = nextafterf(n->thr, (fp_lcg(&s) & 1) ? INFINITY : -INFINITY);
        }
        for (size_t f = 0; f < nf; f++)
            if (!isfinite(x[f])) x[f] = 0.0f;
    }
    /* (mode, gather, pgather) candidates; REST is COMPACT when no tree or every tree is a
     * rest tree; the perfect groups' two walks only where there are groups and a vector set
     * (the scalar set steps either way) */
    static const int cand[FP_TREES_CHOOSE_CANDS][3] = {
        {FP_TREES_MODE_COMPACT, 0, 1}, {FP_TREES_MODE_COMPACT, 0, 0}, {FP_TREES_MODE_REST, 0, 1},
        {FP_TREES_MODE_REST, 1, 1}, {FP_TREES_MODE_REST, 0, 0}, {FP_TREES_MODE_REST, 1, 0},
        {FP_TREES_MODE_ALL, 0, 1}, {FP_TREES_MODE_ALL, 1, 1}};
    const int rest_differs = t->n_rest && t->n_groups;
    const int two_perfect = t->n_groups && ev != fp_trees_eval_scalar;
    int act[FP_TREES_CHOOSE_CANDS], n_act = 0, cnt[FP_TREES_CHOOSE_CANDS] = {0};
    for (int c = 0; c < FP_TREES_CHOOSE_CANDS; c++) {
        if (cand[c][0] != FP_TREES_MODE_COMPACT && !t->walk_ok) continue;
        if (cand[c][0] == FP_TREES_MODE_REST && !rest_differs) continue;
        if (cand[c][0] != FP_TREES_MODE_ALL && !cand[c][2] && !two_perfect) continue;
        act[n_act++] = c;
    }
    /* Blocks of FP_CHOOSE_BLOCK rows are dealt to the candidates in turn, the deal rotating
     * every rep and reversed every other one; a candidate walks a block's first row untimed,
     * then each next row is timed alone. Each is then timed in its own steady state (the
     * nodes every row reads warm from its own walk, each row new to it), a change of load
     * hits all of them alike, and the median per row drops preemptions. Timed one after the
     * other over the same 16 rows, the lane walk with gathers read the nodes the scalar
     * lane walk had just brought into L2 / L3 and won on a model living in L3 (Zen 3, 1,000
     * x 256 leaves: gathers every time, the scalar steps 13% faster on fresh rows); dealt
     * row by row, gathers always came right after the scalar steps and won again. */
    for (int i = 0; i < FP_CHOOSE_ROWS; i++) ev(t, rows + (size_t)i * nf, out);
    const int64_t start = fp_mono_ns();
    for (int rep = 0; rep < FP_CHOOSE_MAX_REPS; rep++) {
        if (rep >= FP_CHOOSE_MIN_REPS && !(rep & 1) && fp_mono_ns() - start >= FP_CHOOSE_MIN_NS) break;
        for (int blk = 0; blk < FP_CHOOSE_ROWS / FP_CHOOSE_BLOCK; blk++) {
            const int k = (blk + rep) % n_act;
            const int c = act[rep & 1 ? n_act - 1 - k : k];
            t->mode = cand[c][0];
            t->gather = cand[c][1];
            t->pgather = cand[c][2];
            const float *blk_rows = rows + (size_t)blk * FP_CHOOSE_BLOCK * nf;
            ev(t, blk_rows, out);
            for (int i = 1; i < FP_CHOOSE_BLOCK; i++) {
                const int64_t t0 = fp_mono_ns();
                ev(t, blk_rows + (size_t)i * nf, out);
                ns[c * FP_CHOOSE_ROWS * FP_CHOOSE_MAX_REPS + cnt[c]++] = fp_mono_ns() - t0;
            }
        }
    }
    int64_t best[FP_TREES_CHOOSE_CANDS];
    for (int c = 0; c < FP_TREES_CHOOSE_CANDS; c++) {
        best[c] = INT64_MAX;
        if (!cnt[c]) continue;
        int64_t *v = ns + c * FP_CHOOSE_ROWS * FP_CHOOSE_MAX_REPS;
        qsort(v, (size_t)cnt[c], sizeof(int64_t), fp_cmp_i64);
        best[c] = v[cnt[c] / 2] > 0 ? v[cnt[c] / 2] : 1;
    }
    int pick = act[0];
    for (int c = 0; c < FP_TREES_CHOOSE_CANDS; c++)
        if (best[c] < best[pick]) pick = c;
    for (int c = 0; c < FP_TREES_CHOOSE_CANDS; c++)
        t->choose_ns[c] = best[c] == INT64_MAX ? -1 : best[c];
    t->mode = cand[pick][0];
    t->gather = cand[pick][1];
    t->pgather = cand[pick][2];
    free(rows);
    free(out);
    free(ns);
}
