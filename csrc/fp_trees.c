/* fp_trees.c: packing a tree-ensemble description into the arena (see fp_trees.h for the
 * layout and why), the compact walk and the finishing stage the kernel sets share, and the
 * choice of the kernel set. */
#include "fp_trees.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What the packer learns about the description before laying it out. */
typedef struct {
    int *depth;       /* per tree */
    int *width;       /* per tree: 1 or n_targets */
    int *target;      /* per tree, width 1 */
    int *perfect;     /* per tree: goes to the perfect part */
    int *leaf_off;    /* per node: offset of its values in leafv (leaves), else -1 */
    int *wcount;      /* per node: weights on it */
    size_t n_leafv;
    int D, n_groups;
    int walk_ok, nb_rest, nb_all;   /* the lane walk's layout and batch counts */
    size_t o_wnodes, o_wleaf, o_wrest, o_wall;
    size_t bytes, o_nodes, o_leafv, o_trees, o_rest, o_pfeat, o_pthr, o_pleaf, o_ptarget, o_ptree, o_base, o_has;
    int n_rest;
} fp_plan;

static void fp_plan_free(fp_plan *pl) {
    free(pl->depth); free(pl->width); free(pl->target); free(pl->perfect);
    free(pl->leaf_off); free(pl->wcount);
}

static int fp_is_leaf(const fp_trees_desc *d, int g) { return d->mode[g] == FP_TMODE_LEAF; }

/* an LT / GTE split at t keeps x < t in the compact walk (see fp_normalize) */
static int fp_strict_lt(float t) { return fabsf(t) <= FLT_MIN; }

/* depth of tree t by an explicit-stack walk; -1 when a child is out of range, a node is
 * reached twice (a cycle or a shared child) or not at all */
static int fp_tree_depth(const fp_trees_desc *d, int t, int *stack, int *lvl, unsigned char *seen) {
    const int lo = d->tree_off[t], n = d->tree_off[t + 1] - lo;
    memset(seen, 0, (size_t)n);
    int sp = 0, depth = 0, visited = 0;
    stack[sp] = 0; lvl[sp++] = 0;
    while (sp) {
        const int i = stack[--sp], l = lvl[sp];
        if (i < 0 || i >= n || seen[i]) return -1;
        seen[i] = 1;
        visited++;
        if (l > depth) depth = l;
        if (l > FP_TREES_MAX_DEPTH) return -1;
        const int g = lo + i;
        if (fp_is_leaf(d, g)) continue;
        stack[sp] = d->true_child[g]; lvl[sp++] = l + 1;
        stack[sp] = d->false_child[g]; lvl[sp++] = l + 1;
        if (sp > 2 * n + 2) return -1;
    }
    return visited == n ? depth : -1;
}

static size_t fp_al(size_t off) { return FP_ROUND_UP(off, FP_ALIGN); }

