/* dense_schedule.h: the width-independent part of the fp32 dense layer, shared by
 * dense_avx2.c and dense_avx512.c: which group kernels a layer runs, and in which order.
 *
 * Decision: a layer is cut into groups of 8 blocks of 8 rows (4 blocks, with software
 * prefetch, once its weights outgrow L2's share: FP_STREAM_BYTES), then at most one group each
 * of 4, 2 and 1 blocks; the group kernels themselves (the FMA schedule of each vector width)
 * stay in each set's file. Each row's sum runs in the same order whichever way the groups are
 * walked, so every walk gives the same bits.
 *
 * A dense_<isa>.c includes this twice: once at the top for the constants, and once after its
 * group kernels with FP_DS_* defined, to emit its fp_dense_<isa> and the out-of-line walk:
 *   FP_DS_TARGET   the set's target attribute
 *   FP_DS_K(g)     the set's group kernel g (g8, g4, g2, g1, pf_g4), called as
 *                  fn(w, in, x, NULL, bias, act, y, NULL) and returning the OR of v - v over
 *                  its pre-activations in a __m256 (zero bits iff all finite)
 *   FP_DS_LONE     the call for a layer of one block (FP_DS_ONE(fn) calls fn on the layer)
 *   FP_DS_GROUPS   the name of the walk over several groups
 *   FP_DS_DENSE    the name of the set's dense kernel (fp_kernels.dense)
 */
#ifndef FP_DENSE_SCHEDULE_H
#define FP_DENSE_SCHEDULE_H

/* Weights past this many bytes stream from L3 or memory: their layers run 4-block groups
 * with software prefetch, which in cache would only cost an instruction a line */
#define FP_STREAM_BYTES (512u * 1024u)
/* How far ahead (bytes) a streamed block's weights are prefetched: early enough to beat the
 * hardware prefetcher, which follows a group's streams at once and ramps up per 4 KB page */
#define FP_PF_AHEAD 1024

#endif

#ifdef FP_DS_TARGET

/* The layers of more than one group, first to last or (reverse) last to first: callers
 * alternate the order per forward pass (their own parity, never state in the shared model),
 * so the rows touched last, still in L1, are the first read next time. Group sizes are powers
 * of two, split by shifts, not a division. Out of line, so the one-group layers of
 * FP_DS_DENSE run without this frame's set-up. */
FP_DS_TARGET __attribute__((noinline)) static __m256 FP_DS_GROUPS(
    const fp_dense_layer *L, const float *x, float *y, int reverse, int stream) {
    const size_t bs = (size_t)L->in * 8;
    const int nb = L->nb, in = L->in, act = L->act;
    /* the decomposition, in forward order: n_big groups of `big` blocks, then the tail */
    const int lg = stream ? 2 : 3, big = 1 << lg;
    const int n_big = nb >> lg;
    const int tail0 = n_big * big, rest = nb - tail0;
    const int t4 = rest & 4 ? tail0 : -1;              /* big == 8 only: rest < 4 when big == 4 */
    const int t2 = rest & 2 ? tail0 + (rest & 4) : -1;
    const int t1 = rest & 1 ? nb - 1 : -1;
    __m256 bad = _mm256_setzero_ps();
#define FP_AT(fn, b) \
    fn(L->w + (size_t)(b) * bs, in, x, NULL, L->bias + (b) * 8, act, y + (b) * 8, NULL)
#define FP_BIG(b) (stream ? FP_AT(FP_DS_K(pf_g4), b) : FP_AT(FP_DS_K(g8), b))
    if (reverse) {
        if (t1 >= 0) bad = _mm256_or_ps(bad, FP_AT(FP_DS_K(g1), t1));
        if (t2 >= 0) bad = _mm256_or_ps(bad, FP_AT(FP_DS_K(g2), t2));
        if (t4 >= 0) bad = _mm256_or_ps(bad, FP_AT(FP_DS_K(g4), t4));
        for (int g = n_big - 1; g >= 0; g--) bad = _mm256_or_ps(bad, FP_BIG(g * big));
    } else {
        for (int g = 0; g < n_big; g++) bad = _mm256_or_ps(bad, FP_BIG(g * big));
        if (t4 >= 0) bad = _mm256_or_ps(bad, FP_AT(FP_DS_K(g4), t4));
        if (t2 >= 0) bad = _mm256_or_ps(bad, FP_AT(FP_DS_K(g2), t2));
        if (t1 >= 0) bad = _mm256_or_ps(bad, FP_AT(FP_DS_K(g1), t1));
    }
#undef FP_BIG
#undef FP_AT
    return bad;
}

/* y = act(W x + b) over the blocked layout. Returns 0 when a pre-activation is NaN/Inf (y is
 * written either way). A layer of one group (1, 2, 4 or 8 blocks in cache: the narrow layers,
 * every model's head layer) has no order to walk and runs inline here, without the walk's
 * call and set-up. */
FP_DS_TARGET int FP_DS_DENSE(const fp_dense_layer *L, const float *x, float *y, int reverse) {
    const int nb = L->nb, in = L->in, act = L->act;
    const size_t bytes = (size_t)in * 8 * (size_t)nb * sizeof(float);
    const int stream = bytes > FP_STREAM_BYTES;
    __m256 bad;
#define FP_DS_ONE(fn) fn(L->w, in, x, NULL, L->bias, act, y, NULL)
    if (nb == 1) bad = FP_DS_LONE;
    else if (nb == 2) bad = FP_DS_ONE(FP_DS_K(g2));
    else if (nb == 4 && !stream) bad = FP_DS_ONE(FP_DS_K(g4));
    else if (nb == 8 && !stream) bad = FP_DS_ONE(FP_DS_K(g8));
    else bad = FP_DS_GROUPS(L, x, y, reverse, stream);
#undef FP_DS_ONE
    const __m256i bi = _mm256_castps_si256(bad);
    return _mm256_testz_si256(bi, bi);
}

#undef FP_DS_TARGET
#undef FP_DS_K
#undef FP_DS_LONE
#undef FP_DS_GROUPS
#undef FP_DS_DENSE
#endif
