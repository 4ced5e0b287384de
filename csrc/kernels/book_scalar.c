/* book_scalar.c: the live book's elementwise passes (csrc/fp_book.c), the scalar twins of
 * book_avx2.c and book_avx512.c: the checks of an update's levels, which levels differ from
 * the book before, the EWMA step of its rows of half-lives and the raw vector rounded to
 * float32 with its range check.
 *
 * Decision: elementwise only, one rounding per operation (fp-contract=off: the book is
 * tested bit for bit against numpy, which rounds each product and each sum), so every set
 * gives these doubles and floats exactly.
 */
#pragma GCC optimize("fp-contract=off")
#include "kernels.h"
#include <float.h>
#include <math.h>
#include <stdint.h>

/* 1 when every level passes: prices finite and > 0, bid_px[i] <= bid_px[i - 1], ask_px[i] >=
 * ask_px[i - 1], sizes finite and >= 0 (n = FP_BOOK_LEVELS = 10 values each); else 0 */
int fp_book_ok_scalar(const double *bp, const double *bs, const double *ap, const double *as) {
    int ok = 1;
    for (int i = 0; i < 10; i++) {
        ok &= (bp[i] > 0) & (bp[i] < INFINITY) & (ap[i] > 0) & (ap[i] < INFINITY)
              & (bs[i] >= 0) & (bs[i] < INFINITY) & (as[i] >= 0) & (as[i] < INFINITY);
        if (i) ok &= (bp[i] <= bp[i - 1]) & (ap[i] >= ap[i - 1]);
    }
    return ok;
}

/* bit 10 a + i set where x_a[i] != old[10 a + i], a = 0..3 over (x0, x1, x2, x3), i < 10 */
uint64_t fp_book_diff_scalar(const double *x0, const double *x1, const double *x2,
                             const double *x3, const double *old) {
    const double *x[4] = {x0, x1, x2, x3};
    uint64_t m = 0;
    for (int a = 0; a < 4; a++)
        for (int i = 0; i < 10; i++) m |= (uint64_t)(x[a][i] != old[10 * a + i]) << (10 * a + i);
    return m;
}

/* the fields of a book's prices alone, in ticks (fp_book.c's raw vector layout): o[i] =
 * (bpx[i] - mid) / tick, o[10 + i] = (apx[i] - mid) / tick, o[60] = (apx[0] - bpx[0]) / tick,
 * o[84 + i] = (bpx[i] - bpx[i + 1]) / tick, o[93 + i] = (apx[i + 1] - apx[i]) / tick */
void fp_book_prices_scalar(const double *bpx, const double *apx, double mid, double tick,
                           double *o) {
    for (int i = 0; i < 10; i++) {
        o[i] = (bpx[i] - mid) / tick;
        o[10 + i] = (apx[i] - mid) / tick;
    }
    o[60] = (apx[0] - bpx[0]) / tick;
    for (int i = 0; i < 9; i++) {
        o[84 + i] = (bpx[i] - bpx[i + 1]) / tick;
        o[93 + i] = (apx[i + 1] - apx[i]) / tick;
    }
}

/* out[i] = (b[i] - a[i]) / (b[i] + a[i]) where b[i] + a[i] > 0, else 0, i < 10 */
void fp_book_imbalance_scalar(const double *b, const double *a, double *out) {
    for (int i = 0; i < 10; i++) {
        const double tot = b[i] + a[i];
        out[i] = tot > 0 ? (b[i] - a[i]) / tot : 0.0;
    }
}

/* out[8 s + j] = prev[8 s + j] + alpha[j] * (x[s] - prev[8 s + j]), s < rows, j < 8 */
void fp_ewma8_scalar(const double *prev, const double *x, const double *alpha, double *out,
                     int rows) {
    for (int s = 0; s < rows; s++)
        for (int j = 0; j < 8; j++) out[8 * s + j] = prev[8 * s + j] + alpha[j] * (x[s] - prev[8 * s + j]);
}

/* r[i] = (float)o[i], i < n; the first i whose float is not finite (past float32's range,
 * or not finite already), else -1 */
int fp_narrow_f32_scalar(const double *o, float *r, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        r[i] = (float)o[i];
        bad |= !(fabsf(r[i]) <= FLT_MAX);
    }
    if (__builtin_expect(bad, 0))
        for (int i = 0; i < n; i++)
            if (!(fabsf(r[i]) <= FLT_MAX)) return i;
    return -1;
}