static int fp_plan_make(const fp_trees_desc *d, fp_plan *pl) {
    memset(pl, 0, sizeof(*pl));
    if (d->n_feat < 1 || d->n_targets < 1 || d->n_targets > FP_TREES_MAX_TARGETS || d->n_trees < 1 ||
        d->n_nodes < d->n_trees || d->n_weights < 0 || d->aggregate < FP_TAGG_SUM ||
        d->aggregate > FP_TAGG_MAX || d->post < FP_TPOST_NONE || d->post > FP_TPOST_PROBIT ||
        !(d->n_base == 0 || d->n_base == d->n_targets ||
          (d->classifier && d->n_targets == 2 && d->n_base == 1)) ||
        (d->classifier && (d->n_targets < 2 || d->aggregate != FP_TAGG_SUM)))
        return -1;
    if (d->tree_off[0] != 0 || d->tree_off[d->n_trees] != d->n_nodes) return -1;
    for (int t = 0; t < d->n_trees; t++)
        if (d->tree_off[t + 1] <= d->tree_off[t]) return -1;
    for (int g = 0; g < d->n_nodes; g++) {
        const int m = d->mode[g];
        if (m < FP_TMODE_LEQ || m > FP_TMODE_LEAF) return -1;
        if (m != FP_TMODE_LEAF && (d->feat[g] < 0 || d->feat[g] >= d->n_feat || isnan(d->thr[g])))
            return -1;
    }
    for (int j = 0; j < d->n_base; j++)
        if (!isfinite(d->base[j])) return -1;
    const int T = d->n_trees, N = d->n_nodes;
    pl->depth = (int *)calloc((size_t)T, sizeof(int));
    pl->width = (int *)calloc((size_t)T, sizeof(int));
    pl->target = (int *)calloc((size_t)T, sizeof(int));
    pl->perfect = (int *)calloc((size_t)T, sizeof(int));
    pl->leaf_off = (int *)malloc(sizeof(int) * (size_t)N);
    pl->wcount = (int *)calloc((size_t)N, sizeof(int));
    int *stack = (int *)malloc(sizeof(int) * (2 * (size_t)N + 4));
    int *lvl = (int *)malloc(sizeof(int) * (2 * (size_t)N + 4));
    unsigned char *seen = (unsigned char *)malloc((size_t)N);
    int *wt = (int *)malloc(sizeof(int) * (size_t)T);   /* first target named in tree t, or -1 */
    int rc = -2;
    if (!pl->depth || !pl->width || !pl->target || !pl->perfect || !pl->leaf_off || !pl->wcount ||
        !stack || !lvl || !seen || !wt)
        goto out;
    rc = -1;
    for (int t = 0; t < T; t++) {
        pl->depth[t] = fp_tree_depth(d, t, stack, lvl, seen);
        if (pl->depth[t] < 0) goto out;
        wt[t] = -1;
        pl->width[t] = 1;
    }
    /* weights: on leaves, targets in range, finite; a tree is width 1 when all its weights
     * name one target */
    for (int k = 0; k < d->n_weights; k++) {
        const int g = d->w_node[k], j = d->w_target[k];
        if (g < 0 || g >= N || !fp_is_leaf(d, g) || j < 0 || j >= d->n_targets ||
            !isfinite(d->w_value[k]))
            goto out;
        pl->wcount[g]++;
    }
    {
        int t = 0;
        for (int k = 0; k < d->n_weights; k++) {
            const int g = d->w_node[k];
            /* trees by node range: weights come in any order, so search */
            int lo = 0, hi = T - 1;
            while (lo < hi) {
                const int mid = (lo + hi + 1) / 2;
                if (d->tree_off[mid] <= g) lo = mid; else hi = mid - 1;
            }
            t = lo;
            if (wt[t] < 0) wt[t] = d->w_target[k];
            else if (wt[t] != d->w_target[k]) pl->width[t] = d->n_targets;
        }
    }
    const int sumlike = d->aggregate == FP_TAGG_SUM || d->aggregate == FP_TAGG_AVERAGE;
    pl->D = 0;
    size_t nl = 0;
    for (int t = 0; t < T; t++) {
        pl->target[t] = pl->width[t] == 1 && wt[t] >= 0 ? wt[t] : 0;
        int ok = sumlike && pl->width[t] == 1 && pl->depth[t] <= FP_TREES_PERFECT_DEPTH;
        for (int g = d->tree_off[t]; ok && g < d->tree_off[t + 1]; g++)
            if (d->mode[g] == FP_TMODE_EQ || d->mode[g] == FP_TMODE_NEQ ||
                ((d->mode[g] == FP_TMODE_LT || d->mode[g] == FP_TMODE_GTE) && fp_strict_lt(d->thr[g])))
                ok = 0;
        pl->perfect[t] = ok;
        if (ok && pl->depth[t] > pl->D) pl->D = pl->depth[t];
        for (int g = d->tree_off[t]; g < d->tree_off[t + 1]; g++) {
            if (fp_is_leaf(d, g)) {
                /* stop before the count passes the cap (and an int offset) */
                if (sizeof(float) * (nl + (size_t)pl->width[t]) > FP_TREES_MAX_ARENA_BYTES) goto out;
                pl->leaf_off[g] = (int)nl;
                nl += (size_t)pl->width[t];
            } else {
                pl->leaf_off[g] = -1;
            }
        }
    }
    pl->n_leafv = nl;
    /* groups of 16 perfect trees per target */
    int groups = 0, rest = 0;
    for (int j = 0; j < d->n_targets; j++) {
        int c = 0;
        for (int t = 0; t < T; t++) c += pl->perfect[t] && pl->target[t] == j;
        groups += (c + FP_TREES_LANES - 1) / FP_TREES_LANES;
    }
    for (int t = 0; t < T; t++) rest += !pl->perfect[t];
    pl->n_groups = groups;
    pl->n_rest = rest;
    /* the lane walk: one-target trees, x <= t splits only (what `perfect` asks but the
     * depth), a tree's offsets and the features within 16 bits, a float per tree on the
     * stack */
    pl->walk_ok = sumlike && T <= FP_TREES_WALK_MAX_TREES && d->n_feat <= 65536;
    for (int t = 0; pl->walk_ok && t < T; t++) {
        if (pl->width[t] != 1 || d->tree_off[t + 1] - d->tree_off[t] > 65535) pl->walk_ok = 0;
        for (int g = d->tree_off[t]; pl->walk_ok && g < d->tree_off[t + 1]; g++)
            if (d->mode[g] == FP_TMODE_EQ || d->mode[g] == FP_TMODE_NEQ ||
                ((d->mode[g] == FP_TMODE_LT || d->mode[g] == FP_TMODE_GTE) && fp_strict_lt(d->thr[g])))
                pl->walk_ok = 0;
    }
    pl->nb_rest = pl->walk_ok ? (rest + FP_TREES_WALK_LANES - 1) / FP_TREES_WALK_LANES : 0;
    pl->nb_all = pl->walk_ok ? (T + FP_TREES_WALK_LANES - 1) / FP_TREES_WALK_LANES : 0;
    const size_t inner = ((size_t)1 << pl->D) - 1, leaves = (size_t)1 << pl->D;
    size_t off = 0;
    pl->o_nodes = off; off = fp_al(off + sizeof(fp_tnode) * (size_t)N);
    pl->o_leafv = off; off = fp_al(off + sizeof(float) * (nl + 1));
    pl->o_trees = off; off = fp_al(off + sizeof(fp_ttree) * (size_t)T);
    pl->o_rest = off; off = fp_al(off + sizeof(int32_t) * ((size_t)rest + 1));
    pl->o_base = off; off = fp_al(off + sizeof(float) * ((size_t)d->n_base + 1));
    pl->o_has = off; off = fp_al(off + (size_t)d->n_targets);
    pl->o_ptarget = off; off = fp_al(off + sizeof(int32_t) * ((size_t)groups + 1));
    pl->o_ptree = off; off = fp_al(off + sizeof(int32_t) * (size_t)groups * FP_TREES_LANES);
    pl->o_pfeat = off; off = fp_al(off + sizeof(int32_t) * (size_t)groups * inner * FP_TREES_LANES);
    pl->o_pthr = off; off = fp_al(off + sizeof(float) * (size_t)groups * inner * FP_TREES_LANES);
    pl->o_pleaf = off; off = fp_al(off + sizeof(float) * (size_t)groups * leaves * FP_TREES_LANES);
    pl->o_wnodes = off; off = fp_al(off + (pl->walk_ok ? sizeof(fp_wnode) * ((size_t)N + 1) : 0));
    pl->o_wleaf = off; off = fp_al(off + (pl->walk_ok ? sizeof(float) * ((size_t)N + 1) : 0));
    pl->o_wrest = off; off = fp_al(off + sizeof(fp_wbatch) * (size_t)pl->nb_rest);
    pl->o_wall = off; off = fp_al(off + sizeof(fp_wbatch) * (size_t)pl->nb_all);
    pl->bytes = off;
    if (off > FP_TREES_MAX_ARENA_BYTES) goto out;
    rc = 0;
out:
    free(stack); free(lvl); free(seen); free(wt);
    if (rc) fp_plan_free(pl);
    return rc;
}

