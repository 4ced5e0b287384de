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

/* the two int8 steps of x (fp_lowp_q2), with their u8 twins */
int fp_lowp_quant_scalar(const float *x, int in, int npad, unsigned char *buf, fp_lowp_xq *q) {
    const uint32_t mb = fp_maxabs_bits(x, in);
    if (mb >= 0x7f800000u) return FP_LOWP_Q_BAD;
    if (fp_lowp_is_tiny(mb)) return FP_LOWP_Q_TINY;
    fp_lowp_xscale(mb, q);
    int8_t *x1 = (int8_t *)buf, *x2 = (int8_t *)buf + 2 * npad;
    uint8_t *u1 = buf + npad, *u2 = buf + 3 * npad;
    for (int i = 0; i < npad; i++) {
        long a = 0, b = 0;
        if (i < in) fp_lowp_q2(x[i], q, &a, &b);
        x1[i] = (int8_t)a;
        u1[i] = (uint8_t)(a + 128);
        x2[i] = (int8_t)b;
        u2[i] = (uint8_t)(b + 128);
    }
    return FP_LOWP_Q_OK;
}

/* y[o] = act(s_w[o] * (s1 * dot(q[o], x1) + s2 * dot(q[o], x2)) + bias[o]), dots in int32,
 * scaled by fp_lowp_int8_pre */
int fp_lowp_int8_scalar(const fp_lowp_layer *L, const float *x, float *y, void *scratch) {
    const int ng = L->ng, npad = (int)fp_lowp_scratch_floats(L->in);
    const int8_t *x1 = (const int8_t *)scratch, *x2 = (const int8_t *)scratch + 2 * npad;
    fp_lowp_xq q;
    const int qs = fp_lowp_quant_scalar(x, L->in, npad, (unsigned char *)scratch, &q);
    if (qs != FP_LOWP_Q_OK) return qs == FP_LOWP_Q_TINY ? fp_lowp_int8_exact(L, x, y) : fp_lowp_fail(L, y);
    const int8_t *w = (const int8_t *)L->w;
    int ok = 1;
    for (int b = 0; b < L->nb; b++) {
        int32_t d1[FP_LOWP_ROWS] = {0}, d2[FP_LOWP_ROWS] = {0};
        for (int g = 0; g < ng; g++) {
            const int8_t *wg = w + ((size_t)b * ng + g) * 64;
            const int8_t *a = x1 + 4 * g, *c = x2 + 4 * g;
            for (int r = 0; r < FP_LOWP_ROWS; r++) {
                const int8_t *wr = wg + 4 * r;
                d1[r] += a[0] * wr[0] + a[1] * wr[1] + a[2] * wr[2] + a[3] * wr[3];
                d2[r] += c[0] * wr[0] + c[1] * wr[1] + c[2] * wr[2] + c[3] * wr[3];
            }
        }
        float *yb = y + b * FP_LOWP_ROWS;
        for (int r = 0; r < FP_LOWP_ROWS; r++) {
            const int o = b * FP_LOWP_ROWS + r;
            const float v = fp_lowp_int8_pre(d1[r], d2[r], &q, L->scale[o], L->bias[o]);
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
