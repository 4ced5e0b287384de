/* fp_book.h: the live order book of one symbol, the first stage of a tick.
 *
 * One update (the top FP_BOOK_LEVELS levels of each side, price and size in double, its
 * timestamp and the trades since the symbol's previous update) -> the 256-value raw vector
 * of fastpath.lob.raw_from_book, field for field: the same formulas, in double, in the
 * same order of operations (numpy's pairwise sum where it sums ten levels), then rounded to
 * float32. The carried state (the last changed book and its raw vector in double, which
 * holds the 13 series x 8 EWMAs, the log mids of the last 128 changes, the last trade, the
 * last mid move) is per symbol, allocated once
 * (fp_book_create) and written in place: nothing is allocated per update.
 *
 * The per-symbol clock is book changes: an update that leaves the visible book as it was
 * and carries no trade repeats the previous vector and moves no state.
 *
 * Decision: the state is double-buffered. fp_book_compute computes the new state and raw
 * vector into the spare half and changes nothing the current half reads; fp_book_commit
 * flips the halves once the rest of the tick (features, cache, model) has accepted it. So a
 * refused update, or a tick the model refuses after the book stage, leaves the book as it
 * was without an undo copy.
 */
#ifndef FP_BOOK_H
#define FP_BOOK_H

#include <stdint.h>

struct fp_kernels;                    /* fp_simd.h */

#define FP_BOOK_LEVELS 10
#define FP_BOOK_RAW 256
#define FP_BOOK_NEW 13                 /* EWMA series */
#define FP_BOOK_HL 8                   /* half-lives 1, 2, 4, ..., 128 updates */
#define FP_BOOK_RING 256               /* log mids kept (a power of 2 above the longest lag) */

/* why an update was refused; *where says which field (fp_book_compute) */
enum {
    FP_BOOK_OK = 0,
    FP_BOOK_ERR_PRICE = 1,             /* a price not finite or <= 0: side, level */
    FP_BOOK_ERR_SIZE = 2,              /* a size not finite or < 0: side, level */
    FP_BOOK_ERR_ORDER = 3,             /* a level above (bid) / below (ask) the one before */
    FP_BOOK_ERR_CROSSED = 4,           /* best bid >= best ask */
    FP_BOOK_ERR_TRADE = 5,             /* where: 0 trade_vol, 1 trade_cnt, 2 last_trade_sz */
    FP_BOOK_ERR_RANGE = 6,             /* where: the raw field past float32's range */
    FP_BOOK_ERR_NOTICK = 7,            /* no tick size set for the symbol */
};

/* sides for *where on PRICE, SIZE and ORDER: where = side * 256 + level (0-based) */
enum { FP_BOOK_BID_PX = 0, FP_BOOK_BID_SZ = 1, FP_BOOK_ASK_PX = 2, FP_BOOK_ASK_SZ = 3 };

/* One update as a feed handler has it: arrays of FP_BOOK_LEVELS doubles, level 1 first. */
typedef struct {
    const double *bid_px, *bid_sz, *ask_px, *ask_sz;
    int64_t ts_ns;
    double trade_vol;                  /* signed volume traded since the previous update */
    double trade_cnt;                  /* trades since the previous update */
    double last_trade_sz;              /* size of the last of them (0 when none) */
} fp_book_update;

typedef struct {
    double bpx[FP_BOOK_LEVELS], apx[FP_BOOK_LEVELS];
    double bsz[FP_BOOK_LEVELS], asz[FP_BOOK_LEVELS];   /* the last changed book */
    double o[FP_BOOK_RAW];             /* the raw vector in double, before float32: the next
                                        * update copies the fields whose inputs did not change
                                        * (among them the log1p of each size, 20-39, and of each
                                        * cumulative depth, 64-83), and the EWMAs (13 series x 8,
                                        * fields 140-203, 212-251) carry on from it */
    double tick;                       /* the tick size o was computed with */
    int64_t n;                         /* book changes so far (0: no book yet) */
    int64_t last_move;                 /* the change at which the mid last moved */
    double ts;                         /* the last change's timestamp, ns as double */
    double mid;
    int have_trade;
    double trade_sign, trade_logsz, trade_ts;
} fp_book_state;

typedef struct fp_book {
    fp_book_state st[2];
    double ring[FP_BOOK_RING];         /* log mid of change k at k % FP_BOOK_RING */
    float *raw[2];                     /* the raw vector of each half (FP_BOOK_RAW + slack) */
    double tick;                       /* tick size, > 0 */
    int cur;                           /* the half that holds the committed state */
    int pending;                       /* the last fp_book_compute wrote the spare half */
    const struct fp_kernels *k;        /* the kernel set of its elementwise passes */
    void (*log1p)(const double *x, double *y, int n);  /* y = log1p(x): libm's, bit for bit */
} fp_book;

/* a book for one symbol with this tick size (finite, > 0), empty; NULL when out of memory */
fp_book *fp_book_create(double tick);
void fp_book_free(fp_book *b);
/* the kernel set the book runs (scalar from fp_book_create); its batch log1p where this
 * host's C library gives the same bits (fp_log1p_libm_fused) and libm_log1p is 0, else
 * libm's log1p value by value */
void fp_book_set_kernels(fp_book *b, const struct fp_kernels *k, int libm_log1p);
/* forget every update (a halt, a feed gap); the tick size stays */
void fp_book_clear(fp_book *b);

/* Check u and compute its raw vector into *raw (the spare half's, or the current half's for
 * an update that changes nothing). FP_BOOK_OK, else an FP_BOOK_ERR_* with *where, and the
 * book unchanged. Nothing the committed state reads is written until fp_book_commit. */
int fp_book_compute(fp_book *b, const fp_book_update *u, const float **raw, int *where);
/* make the last fp_book_compute's state the current one (no-op for a repeated book) */
static inline void fp_book_commit(fp_book *b) {
    if (b->pending) {
        b->cur ^= 1;
        b->pending = 0;
    }
}

#endif