size_t fp_trees_arena_bytes(const fp_trees_desc *d) {
    fp_plan pl;
    if (fp_plan_make(d, &pl)) return 0;
    fp_plan_free(&pl);
    return pl.bytes;
}

/* One split in the normalized form: true branch when x <= thr (or x == thr with EQ), the
 * children of the original swapped where the comparison was negated; *nan_to_true: whether a
 * NaN goes to the normalized true child. */
static void fp_normalize(const fp_trees_desc *d, int g, float *thr, int *eq, int *swap, int *nan_to_true) {
    const int m = d->mode[g];
    const float t = d->thr[g];
    /* x < t <=> x <= the float below t; nothing is below -inf, and x <= NaN is never true.
     * Not near 0: there the float below t is subnormal or 0, and under MXCSR's DAZ (a
     * thread that flushes denormals) x = 0 <= -2^-149 holds while x = 0 < 0 does not; such
     * a split keeps its strict comparison (*eq = 2: FP_TN_LT, compact walk only) */
    const float below = t == -INFINITY ? NAN : nextafterf(t, -INFINITY);
    const int lt = m == FP_TMODE_LT || m == FP_TMODE_GTE;
    *eq = m == FP_TMODE_EQ || m == FP_TMODE_NEQ ? 1 : (lt && fp_strict_lt(t) ? 2 : 0);
    *swap = m == FP_TMODE_GT || m == FP_TMODE_GTE || m == FP_TMODE_NEQ;
    *thr = lt && *eq == 0 ? below : t;
    /* where the original sends a NaN: NaN != t is true, every other comparison false; the
     * missing-value track sends it to the true branch in any mode */
    const int nan_orig_true = d->nan_true[g] || m == FP_TMODE_NEQ;
    *nan_to_true = *swap ? !nan_orig_true : nan_orig_true;
}

/* fill the perfect tree slot p (level lvl of D) from tree-local node i */
static void fp_fill_perfect(const fp_trees_desc *d, const float *leafv, const fp_plan *pl, int lo,
                            int i, size_t p, int lvl, int32_t *pf, float *pt, float *pleaf) {
    const int g = lo + i;
    if (lvl == pl->D) {
        pleaf[(p - (((size_t)1 << pl->D) - 1)) * FP_TREES_LANES] = leafv[pl->leaf_off[g]];
        return;
    }
    if (fp_is_leaf(d, g)) {
        /* padding: x <= +inf holds for every ordered x, so the walk goes left to a copy */
        pf[p * FP_TREES_LANES] = 0;
        pt[p * FP_TREES_LANES] = INFINITY;
        fp_fill_perfect(d, leafv, pl, lo, i, 2 * p + 1, lvl + 1, pf, pt, pleaf);
        fp_fill_perfect(d, leafv, pl, lo, i, 2 * p + 2, lvl + 1, pf, pt, pleaf);
        return;
    }
    float thr; int eq, swap, nt;
    fp_normalize(d, g, &thr, &eq, &swap, &nt);
    pf[p * FP_TREES_LANES] = d->feat[g];
    pt[p * FP_TREES_LANES] = thr;
    const int a = swap ? d->false_child[g] : d->true_child[g];
    const int b = swap ? d->true_child[g] : d->false_child[g];
    fp_fill_perfect(d, leafv, pl, lo, a, 2 * p + 1, lvl + 1, pf, pt, pleaf);
    fp_fill_perfect(d, leafv, pl, lo, b, 2 * p + 2, lvl + 1, pf, pt, pleaf);
}

