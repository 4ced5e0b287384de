/* dense_avx2.c: the fp32 dense layer on AVX2/FMA (the group kernels, fp_dense_avx2), the
 * fused pass of a small model (fp_mlp_fused_avx2, fp_mlp_fused_avx2_wide) and the output head.
 *
 * Decision: a group kernel keeps one ymm accumulator per block of 8 rows and chain, fed by
 * one broadcast input and aligned loads of the 64-byte-aligned weights arena (fp_mlp.h);
 * which groups a layer runs is dense_schedule.h's, shared with AVX-512. The fused pass keeps
 * each layer's outputs in registers as the next layer's inputs, with the same sums in the
 * same order, so it gives the per-layer pass's bits.
 */
#include "kernels.h"
#include "fp_mlp.h"
#include "dense_schedule.h"
#include <math.h>

#if FP_HAVE_X86
/* e^x for 8 lanes, Cephes expf: x = n ln2 + r, e^r by a degree-5 polynomial,
 * 2^n built in the exponent bits; |rel err| < 2e-7 on [-87, 88].
 * The clamp puts x second: max/min return their second operand when either is NaN, so a
 * NaN lane stays NaN (as libm's) instead of becoming the clamp bound; +-Inf clamp. */
FP_TARGET_AVX2 static inline __m256 fp_exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(88.3f), _mm256_max_ps(_mm256_set1_ps(-87.3f), x));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i n = _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127));
    return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(n, 23)));
}

/* tanh(x) = sign(x) (1 - e^-2|x|) / (1 + e^-2|x|); small |x| by x (1 - x^2/3 + 2x^4/15)
 * where the quotient would cancel; |abs err| < 3e-7. +-Inf gives +-1 (e^-Inf clamps to
 * ~1e-38), NaN gives NaN (through fp_exp256 and the quotient). */
FP_TARGET_AVX2 static inline __m256 fp_tanh256(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 ax = _mm256_andnot_ps(sign, x);
    __m256 e = fp_exp256(_mm256_mul_ps(ax, _mm256_set1_ps(-2.0f)));
    __m256 one = _mm256_set1_ps(1.0f);
    __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    __m256 x2 = _mm256_mul_ps(ax, ax);
    __m256 p = _mm256_fmadd_ps(x2, _mm256_set1_ps(2.0f / 15.0f), _mm256_set1_ps(-1.0f / 3.0f));
    p = _mm256_fmadd_ps(p, x2, one);
    p = _mm256_fmadd_ps(_mm256_set1_ps(-17.0f / 315.0f), _mm256_mul_ps(x2, _mm256_mul_ps(x2, x2)), p);
    __m256 small = _mm256_mul_ps(ax, p);
    t = _mm256_blendv_ps(t, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.0625f), _CMP_LT_OQ));
    return _mm256_or_ps(t, _mm256_and_ps(x, sign));
}

/* sigmoid(x) = 1 / (1 + e^-x); +Inf gives 1, NaN gives NaN, and -Inf gives 0 as libm does
 * (the clamped e^88.3 alone would leave 4.5e-39) */
FP_TARGET_AVX2 static inline __m256 fp_sigmoid256(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 r = _mm256_div_ps(one, _mm256_add_ps(one, fp_exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ), r);
}

FP_TARGET_AVX2 static inline __m256 fp_act256(__m256 v, int act) {
    switch (act) {
    case FP_ACT_RELU: return _mm256_max_ps(v, _mm256_setzero_ps());
    case FP_ACT_TANH: return fp_tanh256(v);
    case FP_ACT_SIGMOID: return fp_sigmoid256(v);
    default: return v;
    }
}

