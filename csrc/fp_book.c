/* fp_book.c: the live order book stage (see fp_book.h). Every formula is
 * fastpath/lob/adapter.py's, in the same order of operations: the numpy adapter is the
 * oracle this file is tested against, field by field. */
/* no fused multiply-add: numpy rounds each product and each sum, and so must this file on a
 * host whose compiler would contract a * b + c */
#pragma GCC optimize("fp-contract=off")
#include "fp_book.h"
#include "fp_simd.h"
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#define L FP_BOOK_LEVELS
/* the price bits of fp_book_moved: bid_px and ask_px */
#define FP_BOOK_PX_MOVED ((UINT64_C(1) << (2 * L)) - 1)
/* the ten bits of one array's levels */
#define FP_BOOK_LEVEL_BITS ((UINT64_C(1) << L) - 1)

/* 1 - 0.5 ** (1 / h), h = 1, 2, 4, ..., 128: Python's float arithmetic, as the adapter's */
static double fp_book_alpha[FP_BOOK_HL];

/* y = log1p(x), value by value from libm: a book's log1p until a kernel set's is given */
static void fp_book_log1p_libm(const double *x, double *y, int n) {
    for (int i = 0; i < n; i++) y[i] = log1p(x[i]);
}

static void fp_book_alphas(void) {
    for (int j = 0; j < FP_BOOK_HL; j++) fp_book_alpha[j] = 1.0 - pow(0.5, 1.0 / (double)(1 << j));
}

fp_book *fp_book_create(double tick) {
    if (!(tick > 0) || !isfinite(tick)) return NULL;
    fp_book *b = (fp_book *)fp_aligned_alloc(sizeof(fp_book));
    if (!b) return NULL;
    memset(b, 0, sizeof(*b));
    const size_t raw_bytes = sizeof(float) * (FP_BOOK_RAW + FP_SLACK);
    b->raw[0] = (float *)fp_aligned_alloc(raw_bytes);
    b->raw[1] = (float *)fp_aligned_alloc(raw_bytes);
    if (!b->raw[0] || !b->raw[1]) {
        fp_book_free(b);
        return NULL;
    }
    memset(b->raw[0], 0, raw_bytes);
    memset(b->raw[1], 0, raw_bytes);
    b->tick = tick;
    b->k = &fp_kernels_scalar;
    b->log1p = fp_book_log1p_libm;
    if (fp_book_alpha[0] == 0.0) fp_book_alphas();
    return b;
}

void fp_book_set_kernels(fp_book *b, const fp_kernels *k, int libm_log1p) {
    static int fused = -1;            /* the probe's answer, the same for every book */
    if (fused < 0) fused = fp_log1p_libm_fused();
    b->k = k;
    /* the scalar twin runs each fusion through libm's fma() (no FMA instruction in the scalar
     * set): libm's log1p itself gives the same bits sooner */
    b->log1p = fused && !libm_log1p && k != &fp_kernels_scalar ? k->log1p : fp_book_log1p_libm;
}

void fp_book_free(fp_book *b) {
    if (!b) return;
    fp_aligned_free(b->raw[0]);
    fp_aligned_free(b->raw[1]);
    fp_aligned_free(b);
}

void fp_book_clear(fp_book *b) {
    memset(b->st, 0, sizeof(b->st));
    memset(b->ring, 0, sizeof(b->ring));
    memset(b->raw[0], 0, sizeof(float) * FP_BOOK_RAW);
    memset(b->raw[1], 0, sizeof(float) * FP_BOOK_RAW);
    b->cur = 0;
    b->pending = 0;
}

/* numpy's pairwise sum of ten values (eight partial sums, combined as a tree, then the rest
 * in order), which is what x.sum(axis=1) gives for rows of ten */
static inline double fp_sum10(const double *a) {
    const double r = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    return (r + a[8]) + a[9];
}