/* leaf values: a target without a weight on a leaf is 0 for sums, NaN (no value, what
 * fmin/fmax skip) for MIN / MAX; several weights of one target on a leaf combine as the
 * aggregate combines them */
static void fp_fill_leaves(const fp_trees_desc *d, const fp_plan *pl, float *leafv) {
    const int T = d->n_trees;
    const int minmax = d->aggregate == FP_TAGG_MIN || d->aggregate == FP_TAGG_MAX;
    /* onnxruntime's one-target regressor reads one value per leaf: the first weight listed
     * for it, 0 for a leaf without one (a real 0 under MIN / MAX, not "no value"); further
     * weights on that leaf are not read. Assigned last to first, so the first stays. */
    const int one = !d->classifier && d->n_targets == 1;
    for (int tr = 0; tr < T; tr++)
        for (int g = d->tree_off[tr]; g < d->tree_off[tr + 1]; g++)
            if (pl->leaf_off[g] >= 0)
                for (int j = 0; j < pl->width[tr]; j++)
                    leafv[pl->leaf_off[g] + j] = minmax && !one ? NAN : 0.0f;
    for (int k = one ? d->n_weights - 1 : 0; one && k >= 0; k--)
        leafv[pl->leaf_off[d->w_node[k]]] = d->w_value[k];
    for (int k = 0; !one && k < d->n_weights; k++) {
        const int g = d->w_node[k];
        int lo = 0, hi = T - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (d->tree_off[mid] <= g) lo = mid; else hi = mid - 1;
        }
        float *v = &leafv[pl->leaf_off[g] + (pl->width[lo] == 1 ? 0 : d->w_target[k])];
        const float w = d->w_value[k];
        if (d->aggregate == FP_TAGG_MIN) *v = fminf(*v, w);
        else if (d->aggregate == FP_TAGG_MAX) *v = fmaxf(*v, w);
        else *v += w;
    }
}

/* compact trees in preorder, true child next; -2 when out of memory */
static int fp_fill_compact(const fp_trees_desc *d, const fp_plan *pl, fp_tnode *nodes,
                           fp_ttree *trees) {
    const int T = d->n_trees, N = d->n_nodes;
    int *newidx = (int *)malloc(sizeof(int) * (size_t)N);
    int *stack = (int *)malloc(sizeof(int) * ((size_t)N + 4));
    if (!newidx || !stack) {
        free(newidx); free(stack);
        return -2;
    }
    int pos = 0;
    for (int tr = 0; tr < T; tr++) {
        const int lo = d->tree_off[tr];
        const int root = pos;
        int sp = 0;
        stack[sp++] = 0;
        while (sp) {
            const int i = stack[--sp], g = lo + i;
            newidx[g] = pos - root;
            fp_tnode *n = &nodes[pos++];
            if (fp_is_leaf(d, g)) {
                n->flags = FP_TN_LEAF;
                n->other = pl->leaf_off[g];
                continue;
            }
            float thr; int eq, swap, nt;
            fp_normalize(d, g, &thr, &eq, &swap, &nt);
            n->thr = thr;
            n->feat = d->feat[g];
            n->flags = (eq == 1 ? FP_TN_EQ : eq == 2 ? FP_TN_LT : 0) | (nt ? FP_TN_NAN_TRUE : 0);
            const int a2 = swap ? d->false_child[g] : d->true_child[g];
            const int b2 = swap ? d->true_child[g] : d->false_child[g];
            n->other = b2;            /* tree-local original index; remapped below */
            stack[sp++] = b2;
            stack[sp++] = a2;
        }
        for (int p = root; p < pos; p++)
            if (!(nodes[p].flags & FP_TN_LEAF)) nodes[p].other = newidx[lo + nodes[p].other];
        trees[tr].root = root;
        trees[tr].width = pl->width[tr];
        trees[tr].target = pl->target[tr];
    }
    free(newidx);
    free(stack);
    return 0;
}

/* perfect groups, target by target, trees in order; empty lanes keep zero leaves */
static void fp_fill_groups(const fp_trees_desc *d, const fp_plan *pl, const float *leafv,
                           int32_t *ptarget, int32_t *ptree, int32_t *pfeat, float *pthr,
                           float *pleaf) {
    const int T = d->n_trees;
    const size_t inner = ((size_t)1 << pl->D) - 1, leaves = (size_t)1 << pl->D;
    for (size_t q = 0; q < (size_t)pl->n_groups * FP_TREES_LANES; q++) ptree[q] = -1;
    int gi = 0;
    for (int j = 0; j < d->n_targets; j++) {
        int lane = 0;
        for (int tr = 0; tr < T; tr++) {
            if (!pl->perfect[tr] || pl->target[tr] != j) continue;
            if (lane == 0) {
                ptarget[gi] = j;
                /* padding lanes: always left, value 0 */
                for (size_t q = 0; q < inner * FP_TREES_LANES; q++) pthr[gi * inner * FP_TREES_LANES + q] = INFINITY;
            }
            ptree[(size_t)gi * FP_TREES_LANES + lane] = tr;
            fp_fill_perfect(d, leafv, pl, d->tree_off[tr], 0, 0, 0,
                            pfeat + gi * inner * FP_TREES_LANES + lane,
                            pthr + gi * inner * FP_TREES_LANES + lane,
                            pleaf + gi * leaves * FP_TREES_LANES + lane);
            if (++lane == FP_TREES_LANES) { lane = 0; gi++; }
        }
        if (lane) gi++;
    }
}

