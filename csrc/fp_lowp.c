/* fp_lowp.c: packing fp32 weights into the bf16 / int8 block formats (fp_lowp.h), and the
 * choice of reduced-precision kernel variant per kernel set (by CPU bits, once, no state). */
#include "fp_lowp.h"
#include <string.h>

size_t fp_lowp_scratch_floats(int in) {
    /* int8: four byte copies of x (two steps, s8 and u8 each), round_up(in, 64) bytes each;
     * bf16: hi and lo bf16 copies, 2 * round_up(in, 32) bytes each: round_up(in, 64) floats */
    return FP_ROUND_UP((size_t)in, 64);
}

static size_t fp_lowp_groups(int wtype, int in) {
    return wtype == FP_WEIGHTS_BF16 ? (size_t)(in + 1) / 2 : (size_t)(in + 3) / 4;
}

size_t fp_lowp_layer_bytes(int wtype, int in, int out) {
    const size_t nb = (size_t)(out + FP_LOWP_ROWS - 1) / FP_LOWP_ROWS;
    /* weights, then bias, scale, rowsum: 16 x 4 bytes per block each */
    return nb * fp_lowp_groups(wtype, in) * 64 + 3 * nb * 64;
}

void fp_lowp_pack(fp_lowp_layer *L, int wtype, int in, int out, int act, const float *w,
                  const float *bias, void *mem) {
    const int nb = (out + FP_LOWP_ROWS - 1) / FP_LOWP_ROWS;
    const int ng = (int)fp_lowp_groups(wtype, in);
    unsigned char *p = (unsigned char *)mem;
    const size_t wbytes = (size_t)nb * ng * 64;
    float *b = (float *)(p + wbytes);
    float *scale = b + (size_t)nb * FP_LOWP_ROWS;
    int32_t *rowsum = (int32_t *)(scale + (size_t)nb * FP_LOWP_ROWS);
    int denormal = 0;
    memset(mem, 0, fp_lowp_layer_bytes(wtype, in, out));
    for (int o = 0; o < out; o++) {
        const int blk = o / FP_LOWP_ROWS, r = o % FP_LOWP_ROWS;
        const float *src = w + (size_t)o * in;
        b[o] = bias[o];
        if (wtype == FP_WEIGHTS_BF16) {
            uint16_t *d = (uint16_t *)p;
            for (int i = 0; i < in; i++) {
                uint16_t h = fp_bf16_rne(src[i]);
                /* nearest-even takes a finite weight above bf16's largest finite (~3.3961e38)
                 * to Inf, and an Inf weight makes every tick non-finite (Inf * 0 is NaN): such
                 * a weight keeps the largest finite bf16 instead, within one bf16 step of it */
                if ((h & 0x7fffu) == 0x7f80u && isfinite(src[i])) h = (uint16_t)(h - 1u);
                if ((h & 0x7f80u) == 0u && (h & 0x7fu) != 0u) denormal = 1;
                d[(((size_t)blk * ng + i / 2) * FP_LOWP_ROWS + r) * 2 + i % 2] = h;
            }
            scale[o] = 1.0f;
        } else {
            int8_t *d = (int8_t *)p;
            float m = 0.0f;
            for (int i = 0; i < in; i++) m = fabsf(src[i]) > m ? fabsf(src[i]) : m;
            const float s = m / 127.0f;
            int32_t sum = 0;
            for (int i = 0; i < in && s > 0.0f; i++) {
                long q = lrintf(src[i] / s);
                q = q > 127 ? 127 : (q < -127 ? -127 : q);
                d[(((size_t)blk * ng + i / 4) * FP_LOWP_ROWS + r) * 4 + i % 4] = (int8_t)q;
                sum += (int32_t)q;
            }
            scale[o] = s;
            rowsum[o] = sum;
        }
    }
    L->wtype = wtype;
    L->in = in; L->out = out; L->nb = nb; L->ng = ng; L->act = act;
    L->w = p;
    L->bias = b;
    L->scale = scale;
    L->rowsum = rowsum;
    L->denormal = denormal;
}

