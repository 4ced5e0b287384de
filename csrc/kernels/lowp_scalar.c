/* lowp_scalar.c: the portable bf16 / int8 dense kernels, the reference the vector variants
 * are tested against (int8 bit for bit: same int32 dot, same fmaf after it; bf16 within a
 * tolerance, as only the fp32 summation order differs). */
#include "fp_lowp.h"
#include <string.h>

/* max |x| as the bits of a non-negative float (integer max: exact, and NaN/Inf show up as
 * bits >= 0x7f800000 instead of being lost by a float max) */
static uint32_t fp_maxabs_bits(const float *x, int n) {
    uint32_t m = 0;
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        u &= 0x7fffffffu;
        m = u > m ? u : m;
    }
    return m;
}

/* xs = clamp(rint(x * 127 / max|x|), -127, 127), xu = xs + 128 */
int fp_lowp_quant_scalar(const float *x, int in, int npad, int8_t *xs, uint8_t *xu, float *sx) {
    const uint32_t mb = fp_maxabs_bits(x, in);
    if (mb >= 0x7f800000u) return 0;
    float inv;
    fp_lowp_xscale(mb, &inv, sx);
    for (int i = 0; i < npad; i++) {
        long q = 0;
        if (i < in && inv > 0.0f) {
            q = lrintf(x[i] * inv);
            q = q > 127 ? 127 : (q < -127 ? -127 : q);
        }
        xs[i] = (int8_t)q;
        xu[i] = (uint8_t)(q + 128);
    }
    return 1;
}

/* y[o] = act(fmaf(dot_o, s_x * s_w[o], bias[o])), dot_o = sum_i xs[i] * q[o][i] in int32 */
int fp_lowp_int8_scalar(const fp_lowp_layer *L, const float *x, float *y, void *scratch) {
    const int ng = L->ng, npad = (int)fp_lowp_scratch_floats(L->in);
    int8_t *xs = (int8_t *)scratch;
    float sx;
    if (!fp_lowp_quant_scalar(x, L->in, npad, xs, (uint8_t *)scratch + npad, &sx))
        return fp_lowp_fail(L, y);
    const int8_t *w = (const int8_t *)L->w;
    int ok = 1;
    for (int b = 0; b < L->nb; b++) {
        int32_t dot[FP_LOWP_ROWS] = {0};
        for (int g = 0; g < ng; g++) {
            const int8_t *wg = w + ((size_t)b * ng + g) * 64;
            const int8_t *xg = xs + 4 * g;
            for (int r = 0; r < FP_LOWP_ROWS; r++)
                dot[r] += xg[0] * wg[4 * r] + xg[1] * wg[4 * r + 1] + xg[2] * wg[4 * r + 2] +
                          xg[3] * wg[4 * r + 3];
        }
        float *yb = y + b * FP_LOWP_ROWS;
        for (int r = 0; r < FP_LOWP_ROWS; r++) {
            const int o = b * FP_LOWP_ROWS + r;
            const float v = fmaf((float)dot[r], sx * L->scale[o], L->bias[o]);
            ok &= isfinite(v) != 0;
            yb[r] = L->act == FP_ACT_RELU ? (v > 0.0f ? v : 0.0f) : v;
        }
        fp_lowp_act_tail(L->act, yb);
    }
    return ok;
}

/* y[o] = act(bias[o] + sum_i float(bf16 w[o][i]) * x[i]), fp32 sums in input order */
int fp_lowp_bf16_scalar(const fp_lowp_layer *L, const float *x, float *y, void *scratch) {
    (void)scratch;
    const int ng = L->ng, in = L->in;
    const uint16_t *w = (const uint16_t *)L->w;
    int ok = 1;
    for (int b = 0; b < L->nb; b++) {
        float acc[FP_LOWP_ROWS] = {0};
        for (int i = 0; i < in; i++) {
            const uint16_t *wg = w + ((size_t)b * ng + i / 2) * 32 + i % 2;
            const float xi = x[i];
            for (int r = 0; r < FP_LOWP_ROWS; r++) {
                union { uint32_t u; float f; } c = {(uint32_t)wg[2 * r] << 16};
                acc[r] += c.f * xi;
            }
        }
        float *yb = y + b * FP_LOWP_ROWS;
        for (int r = 0; r < FP_LOWP_ROWS; r++) {
            const float v = acc[r] + L->bias[b * FP_LOWP_ROWS + r];
            ok &= isfinite(v) != 0;
            yb[r] = L->act == FP_ACT_RELU ? (v > 0.0f ? v : 0.0f) : v;
        }
        fp_lowp_act_tail(L->act, yb);
    }
    return ok;
}