/* "has a score" per target, as onnxruntime tracks it: a target gets one when a leaf on
 * the path carries a weight for it, and an output without one is written as 0 (base
 * value or not). Decided once here: a target is scored on every path when some tree has
 * a weight for it on every leaf; where a target is scored on some paths only and that
 * changes an output (sums with base values, the two-class rules), the model is refused
 * (-1; -2 when out of memory). MIN / MAX track it per input instead (NaN: no value yet).
 * Sets t->has and, for two classes, t->bin_single and t->bin_positive. */
static int fp_fill_scored(fp_trees *t, const fp_trees_desc *d, unsigned char *has) {
    const int T = d->n_trees, N = d->n_nodes;
    const int n = d->n_targets;
    int *cnt = (int *)calloc((size_t)n, sizeof(int));
    int *mark = (int *)malloc(sizeof(int) * (size_t)n);
    int *woff = (int *)calloc((size_t)N + 1, sizeof(int));
    int *wl = (int *)malloc(sizeof(int) * ((size_t)d->n_weights + 1));
    unsigned char *named = (unsigned char *)calloc((size_t)n, 1);
    int bad = 0, positive = 1;
    if (!cnt || !mark || !woff || !wl || !named) {
        free(cnt); free(mark); free(woff); free(wl); free(named);
        return -2;
    }
    for (int k = 0; k < d->n_weights; k++) {
        woff[d->w_node[k] + 1]++;
        named[d->w_target[k]] = 1;
        if (d->w_value[k] < 0) positive = 0;
    }
    for (int g = 0; g < N; g++) woff[g + 1] += woff[g];
    {
        int *fill = (int *)malloc(sizeof(int) * ((size_t)N + 1));
        if (!fill) {
            free(cnt); free(mark); free(woff); free(wl); free(named);
            return -2;
        }
        memcpy(fill, woff, sizeof(int) * ((size_t)N + 1));
        for (int k = 0; k < d->n_weights; k++) wl[fill[d->w_node[k]]++] = k;
        free(fill);
    }
    for (int tr = 0; tr < T; tr++) {
        int leaves = 0;
        for (int j = 0; j < n; j++) { cnt[j] = 0; mark[j] = -1; }
        for (int g = d->tree_off[tr]; g < d->tree_off[tr + 1]; g++) {
            if (!fp_is_leaf(d, g)) continue;
            leaves++;
            for (int q = woff[g]; q < woff[g + 1]; q++) {
                const int j = d->w_target[wl[q]];
                if (mark[j] != g) { mark[j] = g; cnt[j]++; }
            }
        }
        for (int j = 0; j < n; j++)
            if (cnt[j] == leaves) has[j] = 1;
    }
    const int sums = d->aggregate == FP_TAGG_SUM || d->aggregate == FP_TAGG_AVERAGE;
    const int matters = d->classifier ? n == 2 : (n >= 2 && sums && d->n_base == n);
    for (int j = 0; j < n; j++)
        if (matters && named[j] && !has[j]) bad = 1;
    free(cnt); free(mark); free(woff); free(wl);
    if (d->classifier && n == 2) {
        t->bin_single = named[0] + named[1] == 1;
        t->bin_positive = positive;
        /* one score left and a probit of it: onnxruntime writes one column of two */
        if (!has[1] && d->n_base != 2 && d->post == FP_TPOST_PROBIT) bad = 1;
    }
    free(named);
    t->has = has;
    return bad ? -1 : 0;
}

/* the lane walk's nodes, one per compact node in the same order, then a padding leaf; the
 * leaf values beside them */
static void fp_fill_wnodes(const fp_trees_desc *d, const fp_tnode *nodes, const fp_ttree *trees,
                           const float *leafv, fp_wnode *wn, float *wl) {
    for (int tr = 0; tr < d->n_trees; tr++) {
        const int root = trees[tr].root, n = d->tree_off[tr + 1] - d->tree_off[tr];
        for (int i = 0; i < n; i++) {
            const fp_tnode *c = &nodes[root + i];
            fp_wnode *w = &wn[root + i];
            wl[root + i] = 0.0f;
            if (c->flags & FP_TN_LEAF) {
                w->thr = NAN; w->feat = 0; w->off = 0;
                wl[root + i] = leafv[c->other];
            } else {
                w->thr = c->thr;
                w->feat = (uint16_t)c->feat;
                w->off = (uint16_t)(c->other - i);   /* preorder: the false child is after i */
            }
        }
    }
    wn[d->n_nodes].thr = NAN; wn[d->n_nodes].feat = 0; wn[d->n_nodes].off = 0;
    wl[d->n_nodes] = 0.0f;
}