int fp_lowp_int8_exact(const fp_lowp_layer *L, const float *x, float *y) {
    const int8_t *w = (const int8_t *)L->w;
    int ok = 1;
    for (int b = 0; b < L->nb; b++)
        for (int r = 0; r < FP_LOWP_ROWS; r++) {
            const int o = b * FP_LOWP_ROWS + r;
            double acc = 0.0;
            for (int i = 0; i < L->in; i++)
                acc += (double)w[(((size_t)b * L->ng + i / 4) * FP_LOWP_ROWS + r) * 4 + i % 4] * x[i];
            const float v = (float)(acc * L->scale[o] + L->bias[o]);
            ok &= isfinite(v) != 0;
            y[o] = fp_actf(v, L->act);
        }
    return ok;
}

static const fp_lowp_kernels fp_lowp_scalar_set = {"scalar", "scalar", fp_lowp_bf16_scalar,
                                                   fp_lowp_int8_scalar};
#if FP_HAVE_X86
static const fp_lowp_kernels fp_lowp_avx2_sets[2] = {
    {"avx2", "avx2", fp_lowp_bf16_avx2, fp_lowp_int8_avx2},
    {"avx2", "avx2_vnni", fp_lowp_bf16_avx2, fp_lowp_int8_avx2_vnni},
};
/* [has bf16][has vnni] */
static const fp_lowp_kernels fp_lowp_avx512_sets[2][2] = {
    {{"avx512", "avx512", fp_lowp_bf16_avx512, fp_lowp_int8_avx512},
     {"avx512", "avx512_vnni", fp_lowp_bf16_avx512, fp_lowp_int8_avx512_vnni}},
    {{"avx512_bf16", "avx512", fp_lowp_bf16_avx512_bf16, fp_lowp_int8_avx512},
     {"avx512_bf16", "avx512_vnni", fp_lowp_bf16_avx512_bf16, fp_lowp_int8_avx512_vnni}},
};
#endif

const fp_lowp_kernels *fp_lowp_for(fp_isa isa) {
    if (isa == FP_ISA_SCALAR) return &fp_lowp_scalar_set;
#if FP_HAVE_X86
    if (isa == FP_ISA_AVX2 && fp_cpu_has_avx2() && fp_cpu_has_fma())
        return &fp_lowp_avx2_sets[fp_cpu_has_avx_vnni() ? 1 : 0];
    if (isa == FP_ISA_AVX512 && fp_cpu_has_avx512())
        return &fp_lowp_avx512_sets[fp_cpu_has_avx512_bf16() ? 1 : 0][fp_cpu_has_avx512_vnni() ? 1 : 0];
#endif
    return NULL;
}

fp_lowp_dense_fn fp_lowp_variant(int wtype, const char *name) {
    const int b = wtype == FP_WEIGHTS_BF16;
    if (wtype != FP_WEIGHTS_BF16 && wtype != FP_WEIGHTS_INT8) return NULL;
    if (!strcmp(name, "scalar")) return b ? fp_lowp_bf16_scalar : fp_lowp_int8_scalar;
#if FP_HAVE_X86
    const int avx2 = fp_cpu_has_avx2() && fp_cpu_has_fma(), avx512 = fp_cpu_has_avx512();
    if (!strcmp(name, "avx2") && avx2) return b ? fp_lowp_bf16_avx2 : fp_lowp_int8_avx2;
    if (!strcmp(name, "avx2_vnni") && !b && avx2 && fp_cpu_has_avx_vnni()) return fp_lowp_int8_avx2_vnni;
    if (!strcmp(name, "avx512") && avx512) return b ? fp_lowp_bf16_avx512 : fp_lowp_int8_avx512;
    if (!strcmp(name, "avx512_bf16") && b && avx512 && fp_cpu_has_avx512_bf16())
        return fp_lowp_bf16_avx512_bf16;
    if (!strcmp(name, "avx512_vnni") && !b && avx512 && fp_cpu_has_avx512_vnni())
        return fp_lowp_int8_avx512_vnni;
#endif
    return NULL;
}
