/* fp_lowp.h: reduced-precision (bf16, int8) dense layers: packed formats and their kernels.
 *
 * Decision: a layer too big for L2 is bound by the bytes of weights it streams, not by
 * multiply-adds, so the win is fewer bytes per weight. Both formats use blocks of 16 output
 * rows whose 32-bit lanes hold consecutive inputs of one row (2 bf16 or 4 int8), which is
 * the operand layout of vdpbf16ps / vpdpbusd, so one 64-byte line is one ZMM load (two YMM)
 * and a layer is one linear stream (prefetch-friendly).
 *
 * int8: symmetric per-row weight scales, q = rint(w / s_w) in [-127, 127]. The layer input is
 * quantized per call in two int8 steps, x ~ s1 * x1 + s2 * x2 (x1 = rint(x / s1) with
 * s1 = max|x| / 127, x2 = the residual in steps of s2 = s1 / 254): one int8 step alone cost
 * the demo model 0.13 of signal (z-scored features have outliers, so s1 is coarse for the
 * rest), two cost no more than the int8 weights do (~14 bits of x), and the bytes streamed,
 * the reason for int8, do not change. Symmetric s8 rather than an asymmetric u8 because
 * vpmaddubsw (AVX2) sums pairs of u8*s8 in int16 with saturation: with |x|, |q| <= 127 a pair
 * is at most 32258, so the AVX2 path gets the exact integer dot (x's sign moved onto q);
 * VNNI uses u = x + 128 and subtracts 128 * sum(q) per row. Every set computes the same
 * int32 dots and the same fmaf chain after them, bit for bit.
 * bf16: weights rounded to nearest-even bf16, activations stay fp32: widened weights + FMA,
 * or vdpbf16ps over x split into two bf16 (hi + lo, ~16 mantissa bits) so the native path
 * stays within a tight tolerance of the widening one.
 */
#ifndef FP_LOWP_H
#define FP_LOWP_H

#include "fp_simd.h"
#include "fp_math.h"
#include <math.h>

enum { FP_WEIGHTS_FP32 = 0, FP_WEIGHTS_BF16 = 1, FP_WEIGHTS_INT8 = 2 };

#define FP_LOWP_ROWS 16
/* an int8 layer's widest input: its dots (in * 127 * 127 at most) must fit int32 (a Model's
 * layers are at most 65536 wide, so only a direct C caller can reach it) */
#define FP_LOWP_INT8_MAX_IN 130000
/* software prefetch distance in bytes: ~ the lines in flight one core needs to keep its
 * share of L3/DRAM bandwidth busy */
#ifndef FP_LOWP_PF
#define FP_LOWP_PF 2048
#endif

/* One packed reduced-precision layer. Block b (rows 16b..16b+15), group g: 64 bytes at
 * w + (b * ng + g) * 64; lane r holds row 16b+r's inputs k*g .. k*g+k-1 (k = 2 bf16 or
 * 4 int8). Rows past `out` and inputs past `in` are zero. */
typedef struct {
    int wtype;                /* FP_WEIGHTS_BF16 or FP_WEIGHTS_INT8 */
    int in, out, nb, ng, act; /* nb: blocks of 16 rows; ng: input groups (pairs or quads) */
    const void *w;            /* nb * ng * 64 bytes, 64-byte aligned */
    const float *bias;        /* nb * 16 */
    const float *scale;       /* int8: per-row weight scale s_w, nb * 16 */
    const int32_t *rowsum;    /* int8: sum of each row's q (the u8 zero point's correction) */
    int denormal;             /* bf16: a weight is a nonzero bf16 below 2^-126, which vdpbf16ps
                               * reads as 0 (it flushes denormals whatever MXCSR says) */
} fp_lowp_layer;

/* y[o] = act(bias[o] + sum_i w[o][i] x[i]) for o < nb*16; scratch: fp_lowp_scratch_floats(in)
 * floats, 64-byte aligned. Returns 1 when every pre-activation is finite, 0 otherwise (y is
 * written either way; an int8 layer with a NaN/Inf input writes NaN). */
typedef int (*fp_lowp_dense_fn)(const fp_lowp_layer *L, const float *x, float *y, void *scratch);

typedef struct {
    const char *bf16_name, *int8_name;
    fp_lowp_dense_fn bf16, int8;
} fp_lowp_kernels;

/* The reduced-precision kernels for a kernel set (the variant chosen by CPU bits: the
 * bf16-native / VNNI forms where present); NULL when this CPU cannot run that set. */
const fp_lowp_kernels *fp_lowp_for(fp_isa isa);
/* One variant by name, for tests; NULL when unknown or this CPU lacks it.
 * bf16: scalar, avx2, avx512, avx512_bf16; int8: scalar, avx2, avx2_vnni, avx512, avx512_vnni */
fp_lowp_dense_fn fp_lowp_variant(int wtype, const char *name);

size_t fp_lowp_scratch_floats(int in);
/* bytes a packed layer takes (weights, bias, scale, rowsum), a multiple of 64 */
size_t fp_lowp_layer_bytes(int wtype, int in, int out);
/* pack row-major w (out x in) and bias into mem (64-byte aligned, fp_lowp_layer_bytes) */
void fp_lowp_pack(fp_lowp_layer *L, int wtype, int in, int out, int act, const float *w,
                  const float *bias, void *mem);

