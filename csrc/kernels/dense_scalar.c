/* dense_scalar.c: the fp32 dense layer and the output head without vector instructions, the
 * reference the vector sets' dense kernels are tested against.
 *
 * Decision: sums stay float, in input order per row, over the same blocked layout the vector
 * sets read (fp_dense_layer), so a vector twin can only differ by summation order; the head
 * uses libm through fp_math.h, the same functions as the CUDA stage.
 */
#include "kernels.h"
#include "fp_math.h"
#include <math.h>

/* y[o] = act(bias[o] + sum_i w[o][i] x[i]) over the blocked layout; 0 when a pre-activation
 * is NaN/Inf (checked before the activation: relu would turn NaN into 0, tanh Inf into 1) */
int fp_dense_scalar(const fp_dense_layer *L, const float *x, float *y, int reverse) {
    (void)reverse;   /* the row-group order only matters for the vector set's L1 reuse */
    const int in = L->in;
    int ok = 1;
    for (int b = 0; b < L->nb; b++) {
        const float *wb = L->w + (size_t)b * in * 8;
        float acc[8];
        for (int r = 0; r < 8; r++) acc[r] = 0.0f;
        for (int i = 0; i < in; i++) {
            const float xi = x[i];
            for (int r = 0; r < 8; r++) acc[r] += wb[i * 8 + r] * xi;
        }
        for (int r = 0; r < 8; r++) {
            const float v = acc[r] + L->bias[b * 8 + r];
            ok &= isfinite(v) != 0;
            y[b * 8 + r] = fp_actf(v, L->act);
        }
    }
    return ok;
}

/* signal = tanh(out0), confidence = sigmoid(out1), libm (fp_math.h, shared with CUDA) */
void fp_head_scalar(const float *out, float *signal, float *confidence) {
    fp_head(out, signal, confidence);
}