/* the checks of BookStream.validate, level by level; FP_BOOK_OK or the first refusal */
static int fp_book_check_each(const fp_book_update *u, int *where) {
    const double *px[2] = {u->bid_px, u->ask_px}, *sz[2] = {u->bid_sz, u->ask_sz};
    for (int side = 0; side < 2; side++) {
        for (int i = 0; i < L; i++) {
            const double p = px[side][i];
            if (!(p > 0) || !isfinite(p)) {
                *where = (side ? FP_BOOK_ASK_PX : FP_BOOK_BID_PX) * 256 + i;
                return FP_BOOK_ERR_PRICE;
            }
            if (i > 0 && (side ? p < px[side][i - 1] : p > px[side][i - 1])) {
                *where = (side ? FP_BOOK_ASK_PX : FP_BOOK_BID_PX) * 256 + i;
                return FP_BOOK_ERR_ORDER;
            }
            const double s = sz[side][i];
            if (!(s >= 0) || !isfinite(s)) {
                *where = (side ? FP_BOOK_ASK_SZ : FP_BOOK_BID_SZ) * 256 + i;
                return FP_BOOK_ERR_SIZE;
            }
        }
    }
    if (u->bid_px[0] >= u->ask_px[0]) {
        *where = 0;
        return FP_BOOK_ERR_CROSSED;
    }
    if (!isfinite(u->trade_vol)) { *where = 0; return FP_BOOK_ERR_TRADE; }
    if (!(u->trade_cnt >= 0) || !isfinite(u->trade_cnt)) { *where = 1; return FP_BOOK_ERR_TRADE; }
    if (!(u->last_trade_sz >= 0) || !isfinite(u->last_trade_sz)) {
        *where = 2;
        return FP_BOOK_ERR_TRADE;
    }
    return FP_BOOK_OK;
}

/* FP_BOOK_OK, or fp_book_check_each's first refusal: the kernel set's pass over the levels
 * and the three trade fields decide together whether the slow pass that finds it runs */
static inline int fp_book_check(const fp_kernels *k, const fp_book_update *u, int *where) {
    const int ok = k->book_ok(u->bid_px, u->bid_sz, u->ask_px, u->ask_sz)
                   & (u->bid_px[0] < u->ask_px[0]) & (fabs(u->trade_vol) < INFINITY)
                   & (u->trade_cnt >= 0) & (u->trade_cnt < INFINITY)
                   & (u->last_trade_sz >= 0) & (u->last_trade_sz < INFINITY);
    return __builtin_expect(ok, 1) ? FP_BOOK_OK : fp_book_check_each(u, where);
}

/* the inputs of one update's log1p, computed in one batch call (fp_logq_run) and written
 * where each is wanted: up to 38 sizes and depths and 17 flow, trade and timing fields */
#define FP_LOGQ_MAX 64                 /* at most 55 (and the padding to 56) */
typedef struct {
    double x[FP_LOGQ_MAX], y[FP_LOGQ_MAX];
    double *dst[FP_LOGQ_MAX];
    int m;
} fp_logq;

/* log1p(v) into *dst at the next fp_logq_run; v = +-0 needs no call (log1p(+-0) is v) */
static inline void fp_logq_put(fp_logq *q, double v, double *dst) {
    if (v == 0) {
        *dst = v;
    } else {
        q->x[q->m] = v;
        q->dst[q->m++] = dst;
    }
}

/* log1p(x[i]) into y[i] at the next fp_logq_run, for each set bit i of m */
static inline void fp_logq_bits(fp_logq *q, uint64_t m, const double *x, double *y) {
    for (; m; m &= m - 1) {
        const int i = __builtin_ctzll(m);
        fp_logq_put(q, x[i], &y[i]);
    }
}

/* the batch, with whole vectors (pad4: the count rounded up to 4 with zeros, which a kernel
 * set's log1p takes as fast as the tail it would otherwise copy out and back) */