/* G blocks of 8 rows at once, U accumulators each (inputs i = u mod U go to chain u):
 * G*U = 8 independent FMA chains cover FMA latency x two FMA ports, and one broadcast of
 * x[i] serves G weight loads. Narrow layers (G = 2) get more chains per block; a lone block
 * (G = 1: every odd-width layer's last, every model's 2-output head) keeps 4, whose shorter
 * reduction is what so short a call waits on.
 * Returns the OR of v - v over the blocks' pre-activations v: all zero bits iff every v is
 * finite (x - x is +0 for finite x, NaN for NaN and +-Inf); one subtract and one OR per
 * block of 8 rows, tested once per layer by the caller.
 * The epilogue loops are unrolled by pragma: as loops, GCC may leave them rolled, and acc[][]
 * indexed by a variable k must then live on the stack, every FMA of the main loop through memory.
 * R and O are for the fused small-model pass (fp_mlp_fused_avx2): R = 4 or 8 takes the inputs
 * from R registers (xr[c] = inputs 8c..8c+7, so in <= 8R; each input broadcast from its lane,
 * see FP_D256_LANE) instead of x, O = 1 leaves the outputs in registers (h[k] = block k's 8 rows,
 * as y would hold them) instead of storing them. Input i goes to the same chain in the same
 * order either way (i mod U below the last multiple of U, chain 0 past it), so every sum, and
 * so every bit, is the per-layer pass's. */
/* the fused pass's variants (R or O) inline into it, where their h[] and xr[] can stay in
 * registers (out of line, h[] goes through the stack); the per-layer ones are left to GCC */
#define FP_D256_INL_00
#define FP_D256_INL_01 __attribute__((always_inline))
#define FP_D256_INL_40 __attribute__((always_inline))
#define FP_D256_INL_41 __attribute__((always_inline))
#define FP_D256_INL_80 __attribute__((always_inline))
#define FP_D256_INL_81 __attribute__((always_inline))
/* lane j of the register-held input chunk XC into FMA chain CH (compile-time indices, so
 * acc[][] stays in registers). The broadcast is a vpermilps by immediate of XC's half copied
 * to both halves (one vperm2f128 per half, shared by its 4 lanes): a vpermps would need an
 * index register per lane, which the fused pass has none to spare for. */
#define FP_D256_LANE(XC, J, I, CH)                                                          \
    {                                                                                       \
        const __m256 xu = _mm256_permute_ps(_mm256_permute2f128_ps((XC), (XC), (J) < 4 ? 0x00 : 0x11), \
                                            ((J) & 3) * 0x55);                              \
        _Pragma("GCC unroll 8")                                                             \
        for (int k = 0; k < G_; k++)                                                        \
            acc[CH][k] = _mm256_fmadd_ps(xu, _mm256_load_ps(w + k * bs + (I) * 8), acc[CH][k]); \
    }
/* input i + J of the tail chunk xc (i = in & ~7), if there: chain J mod U below imain */
#define FP_D256_TAIL(J)                                                                     \
    if (i + (J) < in) {                                                                     \
        if (i + (J) < imain) FP_D256_LANE(xc, J, i + (J), (J) % U_)                         \
        else FP_D256_LANE(xc, J, i + (J), 0)                                                \
    }