/* batches of 16 trees of similar depth: the n trees list[0..n) (list NULL: 0..n), slot =
 * position in the list; -2 when out of memory */
static int fp_fill_batches(const int *depth, const fp_ttree *trees, const int32_t *list, int n,
                           int pad, fp_wbatch *b) {
    int *ord = (int *)malloc(sizeof(int) * ((size_t)n + 1));
    if (!ord) return -2;
    /* counting sort by depth, stable: slots stay in list order within a depth */
    int maxd = 0;
    for (int r = 0; r < n; r++) {
        const int dd = depth[list ? list[r] : r];
        if (dd > maxd) maxd = dd;
    }
    int k = 0;
    for (int dd = 0; dd <= maxd; dd++)
        for (int r = 0; r < n; r++)
            if (depth[list ? list[r] : r] == dd) ord[k++] = r;
    for (int q = 0; q * FP_TREES_WALK_LANES < n; q++) {
        fp_wbatch *w = &b[q];
        w->iters = 0;
        for (int l = 0; l < FP_TREES_WALK_LANES; l++) {
            const int p = q * FP_TREES_WALK_LANES + l;
            if (p < n) {
                const int tr = list ? list[ord[p]] : ord[p];
                w->node[l] = trees[tr].root;
                w->slot[l] = ord[p];
                if (depth[tr] > w->iters) w->iters = depth[tr];
            } else {
                w->node[l] = pad;
                w->slot[l] = -1;
            }
        }
    }
    free(ord);
    return 0;
}

int fp_trees_init(fp_trees *t, const fp_trees_desc *d, void *mem) {
    memset(t, 0, sizeof(*t));
    fp_plan pl;
    int rc = fp_plan_make(d, &pl);
    if (rc) return rc;
    const int T = d->n_trees;
    unsigned char *a;
    if (mem) {
        if ((uintptr_t)mem % FP_ALIGN) { fp_plan_free(&pl); return -1; }
        a = (unsigned char *)mem;
        memset(a, 0, pl.bytes);
        t->arena_external = 1;
    } else {
        a = (unsigned char *)fp_aligned_alloc(pl.bytes);
        if (!a) { fp_plan_free(&pl); return -2; }
    }
    t->arena = a;
    t->arena_bytes = pl.bytes;
    fp_tnode *nodes = (fp_tnode *)(a + pl.o_nodes);
    float *leafv = (float *)(a + pl.o_leafv);
    fp_ttree *trees = (fp_ttree *)(a + pl.o_trees);
    int32_t *rest = (int32_t *)(a + pl.o_rest);
    float *base = (float *)(a + pl.o_base);
    int32_t *ptarget = (int32_t *)(a + pl.o_ptarget);
    int32_t *ptree = (int32_t *)(a + pl.o_ptree);
    int32_t *pfeat = (int32_t *)(a + pl.o_pfeat);
    float *pthr = (float *)(a + pl.o_pthr);
    float *pleaf = (float *)(a + pl.o_pleaf);

    fp_fill_leaves(d, &pl, leafv);
    if (fp_fill_compact(d, &pl, nodes, trees)) {
        fp_plan_free(&pl);
        fp_trees_free(t);
        return -2;
    }
    fp_fill_groups(d, &pl, leafv, ptarget, ptree, pfeat, pthr, pleaf);
    int r = 0;
    for (int tr = 0; tr < T; tr++)
        if (!pl.perfect[tr]) rest[r++] = tr;
    if (d->n_base) memcpy(base, d->base, sizeof(float) * (size_t)d->n_base);
    if (pl.walk_ok) {
        fp_wnode *wn = (fp_wnode *)(a + pl.o_wnodes);
        fp_wbatch *wr = (fp_wbatch *)(a + pl.o_wrest), *wa = (fp_wbatch *)(a + pl.o_wall);
        float *wl = (float *)(a + pl.o_wleaf);
        fp_fill_wnodes(d, nodes, trees, leafv, wn, wl);
        if (fp_fill_batches(pl.depth, trees, rest, pl.n_rest, d->n_nodes, wr) ||
            fp_fill_batches(pl.depth, trees, NULL, T, d->n_nodes, wa)) {
            fp_plan_free(&pl);
            fp_trees_free(t);
            return -2;
        }
        t->walk_ok = 1;
        t->wnodes = wn; t->wleaf = wl; t->wrest = wr; t->wall = wa;
        t->n_wrest = pl.nb_rest; t->n_wall = pl.nb_all;
    }

    t->n_feat = d->n_feat;
    t->n_targets = d->n_targets;
    t->n_trees = T;
    t->n_nodes = d->n_nodes;
    t->n_out = d->n_targets;
    t->aggregate = d->aggregate;
    t->post = d->post;
    t->classifier = d->classifier;
    t->n_base = d->n_base;
    t->base = base;
    t->depth = pl.D;
    t->n_groups = pl.n_groups;
    t->pgather = 1;   /* until fp_trees_choose times both */
    t->pfeat = pfeat; t->pthr = pthr; t->pleaf = pleaf; t->ptarget = ptarget; t->ptree = ptree;
    t->nodes = nodes; t->leafv = leafv; t->trees = trees;
    t->rest = rest; t->n_rest = pl.n_rest;
    rc = fp_fill_scored(t, d, (unsigned char *)(a + pl.o_has));
    fp_plan_free(&pl);
    if (rc) fp_trees_free(t);
    return rc;
}