static inline void fp_logq_run(fp_logq *q, void (*log1p)(const double *, double *, int),
                               int pad4) {
    int n = q->m;
    if (pad4)
        for (; n & 3; n++) q->x[n] = 0.0;
    if (n) log1p(q->x, q->y, n);
    for (int j = 0; j < q->m; j++) *q->dst[j] = q->y[j];
    q->m = 0;
}

/* np.sign(x) * l, l = np.log1p(np.abs(x)); 0 for x = 0 (0 * log1p(0) is +0) */
static inline double fp_slog(double x, double l) {
    if (x == 0) return 0.0;
    const double s = x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;
    return s * l;
}

/* the levels from the first set bit of m (a ten-level mask) down: that bit and every higher */
static inline uint64_t fp_from_first(uint64_t m) {
    return m ? FP_BOOK_LEVEL_BITS & ~((m & -m) - 1) : 0;
}

/* what the second half of each field pass needs from the first, across the log1p batch */
typedef struct {
    double ofi[L], lofi[L];            /* order flow per level, log1p of its size */
    double ofi5, lofi5;                /* over the first five levels */
    double lvol, ltsz;                 /* log1p |trade volume|, log1p last trade size */
    double r1;                         /* the return over one change, bps */
} fp_book_carry;

/* the fields of one book alone (no history), first half: prices, imbalances (0-63, 84-101)
 * into ns->o, the log1p of each moved size and cumulative depth queued into q. A field or log
 * whose inputs equal the committed state ps's (moved: fp_book_moved's bits; the same prices
 * and tick, the same sizes) is copied from ps, which is exact: the same inputs, the same
 * formula */
static void fp_book_static(const fp_book *b, const fp_book_update *u, const fp_book_state *ps,
                           fp_book_state *ns, double mid, uint64_t moved, fp_logq *q) {
    const double *bpx = u->bid_px, *apx = u->ask_px, *bsz = u->bid_sz, *asz = u->ask_sz;
    const double tick = b->tick;
    const double *po = ps->o;
    double *o = ns->o;
    if (!(moved & FP_BOOK_PX_MOVED) && tick == ps->tick) {
        memcpy(o, po, sizeof(double) * 2 * L);
        o[60] = po[60];
        memcpy(o + 84, po + 84, sizeof(double) * 2 * (L - 1));
    } else {
        b->k->book_prices(bpx, apx, mid, tick, o);
    }
    ns->tick = tick;
    /* every level's imbalances in one pass: a field whose sizes did not move comes out as the
     * committed one did (the same inputs, the same formula) */
    b->k->book_imbalance(bsz, asz, o + 40);
    /* the cumulative depths (their values queue into q; only their logs are kept) */
    double cb[L], ca[L];
    cb[0] = bsz[0];
    ca[0] = asz[0];
    for (int i = 1; i < L; i++) {
        cb[i] = cb[i - 1] + bsz[i];
        ca[i] = ca[i - 1] + asz[i];
    }
    /* the logs of the committed sizes (20-39) and depths (64-83), then the moved ones queued
     * over them: a depth cannot move unless a size at or above its level did (the same sums
     * of the same sizes), so its log is queued from the first moved level down */
    memcpy(o + 20, po + 20, sizeof(double) * 2 * L);
    memcpy(o + 64, po + 64, sizeof(double) * 2 * L);
    const uint64_t mb = moved >> (2 * L) & FP_BOOK_LEVEL_BITS;
    const uint64_t ma = moved >> (3 * L) & FP_BOOK_LEVEL_BITS;
    fp_logq_bits(q, mb, bsz, o + 20);
    fp_logq_bits(q, ma, asz, o + 30);
    fp_logq_bits(q, fp_from_first(mb) & ~UINT64_C(1), cb, o + 64);
    fp_logq_bits(q, fp_from_first(ma) & ~UINT64_C(1), ca, o + 74);
    b->k->book_imbalance(cb, ca, o + 50);
    const double l1 = bsz[0] + asz[0];
    const double micro = l1 > 0 ? (apx[0] * bsz[0] + bpx[0] * asz[0]) / l1 : mid;
    o[61] = (micro - mid) / tick;
    double lvl_mean = (fp_sum10(bsz) + fp_sum10(asz)) / (2 * L);
    if (!(lvl_mean >= 1e-12)) lvl_mean = 1e-12;
    o[252] = bsz[0] / lvl_mean;
    o[253] = asz[0] / lvl_mean;
}