#define FP_DENSE_GROUP(NAME, G, U, PF, R, O)                                                \
    FP_TARGET_AVX2 static inline FP_D256_INL_##R##O __m256 NAME(                               \
        const float *w, int in, const float *x, const __m256 *xr, const float *bias, int act, \
        float *y, __m256 *h) {                                                              \
        enum { G_ = G, U_ = U };                                                            \
        (void)x; (void)xr; (void)y; (void)h;                                                \
        __m256 acc[U][G];                                                                   \
        for (int u = 0; u < U; u++)                                                         \
            for (int k = 0; k < G; k++) acc[u][k] = _mm256_setzero_ps();                    \
        const size_t bs = (size_t)in * 8;                                                   \
        int i = 0;                                                                          \
        if (R) {                                                                            \
            _Pragma("GCC unroll 8")                                                         \
            for (int c = 0; c < R; c++) {                                          \
                if (8 * c + 8 <= in) {                                                      \
                    _Pragma("GCC unroll 8")                                                 \
                    for (int j = 0; j < 8; j++) FP_D256_LANE(xr[c], j, 8 * c + j, j % U_)   \
                }                                                                           \
            }                                                                               \
            i = in & ~7;                                                                    \
            if (i < in) {                                                                   \
                const int imain = in - in % U;                                              \
                const __m256 xc = fp_chunk(xr, i >> 3, R);                                      \
                FP_D256_TAIL(0) FP_D256_TAIL(1) FP_D256_TAIL(2) FP_D256_TAIL(3)             \
                FP_D256_TAIL(4) FP_D256_TAIL(5) FP_D256_TAIL(6)                             \
            }                                                                               \
        } else {                                                                            \
            for (; i + U <= in; i += U) {                                                   \
                if (PF) {                                                                   \
                    /* U inputs = U * 32 bytes of each block: one line per stream per 2 inputs */ \
                    for (int k = 0; k < G; k++)                                             \
                        for (int l = 0; l < U * 32; l += 64)                                \
                            _mm_prefetch((const char *)(w + k * bs + i * 8) + FP_PF_AHEAD + l, _MM_HINT_T0); \
                }                                                                           \
                for (int u = 0; u < U; u++) {                                               \
                    const __m256 xu = _mm256_broadcast_ss(x + i + u);                       \
                    for (int k = 0; k < G; k++)                                             \
                        acc[u][k] = _mm256_fmadd_ps(xu, _mm256_load_ps(w + k * bs + (i + u) * 8), acc[u][k]); \
                }                                                                           \
            }                                                                               \
            for (; i < in; i++) {                                                           \
                const __m256 xi = _mm256_broadcast_ss(x + i);                               \
                for (int k = 0; k < G; k++)                                                 \
                    acc[0][k] = _mm256_fmadd_ps(xi, _mm256_load_ps(w + k * bs + i * 8), acc[0][k]); \
            }                                                                               \
        }                                                                                   \
        __m256 bad = _mm256_setzero_ps();                                                   \
        _Pragma("GCC unroll 8")                                                             \
        for (int k = 0; k < G; k++) {                                                       \
            __m256 v = _mm256_load_ps(bias + k * 8);                                        \
            _Pragma("GCC unroll 8")                                                         \
            for (int u = 0; u < U; u++) v = _mm256_add_ps(v, acc[u][k]);                    \
            bad = _mm256_or_ps(bad, _mm256_sub_ps(v, v));                                   \
            if (O) h[k] = fp_act256(v, act);                                                \
            else _mm256_store_ps(y + k * 8, fp_act256(v, act));                             \
        }                                                                                   \
        return bad;                                                                         \
    }

/* chunk c (0..nc-1) of nc register-held inputs, c known only at run time (a layer's tail);
 * nc is a constant (4 or 8), so with 4 nothing past xr[3] is named */
FP_TARGET_AVX2 static inline __m256 fp_chunk(const __m256 *xr, int c, int nc) {
    return c == 0 ? xr[0] : c == 1 ? xr[1] : c == 2 ? xr[2] : nc <= 4 || c == 3 ? xr[3]
         : c == 4 ? xr[4] : c == 5 ? xr[5] : c == 6 ? xr[6] : xr[7];
}

/* in-cache layers run 8 blocks (64 rows) at once: one broadcast per 8 FMAs and 8 chains
 * of one accumulator each (16 YMM registers leave no room for 2 each). Streamed layers keep
 * 4 blocks, which the prefetch distance is tuned for.
 * The _m (memory in, registers out) and _r (registers in and out) variants are the fused
 * pass's; each has the U of its per-layer twin. */