void fp_trees_free(fp_trees *t) {
    if (t->arena && !t->arena_external) fp_aligned_free(t->arena);
    t->arena = NULL;
}

int fp_trees_has_nan(const float *x, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) bad |= x[i] != x[i];
    return bad;
}

void fp_trees_acc_init(const fp_trees *t, double *acc) {
    const int minmax = t->aggregate == FP_TAGG_MIN || t->aggregate == FP_TAGG_MAX;
    for (int j = 0; j < t->n_targets; j++) acc[j] = minmax ? NAN : 0.0;
}

/* the leaf values (trees[i].width of them) tree i reaches at x; a NaN goes where its node's
 * missing-value flag says */
static const float *fp_trees_leaf_compact(const fp_trees *t, int i, const float *x) {
    const fp_ttree *tr = &t->trees[i];
    const fp_tnode *base = t->nodes + tr->root, *n = base;
    while (!(n->flags & FP_TN_LEAF)) {
        const float v = x[n->feat];
        int go;
        if (v != v) go = n->flags & FP_TN_NAN_TRUE;
        else if (n->flags & (FP_TN_EQ | FP_TN_LT)) go = (n->flags & FP_TN_EQ) ? v == n->thr : v < n->thr;
        else go = v <= n->thr;
        n = go ? n + 1 : base + n->other;
    }
    return t->leafv + n->other;
}

void fp_trees_walk_compact(const fp_trees *t, int i, const float *x, double *acc) {
    const fp_ttree *tr = &t->trees[i];
    const float *lv = fp_trees_leaf_compact(t, i, x);
    if (tr->width == 1) {
        const int j = tr->target;
        if (t->aggregate == FP_TAGG_MIN) acc[j] = fmin(acc[j], (double)lv[0]);
        else if (t->aggregate == FP_TAGG_MAX) acc[j] = fmax(acc[j], (double)lv[0]);
        else acc[j] += lv[0];
    } else {
        for (int j = 0; j < tr->width; j++) {
            if (t->aggregate == FP_TAGG_MIN) acc[j] = fmin(acc[j], (double)lv[j]);
            else if (t->aggregate == FP_TAGG_MAX) acc[j] = fmax(acc[j], (double)lv[j]);
            else acc[j] += lv[j];
        }
    }
}

/* The perfect groups' trees in the perfect walk's groups, lanes and order (fp_trees_sum16 per
 * group): a double sum of floats is not exact for leaves ~2^53 apart, so any other order
 * would let a NaN in a feature no split reads change the sum. Only perfect trees (width 1,
 * SUM / AVERAGE) are in groups, so MIN / MAX and multi-target trees keep their index order. */
void fp_trees_walk_all_compact(const fp_trees *t, const float *x, double *acc) {
    for (int g = 0; g < t->n_groups; g++) {
        const int32_t *lt = t->ptree + (size_t)g * FP_TREES_LANES;
        double d[FP_TREES_LANES];
        for (int lane = 0; lane < FP_TREES_LANES; lane++)
            d[lane] = lt[lane] < 0 ? 0.0 : (double)fp_trees_leaf_compact(t, lt[lane], x)[0];
        acc[t->ptarget[g]] += fp_trees_sum16(d);
    }
    for (int r = 0; r < t->n_rest; r++) fp_trees_walk_compact(t, t->rest[r], x, acc);
}

/* onnxruntime's ml_common.h, in float */
static float fp_ort_logistic(float v) {
    const float e = 1.0f / (1.0f + expf(-fabsf(v)));
    return v < 0 ? 1.0f - e : e;
}

static float fp_ort_erfinv(float x) {
    const float sgn = x < 0 ? -1.0f : 1.0f;
    x = (1 - x) * (1 + x);
    const float lg = logf(x);
    const float v = 2 / (3.14159265358979323846f * 0.147f) + 0.5f * lg;   /* (float)M_PI, as onnxruntime 1.2x writes it */
    const float v2 = 1 / (0.147f) * lg;
    const float v3 = -v + sqrtf(v * v - v2);
    return sgn * sqrtf(v3);
}

static float fp_ort_probit(float v) { return 1.41421356f * fp_ort_erfinv(2 * v - 1); }