/* the static fields from the logs, once the batch has run: 62-64, 74, 254-255 (the logs
 * themselves, 20-39 and 65-73, 75-83, are in place: the batch's, or copied from the committed
 * half for the levels that did not move) */
static void fp_book_static_logs(fp_book_state *ns) {
    double *o = ns->o;
    o[64] = o[20];                     /* the depth of level 1 is its size */
    o[74] = o[30];
    o[62] = o[73];
    o[63] = o[83];
    o[254] = (o[20 + L - 1] - o[20]) / 9;
    o[255] = (o[30 + L - 1] - o[30]) / 9;
}

/* the fields carried from change to change and the trade fields, first half: order flow,
 * returns (132-139, 211), the trade and timing state, their log1p queued into q (the log1p of
 * |ofi| per level and over 5 levels, |trade volume|, trade count, ms since the last change,
 * changes since the mid moved, last trade size and its age) */
static void fp_book_carried(fp_book *b, const fp_book_state *ps, fp_book_state *ns,
                            const fp_book_update *u, double mid, uint64_t moved, fp_logq *q,
                            fp_book_carry *c) {
    double *o = ns->o;
    const int first = ps->n == 0;
    const double *pb = first ? u->bid_sz : ps->bsz, *pa = first ? u->ask_sz : ps->asz;
    /* pb, pa: the previous sizes, for the order flow */
    const double *pbp = first ? u->bid_px : ps->bpx, *pap = first ? u->ask_px : ps->apx;
    /* a level whose price and size did not move on either side has no flow (0, and its log
     * 0: a zero needs no log1p); the moved ones are walked from the mask */
    memset(c->ofi, 0, sizeof(c->ofi));
    memset(c->lofi, 0, sizeof(c->lofi));
    const uint64_t lv = (moved | moved >> L | moved >> (2 * L) | moved >> (3 * L))
                        & FP_BOOK_LEVEL_BITS;
    for (uint64_t m = lv; m; m &= m - 1) {
        const int i = __builtin_ctzll(m);
        const double bs = u->bid_sz[i], as = u->ask_sz[i], bp = u->bid_px[i], ap = u->ask_px[i];
        const double e_b = (bp >= pbp[i] ? bs : 0.0) - (bp <= pbp[i] ? pb[i] : 0.0);
        const double e_a = (ap <= pap[i] ? as : 0.0) - (ap >= pap[i] ? pa[i] : 0.0);
        c->ofi[i] = e_b - e_a;
        fp_logq_put(q, fabs(c->ofi[i]), &c->lofi[i]);
    }
    c->ofi5 = (((c->ofi[0] + c->ofi[1]) + c->ofi[2]) + c->ofi[3]) + c->ofi[4];
    fp_logq_put(q, fabs(c->ofi5), &c->lofi5);
    fp_logq_put(q, fabs(u->trade_vol), &c->lvol);
    fp_logq_put(q, u->trade_cnt, &o[206]);
    /* returns over 1..128 changes, bps: against the first change while fewer have passed */
    const int64_t t = ps->n;
    /* the log of an unchanged mid is the previous change's, kept in the ring */
    const double lm = t > 0 && mid == ps->mid ? b->ring[(t - 1) & (FP_BOOK_RING - 1)] : log(mid);
    b->ring[t & (FP_BOOK_RING - 1)] = lm;
    for (int j = 0; j < FP_BOOK_HL; j++) {
        const int64_t h = (int64_t)1 << j;
        const double past = b->ring[(t >= h ? t - h : 0) & (FP_BOOK_RING - 1)];
        o[132 + j] = (lm - past) * 1e4;
    }
    c->r1 = o[132];
    o[211] = c->r1;
    /* trades and timing */
    const double ts = (double)u->ts_ns;
    const double dt_ms = first ? 0.0 : (ts - ps->ts) / 1e6;
    fp_logq_put(q, dt_ms > 0 ? dt_ms : 0.0, &o[209]);
    const int trade = u->trade_cnt > 0;
    ns->have_trade = trade ? 1 : ps->have_trade;
    ns->trade_ts = trade ? ts : ps->trade_ts;
    c->ltsz = 0.0;
    if (trade) fp_logq_put(q, u->last_trade_sz, &c->ltsz);
    const double age = ts - ns->trade_ts;
    /* no trade yet: the adapter's 1e4 ms */
    fp_logq_put(q, ns->have_trade ? (age > 0 ? age : 0.0) / 1e6 : 1e4, &o[208]);
    ns->last_move = (first || mid != ps->mid) ? t : ps->last_move;
    fp_logq_put(q, (double)(t - ns->last_move), &o[210]);
    ns->n = t + 1;
    ns->ts = ts;
    ns->mid = mid;
}