FP_DENSE_GROUP(fp_dense_g8, 8, 1, 0, 0, 0)
FP_DENSE_GROUP(fp_dense_g4, 4, 2, 0, 0, 0)
FP_DENSE_GROUP(fp_dense_g2, 2, 4, 0, 0, 0)
FP_DENSE_GROUP(fp_dense_g1, 1, 4, 0, 0, 0)
FP_DENSE_GROUP(fp_dense_pf_g4, 4, 2, 1, 0, 0)
FP_DENSE_GROUP(fp_dense_g8_m, 8, 1, 0, 0, 1)
FP_DENSE_GROUP(fp_dense_g4_m, 4, 2, 0, 0, 1)
FP_DENSE_GROUP(fp_dense_g2_m, 2, 4, 0, 0, 1)
FP_DENSE_GROUP(fp_dense_g1_m, 1, 4, 0, 0, 1)
FP_DENSE_GROUP(fp_dense_g4_r4, 4, 2, 0, 4, 1)
FP_DENSE_GROUP(fp_dense_g2_r4, 2, 4, 0, 4, 1)
FP_DENSE_GROUP(fp_dense_g1_r4, 1, 4, 0, 4, 1)
FP_DENSE_GROUP(fp_dense_g8_ry4, 8, 1, 0, 4, 0)
FP_DENSE_GROUP(fp_dense_g4_ry4, 4, 2, 0, 4, 0)
FP_DENSE_GROUP(fp_dense_g2_ry4, 2, 4, 0, 4, 0)
FP_DENSE_GROUP(fp_dense_g1_ry4, 1, 4, 0, 4, 0)
FP_DENSE_GROUP(fp_dense_g8_r8, 8, 1, 0, 8, 1)
FP_DENSE_GROUP(fp_dense_g1_r8, 1, 4, 0, 8, 1)
FP_DENSE_GROUP(fp_dense_g8_ry8, 8, 1, 0, 8, 0)
FP_DENSE_GROUP(fp_dense_g1_ry8, 1, 4, 0, 8, 0)

/* fp_dense_avx2 and its walk over several groups (dense_schedule.h); y must be 32-byte
 * aligned (the group kernels' stores are) */
#define FP_DS_TARGET FP_TARGET_AVX2
#define FP_DS_K(g) fp_dense_##g
#define FP_DS_LONE FP_DS_ONE(fp_dense_g1)
#define FP_DS_GROUPS fp_dense_groups
#define FP_DS_DENSE fp_dense_avx2
#include "dense_schedule.h"

/* The whole forward pass of a small fp32 model (fp_mlp.fused: two or more layers of 1, 2, 4
 * or 8 blocks) whose hidden layers are at most 4 blocks (32 outputs) wide, in one call: each
 * hidden layer's outputs stay in four ymm registers and are the next layer's inputs (broadcast
 * lane by lane), where the per-layer pass stores them, calls the next layer through the kernel
 * table and broadcasts them back from memory (a call, a dispatch and a store-to-load round
 * trip on the critical path of every layer). Four input registers, 8 accumulators and the
 * broadcast fit the 16 ymm registers. Same group kernels, same sums in the same order: the
 * per-layer pass's bits. Returns y (the last layer's nb * 8 outputs) or NULL when any
 * pre-activation is NaN/Inf. Registers, not a local buffer: the buffer's store-to-load round
 * trip is what such a model waits on. */
FP_TARGET_AVX2 const float *fp_mlp_fused_avx2(const fp_mlp *m, const float *x, float *y) {
    const int last = m->n_layers - 1;
    const __m256 z = _mm256_setzero_ps();
    __m256 h[4] = {z, z, z, z}, g[4] = {z, z, z, z};
    __m256 bad;
    const fp_dense_layer *L = &m->layers[0];
#define FP_F(fn, X, XR, Y, H) fn(L->w, L->in, X, XR, L->bias, L->act, Y, H)
    switch (L->nb) {
    case 1: bad = FP_F(fp_dense_g1_m, x, NULL, NULL, h); break;
    case 2: bad = FP_F(fp_dense_g2_m, x, NULL, NULL, h); break;
    default: bad = FP_F(fp_dense_g4_m, x, NULL, NULL, h); break;
    }
    for (int l = 1; l < last; l++) {
        L = &m->layers[l];
        __m256 b;
        switch (L->nb) {
        case 1: b = FP_F(fp_dense_g1_r4, NULL, h, NULL, g); break;
        case 2: b = FP_F(fp_dense_g2_r4, NULL, h, NULL, g); break;
        default: b = FP_F(fp_dense_g4_r4, NULL, h, NULL, g); break;
        }
        bad = _mm256_or_ps(bad, b);
        h[0] = g[0]; h[1] = g[1]; h[2] = g[2]; h[3] = g[3];
    }
    L = &m->layers[last];
    __m256 b;
    switch (L->nb) {
    case 1: b = FP_F(fp_dense_g1_ry4, NULL, h, y, NULL); break;
    case 2: b = FP_F(fp_dense_g2_ry4, NULL, h, y, NULL); break;
    case 4: b = FP_F(fp_dense_g4_ry4, NULL, h, y, NULL); break;
    default: b = FP_F(fp_dense_g8_ry4, NULL, h, y, NULL); break;
    }
#undef FP_F
    const __m256i bi = _mm256_castps_si256(_mm256_or_ps(bad, b));
    return _mm256_testz_si256(bi, bi) ? y : NULL;
}

