/* book_scalar.c: the live book's two elementwise passes (csrc/fp_book.c), the scalar twins
 * of book_avx2.c and book_avx512.c: the EWMA step of its rows of half-lives and the raw
 * vector rounded to float32 with its range check.
 *
 * Decision: elementwise only, one rounding per operation (fp-contract=off: the book is
 * tested bit for bit against numpy, which rounds each product and each sum), so every set
 * gives these doubles and floats exactly.
 */
#pragma GCC optimize("fp-contract=off")
#include "kernels.h"
#include <float.h>
#include <math.h>

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