/* the carried fields from the logs, once the batch has run: size changes (102-121), order
 * flow (122-131), the trade fields (204-207) and the EWMAs (140-203, 212-251) */
static void fp_book_carried_logs(const fp_kernels *k, const fp_book_state *ps,
                                 fp_book_state *ns, const fp_book_update *u,
                                 const fp_book_carry *c) {
    double *o = ns->o;
    const int first = ps->n == 0;
    /* log1p(size) - log1p(previous size): this update's and the previous change's (its own
     * on the first change) */
    const double *plb = first ? o + 20 : ps->o + 20, *pla = first ? o + 30 : ps->o + 30;
    for (int i = 0; i < L; i++) {
        o[102 + i] = o[20 + i] - plb[i];
        o[112 + i] = o[30 + i] - pla[i];
    }
    for (int i = 0; i < L; i++) o[122 + i] = fp_slog(c->ofi[i], c->lofi[i]);
    o[207] = fp_slog(u->trade_vol, c->lvol);
    if (u->trade_cnt > 0) {
        const double v = u->trade_vol;
        ns->trade_sign = v > 0 ? 1.0 : v < 0 ? -1.0 : 0.0;
        ns->trade_logsz = c->ltsz;
    } else {
        ns->trade_sign = ps->trade_sign;
        ns->trade_logsz = ps->trade_logsz;
    }
    o[204] = ns->have_trade ? ns->trade_sign : 0.0;
    o[205] = ns->have_trade ? ns->trade_logsz : 0.0;
    /* the EWMAs, each series from this change's fields */
    const double x[FP_BOOK_NEW] = {o[122], fp_slog(c->ofi5, c->lofi5), o[207], o[40],
                                   c->r1 * c->r1, o[60], o[61], o[62] - o[63], o[41], o[42],
                                   o[43], o[44], fabs(o[122])};
    /* series s at half-life j sits at raw field 140 + 8 s + j, past a gap of 8 from s = 8 on;
     * the previous change's averages are the committed half's raw vector */
    const double *pe = ps->o + 140;   /* the previous averages, laid out as o + 140 */
    double first_pe[FP_BOOK_RAW - 140];
    if (first) {
        /* each average starts at its first value: xs + alpha (xs - xs), the same formula */
        for (int s = 0; s < FP_BOOK_NEW; s++)
            for (int j = 0; j < FP_BOOK_HL; j++)
                first_pe[FP_BOOK_HL * s + (s >= 8 ? 8 : 0) + j] = x[s];
        pe = first_pe;
    }
    k->ewma8(pe, x, fp_book_alpha, o + 140, 8);
    k->ewma8(pe + 9 * FP_BOOK_HL, x + 8, fp_book_alpha, o + 140 + 9 * FP_BOOK_HL,
             FP_BOOK_NEW - 8);
    memcpy(ns->bpx, u->bid_px, sizeof(ns->bpx));
    memcpy(ns->apx, u->ask_px, sizeof(ns->apx));
    memcpy(ns->bsz, u->bid_sz, sizeof(ns->bsz));
    memcpy(ns->asz, u->ask_sz, sizeof(ns->asz));
}