/* fp_mlp_fused_avx2 for a model with a hidden layer of 8 blocks (FP_FUSED_WIDE: every layer
 * after the first is 1 or 8 blocks): every hidden layer's outputs stay in eight ymm registers.
 * With the next layer's 8 accumulators that is more than the 16 ymm registers hold, and GCC
 * spills some, but off the critical path, where a buffer's store-to-load round trip is on it.
 * A 2- or 4-block layer after 8 registers is no faster than the per-layer pass (see
 * FP_FUSED_WIDE), and a narrow model keeps fp_mlp_fused_avx2's four registers: eight, unused,
 * cost it. */
FP_TARGET_AVX2 const float *fp_mlp_fused_avx2_wide(const fp_mlp *m, const float *x, float *y) {
    const int last = m->n_layers - 1;
    const __m256 z = _mm256_setzero_ps();
    __m256 h[8] = {z, z, z, z, z, z, z, z}, g[8] = {z, z, z, z, z, z, z, z};
    __m256 bad;
    const fp_dense_layer *L = &m->layers[0];
#define FP_F(fn, X, XR, Y, H) fn(L->w, L->in, X, XR, L->bias, L->act, Y, H)
    switch (L->nb) {
    case 1: bad = FP_F(fp_dense_g1_m, x, NULL, NULL, h); break;
    case 2: bad = FP_F(fp_dense_g2_m, x, NULL, NULL, h); break;
    case 4: bad = FP_F(fp_dense_g4_m, x, NULL, NULL, h); break;
    default: bad = FP_F(fp_dense_g8_m, x, NULL, NULL, h); break;
    }
    for (int l = 1; l < last; l++) {
        L = &m->layers[l];
        __m256 b;
        b = L->nb == 1 ? FP_F(fp_dense_g1_r8, NULL, h, NULL, g)
                       : FP_F(fp_dense_g8_r8, NULL, h, NULL, g);
        bad = _mm256_or_ps(bad, b);
        _Pragma("GCC unroll 8")
        for (int c = 0; c < 8; c++) h[c] = g[c];
    }
    L = &m->layers[last];
    __m256 b;
    b = L->nb == 1 ? FP_F(fp_dense_g1_ry8, NULL, h, y, NULL) : FP_F(fp_dense_g8_ry8, NULL, h, y, NULL);
#undef FP_F
    const __m256i bi = _mm256_castps_si256(_mm256_or_ps(bad, b));
    return _mm256_testz_si256(bi, bi) ? y : NULL;
}

/* signal = tanh(out0), confidence = sigmoid(out1) with the 8-lane polynomials: one pass
 * each instead of two libm calls (tanhf goes through expm1f) on every miss */
FP_TARGET_AVX2 void fp_head_avx2(const float *out, float *signal, float *confidence) {
    *signal = _mm256_cvtss_f32(fp_tanh256(_mm256_set1_ps(out[0])));
    *confidence = _mm256_cvtss_f32(fp_sigmoid256(_mm256_set1_ps(out[1])));
}
#endif