/* fp32 -> bf16, round to nearest even (NaN kept quiet) */
static inline uint16_t fp_bf16_rne(float f) {
    union { float f; uint32_t u; } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/* below this max |x| the activation steps leave float's normal range (127 / max|x| and
 * 254 * 127 / max|x| overflow, the steps go subnormal): such an input is not quantized, its
 * layer is summed from x as it is (fp_lowp_int8_exact). Quantizing it to zeros answered
 * bias alone: weights ~3e38 under inputs ~1e-38 lost a pre-activation of 3 on every set. */
#define FP_LOWP_TINY 1e-30f
/* what the quantizers return: x holds a NaN/Inf, quantized, or max |x| in (0, FP_LOWP_TINY) */
enum { FP_LOWP_Q_BAD = 0, FP_LOWP_Q_OK = 1, FP_LOWP_Q_TINY = 2 };
static inline int fp_lowp_is_tiny(uint32_t maxbits) {
    union { float f; uint32_t u; } t = {FP_LOWP_TINY};
    return maxbits != 0u && maxbits < t.u;
}
/* an int8 layer against x as it is, not quantized: sum_i q_i x_i in double, times the row's
 * scale, plus the bias. Every set calls this one for an input of max |x| in (0, FP_LOWP_TINY),
 * so they agree bit for bit; the engine's overflow re-run (fp_engine.c) calls it for a layer
 * whose scalings overflowed on their own. */
int fp_lowp_int8_exact(const fp_lowp_layer *L, const float *x, float *y);

/* the per-call activation scales (steps s1, s2 and their inverses) from max|x|'s bits,
 * shared so every set divides alike */
typedef struct { float inv1, inv2, s1, s2; } fp_lowp_xq;
static inline void fp_lowp_xscale(uint32_t maxbits, fp_lowp_xq *q) {
    union { uint32_t u; float f; } m = {maxbits};
    if (m.f < FP_LOWP_TINY) { q->inv1 = q->inv2 = q->s1 = q->s2 = 0.0f; return; }
    q->inv1 = 127.0f / m.f;
    q->s1 = m.f / 127.0f;
    q->inv2 = q->inv1 * 254.0f;
    q->s2 = q->s1 / 254.0f;
}

static inline long fp_lowp_clamp127(long v) { return v > 127 ? 127 : (v < -127 ? -127 : v); }

/* one input: x1 = rint(x * inv1), x2 = rint(fmaf(-x1, s1, x) * inv2), both in [-127, 127] */
static inline void fp_lowp_q2(float x, const fp_lowp_xq *q, long *x1, long *x2) {
    *x1 = fp_lowp_clamp127(lrintf(x * q->inv1));
    *x2 = fp_lowp_clamp127(lrintf(fmaf((float)-*x1, q->s1, x) * q->inv2));
}

/* the int8 pre-activation of one row from its two dots: one fmaf chain in every set */
static inline float fp_lowp_int8_pre(int32_t d1, int32_t d2, const fp_lowp_xq *q, float sw,
                                     float bias) {
    return fmaf((float)d1, q->s1 * sw, fmaf((float)d2, q->s2 * sw, bias));
}

/* NaN over the padded output: a refused layer leaves nothing finite-looking behind */
static inline int fp_lowp_fail(const fp_lowp_layer *L, float *y) {
    for (int o = 0; o < L->nb * FP_LOWP_ROWS; o++) y[o] = NAN;
    return 0;
}

/* tanh / sigmoid rows after the vector part (identity and relu are done in registers):
 * one libm definition for every set keeps int8 results bit-identical across them */
static inline void fp_lowp_act_tail(int act, float *y16) {
    if (act == FP_ACT_TANH || act == FP_ACT_SIGMOID)
        for (int r = 0; r < FP_LOWP_ROWS; r++) y16[r] = fp_actf(y16[r], act);
}

/* scalar twins, exported for the vector files' tails and the variant table */
int fp_lowp_bf16_scalar(const fp_lowp_layer *L, const float *x, float *y, void *scratch);
int fp_lowp_int8_scalar(const fp_lowp_layer *L, const float *x, float *y, void *scratch);
/* x -> buf = [x1 s8 | x1 + 128 u8 | x2 s8 | x2 + 128 u8], npad bytes each, padded with 0
 * (128); *q the scales. Returns FP_LOWP_Q_OK, FP_LOWP_Q_BAD when x holds a NaN/Inf, or
 * FP_LOWP_Q_TINY (buf untouched) for an input too small to quantize. The AVX2 one serves
 * AVX-512 too. */
int fp_lowp_quant_scalar(const float *x, int in, int npad, unsigned char *buf, fp_lowp_xq *q);
#if FP_HAVE_X86
int fp_lowp_quant_avx2(const float *x, int in, int npad, unsigned char *buf, fp_lowp_xq *q);
int fp_lowp_bf16_avx2(const fp_lowp_layer *L, const float *x, float *y, void *scratch);
int fp_lowp_int8_avx2(const fp_lowp_layer *L, const float *x, float *y, void *scratch);
int fp_lowp_int8_avx2_vnni(const fp_lowp_layer *L, const float *x, float *y, void *scratch);
int fp_lowp_bf16_avx512(const fp_lowp_layer *L, const float *x, float *y, void *scratch);
int fp_lowp_bf16_avx512_bf16(const fp_lowp_layer *L, const float *x, float *y, void *scratch);
int fp_lowp_int8_avx512(const fp_lowp_layer *L, const float *x, float *y, void *scratch);
int fp_lowp_int8_avx512_vnni(const fp_lowp_layer *L, const float *x, float *y, void *scratch);
#endif

#endif