/* which of u's levels differ from the committed book ps's: fp_kernels.book_diff's bits
 * (bid_px, ask_px, bid_sz, ask_sz, ten each), every bit with no book yet */
static inline uint64_t fp_book_moved(const fp_kernels *k, const fp_book_state *ps,
                                     const fp_book_update *u) {
    _Static_assert(offsetof(fp_book_state, asz) == offsetof(fp_book_state, bpx)
                       + 3 * sizeof(double) * FP_BOOK_LEVELS,
                   "bpx, apx, bsz, asz are the forty doubles book_diff compares against");
    if (ps->n == 0) return ~(uint64_t)0;
    return k->book_diff(u->bid_px, u->ask_px, u->bid_sz, u->ask_sz, ps->bpx);
}

/* u with its sizes as the adapter reads them, np.maximum(sz, 0): a size of -0.0 (the one
 * negative the check lets through) becomes +0.0, copied into zb / za behind *pz */
static const fp_book_update *fp_book_plus_zero(const fp_book_update *u, fp_book_update *pz,
                                               double *zb, double *za) {
    /* the sign bits OR-ed as integers (a vector OR; signbit() value by value was ~100
     * instructions an update): after the check, a set sign bit on a size is a -0.0 */
    uint64_t bits = 0;
    for (int i = 0; i < L; i++) {
        uint64_t x, y;
        memcpy(&x, &u->bid_sz[i], sizeof(x));
        memcpy(&y, &u->ask_sz[i], sizeof(y));
        bits |= x | y;
    }
    if (__builtin_expect(!(bits >> 63), 1)) return u;
    for (int i = 0; i < L; i++) {
        zb[i] = u->bid_sz[i] + 0.0;
        za[i] = u->ask_sz[i] + 0.0;
    }
    *pz = *u;
    pz->bid_sz = zb;
    pz->ask_sz = za;
    return pz;
}

int fp_book_compute(fp_book *b, const fp_book_update *u, const float **raw, int *where) {
    *where = 0;
    b->pending = 0;
    const int rc = fp_book_check(b->k, u, where);
    if (rc) return rc;
    double zb[L], za[L];
    fp_book_update pz;
    u = fp_book_plus_zero(u, &pz, zb, za);
    const fp_book_state *ps = &b->st[b->cur];
    const uint64_t moved = fp_book_moved(b->k, ps, u);
    /* the committed book as it was and no trade: the previous vector, no state moves */
    if (!moved && u->trade_cnt == 0) {
        *raw = b->raw[b->cur];
        return FP_BOOK_OK;
    }
    fp_book_state *ns = &b->st[b->cur ^ 1];
    const double mid = 0.5 * (u->bid_px[0] + u->ask_px[0]);
    fp_logq q;
    fp_book_carry c;
    q.m = 0;
    fp_book_static(b, u, ps, ns, mid, moved, &q);
    fp_book_carried(b, ps, ns, u, mid, moved, &q, &c);
    fp_logq_run(&q, b->log1p, b->log1p != fp_book_log1p_libm);
    fp_book_static_logs(ns);
    fp_book_carried_logs(b->k, ps, ns, u, &c);
    float *r = b->raw[b->cur ^ 1];
    const int bad = b->k->narrow_f32(ns->o, r, FP_BOOK_RAW);
    if (__builtin_expect(bad >= 0, 0)) {
        *where = bad;
        return FP_BOOK_ERR_RANGE;
    }
    *raw = r;
    b->pending = 1;
    return FP_BOOK_OK;
}