static void fp_ort_write_scores(float *s, int n, int post) {
    if (post == FP_TPOST_PROBIT) {
        for (int i = 0; i < n; i++) s[i] = fp_ort_probit(s[i]);
    } else if (post == FP_TPOST_LOGISTIC) {
        for (int i = 0; i < n; i++) s[i] = fp_ort_logistic(s[i]);
    } else if (post == FP_TPOST_SOFTMAX) {
        float mx = -3.402823466e38f, sum = 0.0f;
        for (int i = 0; i < n; i++) if (s[i] > mx) mx = s[i];
        for (int i = 0; i < n; i++) { s[i] = expf(s[i] - mx); sum += s[i]; }
        for (int i = 0; i < n; i++) s[i] /= sum;
    } else if (post == FP_TPOST_SOFTMAX_ZERO) {
        /* zeros stay zero (exp only of the nonzero scores) */
        float mx = -3.402823466e38f, sum = 0.0f;
        for (int i = 0; i < n; i++) if (s[i] > mx) mx = s[i];
        const float enm = expf(-mx);
        for (int i = 0; i < n; i++) {
            if (s[i] > 0.0000001f || s[i] < -0.0000001f) { s[i] = expf(s[i] - mx); sum += s[i]; }
            else s[i] *= enm;
        }
        for (int i = 0; i < n; i++) s[i] /= sum;
    }
}

void fp_trees_finalize(const fp_trees *t, const double *acc, float *out) {
    const int n = t->n_targets;
    const int minmax = t->aggregate == FP_TAGG_MIN || t->aggregate == FP_TAGG_MAX;
    const float nt = (float)t->n_trees;
    if (!t->classifier) {
        if (n == 1) {
            /* onnxruntime's one-target path writes the score itself, scored or not */
            const float origin = t->n_base == 1 ? t->base[0] : 0.0f;
            float s = minmax ? (acc[0] == acc[0] ? (float)acc[0] : 0.0f) : (float)acc[0];
            if (t->aggregate == FP_TAGG_AVERAGE) s /= nt;
            s += origin;
            out[0] = t->post == FP_TPOST_PROBIT ? fp_ort_probit(s) : s;
            return;
        }
        const int use_base = t->n_base == n;
        for (int j = 0; j < n; j++) {
            float s;
            if (minmax) {
                const int has = acc[j] == acc[j];
                s = (use_base ? t->base[j] : 0.0f) + (has ? (float)acc[j] : 0.0f);
                out[j] = has ? s : 0.0f;
            } else {
                /* a target scored on this path has its sum (plus its base value); one that
                 * is not reads 0, which is its sum: no leaf on the path named it. A target
                 * scored on some paths only with base values was refused when packed, so a
                 * base value is added only to a target scored on every path. */
                s = (float)acc[j];
                if (t->aggregate == FP_TAGG_AVERAGE) s /= nt;
                if (use_base && t->has[j]) s += t->base[j];
                out[j] = s;
            }
        }
        fp_ort_write_scores(out, n, t->post);
        return;
    }
    for (int j = 0; j < n; j++) out[j] = (float)acc[j];
    if (n > 2) {
        for (int k = 0; k < t->n_base; k++) out[k] += t->base[k];
        fp_ort_write_scores(out, n, t->post);
        return;
    }
    /* two classes: onnxruntime's TreeAggregatorClassifier::FinalizeScores, then its
     * write_scores, where a class without a score reads as 0 */
    const int has0 = t->has[0], has1 = t->has[1];
    int size = 2, w = -1;
    if (t->n_base == 2) {
        if (has1) {
            out[1] = t->base[1] + out[0];
            out[0] = -out[1];
        } else {
            out[1] += t->base[1];
            out[0] += t->base[0];
        }
    } else if (t->n_base == 1) {
        out[0] += t->base[0];
        if (!has1) size = 1;
    } else {
        w = 3;
        if (!has1) size = 1;
    }
    if (t->bin_single) {
        const float pos = has1 ? out[1] : (has0 ? out[0] : 0.0f);
        if (t->bin_positive) w = pos > 0.5f ? 0 : 1;
        else w = pos > 0 ? 2 : 3;
    }
    if (size == 2) {
        out[0] = has0 ? out[0] : 0.0f;
        out[1] = has1 ? out[1] : 0.0f;
        fp_ort_write_scores(out, 2, t->post);
        return;
    }
    const float s = has0 ? out[0] : 0.0f;
    if (w == 0 || w == 1) {
        const float p = t->post == FP_TPOST_LOGISTIC ? fp_ort_logistic(s) : s;
        out[0] = 1.0f - p;
        out[1] = p;
    } else if (t->post == FP_TPOST_LOGISTIC) {
        out[0] = fp_ort_logistic(-s);
        out[1] = fp_ort_logistic(s);
    } else {
        out[0] = -s;
        out[1] = s;
    }
}

fp_trees_eval_fn fp_trees_eval_for(fp_isa isa) {
    if (isa == FP_ISA_SCALAR) return fp_trees_eval_scalar;
#if FP_HAVE_X86
    if (isa == FP_ISA_AVX2 && fp_cpu_has_avx2() && fp_cpu_has_fma()) return fp_trees_eval_avx2;
    if (isa == FP_ISA_AVX512 && fp_cpu_has_avx512()) return fp_trees_eval_avx512;
#endif
    return NULL;
}
