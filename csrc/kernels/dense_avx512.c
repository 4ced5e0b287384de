/* dense_avx512.c: the fp32 dense layer on AVX-512 (the group kernels, fp_dense_avx512), the
 * fused pass of a small model (fp_mlp_fused_avx512) and the output head.
 *
 * Decision: the dense kernel keeps the blocked layout of fp_dense_layer (blocks of 8 rows):
 * one 64-byte load covers inputs i and i+1 of an 8-row block, so a zmm accumulator holds the
 * even inputs' partial sums in its low half and the odd inputs' in its high half, folded at
 * the end. Which groups a layer runs is dense_schedule.h's, shared with AVX2. The fused pass
 * keeps each layer's outputs in registers as the next layer's inputs, with the same sums in
 * the same order, so it gives the per-layer pass's bits.
 */
#include "kernels.h"
#include "fp_mlp.h"
#include "dense_schedule.h"
#include <math.h>

#if FP_HAVE_X86
/* e^x for 16 lanes, the same Cephes expf as fp_exp256 (dense_avx2.c), operation for operation, so
 * the two sets agree bit for bit: |rel err| < 2e-7 on [-87, 88]; the clamp keeps x second so
 * a NaN lane stays NaN (vmaxps/vminps return the second operand on NaN), +-Inf clamp. */
FP_TARGET_AVX512 static inline __m512 fp_exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(88.3f), _mm512_max_ps(_mm512_set1_ps(-87.3f), x));
    __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    __m512i n = _mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127));
    return _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32(n, 23)));
}

/* tanh as fp_tanh256: sign(x) (1 - e^-2|x|) / (1 + e^-2|x|), small |x| by its series;
 * +-Inf gives +-1, NaN gives NaN */
FP_TARGET_AVX512 static inline __m512 fp_tanh512(__m512 x) {
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    __m512 ax = _mm512_castsi512_ps(_mm512_andnot_si512(sign, _mm512_castps_si512(x)));
    __m512 e = fp_exp512(_mm512_mul_ps(ax, _mm512_set1_ps(-2.0f)));
    __m512 one = _mm512_set1_ps(1.0f);
    __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    __m512 x2 = _mm512_mul_ps(ax, ax);
    __m512 p = _mm512_fmadd_ps(x2, _mm512_set1_ps(2.0f / 15.0f), _mm512_set1_ps(-1.0f / 3.0f));
    p = _mm512_fmadd_ps(p, x2, one);
    p = _mm512_fmadd_ps(_mm512_set1_ps(-17.0f / 315.0f), _mm512_mul_ps(x2, _mm512_mul_ps(x2, x2)), p);
    __m512 small = _mm512_mul_ps(ax, p);
    t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.0625f), _CMP_LT_OQ), t, small);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t),
                                               _mm512_and_si512(_mm512_castps_si512(x), sign)));
}

/* sigmoid as fp_sigmoid256: 1 / (1 + e^-x); +Inf gives 1, -Inf gives 0, NaN gives NaN */
FP_TARGET_AVX512 static inline __m512 fp_sigmoid512(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 r = _mm512_div_ps(one, _mm512_add_ps(one, fp_exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    return _mm512_maskz_mov_ps(~_mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), r);
}

FP_TARGET_AVX512 static inline __m512 fp_act512(__m512 v, int act) {
    switch (act) {
    case FP_ACT_RELU: return _mm512_max_ps(v, _mm512_setzero_ps());
    case FP_ACT_TANH: return fp_tanh512(v);
    case FP_ACT_SIGMOID: return fp_sigmoid512(v);
    default: return v;
    }
}

/* broadcast pair p of a 16-float x chunk: lanes 0-7 = x[2p], lanes 8-15 = x[2p+1], which is
 * what one 64-byte load of an 8-row block holds (inputs 2p and 2p+1, rows 0-7) */
#define FP_PAIR_IDX(p) _mm512_setr_epi32(2 * (p), 2 * (p), 2 * (p), 2 * (p), 2 * (p), 2 * (p), \
                                         2 * (p), 2 * (p), 2 * (p) + 1, 2 * (p) + 1, 2 * (p) + 1, \
                                         2 * (p) + 1, 2 * (p) + 1, 2 * (p) + 1, 2 * (p) + 1, 2 * (p) + 1)

/* G blocks of 8 rows at once, U accumulators per block over pairs of inputs (pair p goes to
 * chain p mod U): G*U independent zmm chains cover FMA latency (a short lone block keeps
 * U = 4, as in dense_avx2.c); one permute of the x chunk serves G weight loads. Per 16 inputs: one x load, 8 permutes, 8*G FMAs with the weights
 * as memory operands. Inputs past the last multiple of 16 run through a masked x chunk
 * (lanes past `in` are 0 and their weight loads are masked off, nothing read past the block).
 * Returns the OR of v - v over the pre-activations (zero bits iff all finite, as dense_avx2.c).
 * The accumulators' zeroing is unrolled by pragma: as a loop, GCC may zero acc[][] in memory
 * (rep stosq on the stack, every call) and keep it there.
 * R and O are for the fused small-model pass (fp_mlp_fused_avx512): R = 1 takes the input
 * chunks from registers (xr[c] = inputs 16c..16c+15, at most 4 chunks, so in <= 64) instead
 * of x, O = 1 leaves the outputs in registers (h[k/2] = rows 8k..8k+15, laid out as y would
 * be) instead of storing them. Either way every sum runs in the same order, so a fused pass
 * gives the per-layer pass's bits. */
#define FP_D512_CHUNK(XC, I)                                                                    \
    _Pragma("GCC unroll 8")                                                                     \
    for (int p = 0; p < 8; p++) {                                                               \
        const __m512 xp = _mm512_permutexvar_ps(FP_PAIR_IDX(p), (XC));                          \
        _Pragma("GCC unroll 8")                                                                 \
        for (int k = 0; k < G_; k++)                                                            \
            acc[p % U_][k] = _mm512_fmadd_ps(                                                   \
                xp, _mm512_loadu_ps(w + k * bs + ((I) + 2 * p) * 8), acc[p % U_][k]);           \
    }
/* the fused pass's variants (O = 1) inline into it, where their h[] and xr[] can stay in
 * registers; the per-layer ones are left to the compiler, which keeps them out of line */
#define FP_D512_INL_0
#define FP_D512_INL_1 __attribute__((always_inline))
/* pair P of the tail chunk xc (rest inputs left): an odd last input's pair has its high half
 * (input `in`) masked off */
#define FP_D512_TAIL(P)                                                                         \
    if (2 * (P) < rest) {                                                                       \
        const __mmask16 wm = 2 * (P) + 1 < rest ? 0xffff : 0x00ff;                              \
        const __m512 xp = _mm512_permutexvar_ps(FP_PAIR_IDX(P), xc);                            \
        _Pragma("GCC unroll 8")                                                                 \
        for (int k = 0; k < G_; k++)                                                            \
            acc[(P) % U_][k] = _mm512_fmadd_ps(                                                 \
                xp, _mm512_maskz_loadu_ps(wm, w + k * bs + (i + 2 * (P)) * 8), acc[(P) % U_][k]); \
    }
/* chains u and u + H summed into u, u < H (of U <= 16 chains, H a power of two): from H = U/2
 * down to 1 that is the pairwise sum; written with constant trip counts, as GCC keeps acc[]
 * in registers only where every index is known before unrolling */
#define FP_D512_FOLD(H)                                                                         \
    if (U_ > (H)) {                                                                             \
        _Pragma("GCC unroll 8")                                                                 \
        for (int u = 0; u < (H); u++)                                                           \
            _Pragma("GCC unroll 8")                                                             \
            for (int k = 0; k < G_; k++)                                                        \
                acc[u][k] = _mm512_add_ps(acc[u][k], acc[(u + (H)) % U_][k]);                   \
    }
/* acc[U][G]: chain 0 of block k starts at its bias (rows 0-7, the odd-input half at 0): one
 * add less on the way out; the upper half is zero, not junk that could be a subnormal (a
 * microcode assist in every FMA) */
#define FP_D512_INIT()                                                                          \
    __m512 acc[U_][G_];                                                                         \
    _Pragma("GCC unroll 8")                                                                     \
    for (int k = 0; k < G_; k++) acc[0][k] = _mm512_maskz_loadu_ps(0x00ff, bias + k * 8);      \
    _Pragma("GCC unroll 8")                                                                     \
    for (int u = 1; u < U_; u++)                                                                \
        _Pragma("GCC unroll 8")                                                                 \
        for (int k = 0; k < G_; k++) acc[u][k] = _mm512_setzero_ps();                           \
    const size_t bs = (size_t)in * 8;

/* the full register-held input chunks c0 <= c < c1 (c1 <= 4) */
#define FP_D512_RCHUNKS(C0, C1)                                                                 \
    _Pragma("GCC unroll 4")                                                                     \
    for (int c = (C0); c < (C1); c++)                                                           \
        if (16 * c + 16 <= in) { FP_D512_CHUNK(xr[c], 16 * c) }

/* inputs i..in-1 (fewer than 16): lanes past `in` are 0 and their weight loads masked off.
 * Pair p goes to chain p mod U as in a full chunk (a short layer, all tail, would otherwise
 * run one chain rest/2 FMAs deep); spelled out, not a loop: GCC keeps acc[] in memory when
 * a loop's index picks the chain */
#define FP_D512_TAILS(R)                                                                        \
    if (i < in) {                                                                               \
        const int rest = in - i;                                                                \
        const __m512 xc = (R) ? _mm512_maskz_mov_ps(fp_mask16(rest), fp_chunk4(xr, i >> 4))    \
                              : _mm512_maskz_loadu_ps(fp_mask16(rest), x + i);                  \
        FP_D512_TAIL(0) FP_D512_TAIL(1) FP_D512_TAIL(2) FP_D512_TAIL(3)                         \
        FP_D512_TAIL(4) FP_D512_TAIL(5) FP_D512_TAIL(6) FP_D512_TAIL(7)                         \
    }

/* the chains pairwise (log2 U adds deep, not U - 1: the reduction is on the critical path of
 * every layer, the next one waits on it), even/odd inputs folded, activation; the outputs to
 * h[] (O) or y. ORs v - v of the pre-activations into bad. */
#define FP_D512_FINISH(O)                                                                       \
    FP_D512_FOLD(8) FP_D512_FOLD(4) FP_D512_FOLD(2) FP_D512_FOLD(1)                             \
    _Pragma("GCC unroll 8")                                                                     \
    for (int k = 0; k < G_; k += 2) {                                                           \
        const __m512 s0 = acc[0][k];                                                            \
        const __m512 s1 = k + 1 < G_ ? acc[0][k + 1] : _mm512_setzero_ps();                     \
        /* fold even/odd inputs: v = [block k rows 0-7 | block k+1 rows 0-7] */                 \
        const __m512 lo = _mm512_shuffle_f32x4(s0, s1, _MM_SHUFFLE(1, 0, 1, 0));                \
        const __m512 hi = _mm512_shuffle_f32x4(s0, s1, _MM_SHUFFLE(3, 2, 3, 2));                \
        const __m512 v = _mm512_add_ps(lo, hi);                                                 \
        const __m512 d = _mm512_sub_ps(v, v);                                                   \
        bad = _mm256_or_ps(bad, _mm256_or_ps(_mm512_castps512_ps256(d),                         \
                                             _mm512_extractf32x8_ps(d, 1)));                    \
        const __m512 a = fp_act512(v, act);                                                     \
        if (O) h[k / 2] = a;                                                                    \
        else if (k + 1 < G_) _mm512_storeu_ps(y + k * 8, a);                                    \
        else _mm256_storeu_ps(y + k * 8, _mm512_castps512_ps256(a));                           \
    }

#define FP_DENSE512_GROUP(NAME, G, U, PF, R, O)                                                 \
    FP_TARGET_AVX512 static inline FP_D512_INL_##O __m256 NAME(                                 \
        const float *w, int in, const float *x, const __m512 *xr, const float *bias, int act,   \
        float *y, __m512 *h) {                                                                  \
        enum { G_ = G, U_ = U };                                                                \
        (void)x; (void)xr; (void)y; (void)h;                                                    \
        FP_D512_INIT()                                                                          \
        int i = 0;                                                                              \
        if (R) {                                                                                \
            FP_D512_RCHUNKS(0, 4)                                                               \
            i = in & ~15;                                                                       \
        } else {                                                                                \
            for (; i + 16 <= in; i += 16) {                                                     \
                const __m512 xc = _mm512_loadu_ps(x + i);                                       \
                if (PF) {                                                                       \
                    for (int k = 0; k < G; k++) {                                               \
                        const char *pf = (const char *)(w + k * bs + i * 8) + FP_PF_AHEAD;      \
                        _mm_prefetch(pf, _MM_HINT_T0);                                          \
                        _mm_prefetch(pf + 64, _MM_HINT_T0);                                     \
                        _mm_prefetch(pf + 128, _MM_HINT_T0);                                    \
                        _mm_prefetch(pf + 192, _MM_HINT_T0);                                    \
                        _mm_prefetch(pf + 256, _MM_HINT_T0);                                    \
                        _mm_prefetch(pf + 320, _MM_HINT_T0);                                    \
                        _mm_prefetch(pf + 384, _MM_HINT_T0);                                    \
                        _mm_prefetch(pf + 448, _MM_HINT_T0);                                    \
                    }                                                                           \
                }                                                                               \
                FP_D512_CHUNK(xc, i)                                                            \
            }                                                                                   \
        }                                                                                       \
        FP_D512_TAILS(R)                                                                        \
        __m256 bad = _mm256_setzero_ps();                                                       \
        FP_D512_FINISH(O)                                                                       \
        return bad;                                                                             \
    }

/* chunk c (0..3) of a register-held input, c known only at run time (a layer's tail) */
FP_TARGET_AVX512 static inline __m512 fp_chunk4(const __m512 *xr, int c) {
    return c == 0 ? xr[0] : c == 1 ? xr[1] : c == 2 ? xr[2] : xr[3];
}

/* in-cache shapes without software prefetch; the 4-block group also with it (2 chains a
 * block there, 4 in cache: 16 chains cover a 64x32 layer's 8-deep chains in half the
 * latency; a streamed layer waits on memory, not on chains, and its prefetch distance is
 * tuned with 2).
 * In-cache layers run 8 blocks (64 rows) at once where they have them: 16 chains and one
 * permute per 8 weight loads instead of 4; streamed layers keep 4 streams, which the
 * prefetch distance is tuned for.
 * A lone block with a long row (the 2-output head layer of a wide model, 128 inputs or more)
 * takes 8 chains (g1w): with 4, each chain waits on its FMA's latency (4 cycles), one FMA a
 * cycle instead of two; short rows keep 4, whose shorter reduction is what they wait on.
 * The _m (memory in, registers out) and _r (registers in and out) variants are the fused
 * pass's; each has the U of its per-layer twin. */
FP_DENSE512_GROUP(fp_dense512_g8, 8, 2, 0, 0, 0)
FP_DENSE512_GROUP(fp_dense512_g4, 4, 4, 0, 0, 0)
FP_DENSE512_GROUP(fp_dense512_g2, 2, 4, 0, 0, 0)
FP_DENSE512_GROUP(fp_dense512_g1, 1, 4, 0, 0, 0)
FP_DENSE512_GROUP(fp_dense512_g1w, 1, 8, 0, 0, 0)
FP_DENSE512_GROUP(fp_dense512_pf_g4, 4, 2, 1, 0, 0)
FP_DENSE512_GROUP(fp_dense512_g8_m, 8, 2, 0, 0, 1)
FP_DENSE512_GROUP(fp_dense512_g4_m, 4, 4, 0, 0, 1)
FP_DENSE512_GROUP(fp_dense512_g2_m, 2, 4, 0, 0, 1)
FP_DENSE512_GROUP(fp_dense512_g1_m, 1, 4, 0, 0, 1)
FP_DENSE512_GROUP(fp_dense512_g1w_m, 1, 8, 0, 0, 1)
FP_DENSE512_GROUP(fp_dense512_g8_r, 8, 2, 0, 1, 1)
FP_DENSE512_GROUP(fp_dense512_g4_r, 4, 4, 0, 1, 1)
FP_DENSE512_GROUP(fp_dense512_g2_r, 2, 4, 0, 1, 1)
FP_DENSE512_GROUP(fp_dense512_g1_r, 1, 4, 0, 1, 1)

/* fp_dense_avx512 and its walk over several groups (dense_schedule.h) */
#define FP_DS_TARGET FP_TARGET_AVX512
#define FP_DS_K(g) fp_dense512_##g
/* a lone block with a long row takes the 8-chain kernel (see fp_dense512_g1w) */
#define FP_DS_LONE (in >= 128 ? FP_DS_ONE(fp_dense512_g1w) : FP_DS_ONE(fp_dense512_g1))
#define FP_DS_GROUPS fp_dense512_groups
#define FP_DS_DENSE fp_dense_avx512
#include "dense_schedule.h"

/* The whole forward pass of a small fp32 model (fp_mlp.fused: two or more layers of 1, 2, 4
 * or 8 blocks, so at most 64 outputs each) in one call: each layer's outputs stay in four zmm
 * registers and are the next layer's input chunks, where the per-layer pass stores them, calls
 * the next layer through the kernel table and loads them back (a store-to-load round trip
 * and a call on the critical path of every layer). Same group kernels, same sums in the same
 * order: the per-layer pass's bits. Returns y (the last layer's nb * 8 outputs) or NULL when
 * any pre-activation is NaN/Inf. */
FP_TARGET_AVX512 const float *fp_mlp_fused_avx512(const fp_mlp *m, const float *x, float *y) {
    const __m512 z = _mm512_setzero_ps();
    __m512 h[4] = {z, z, z, z}, g[4] = {z, z, z, z};
    const fp_dense_layer *L = &m->layers[0];
    __m256 bad;
#define FP_M(fn) fn(L->w, L->in, x, NULL, L->bias, L->act, NULL, h)
    switch (L->nb) {
    case 1: bad = L->in >= 128 ? FP_M(fp_dense512_g1w_m) : FP_M(fp_dense512_g1_m); break;
    case 2: bad = FP_M(fp_dense512_g2_m); break;
    case 4: bad = FP_M(fp_dense512_g4_m); break;
    default: bad = FP_M(fp_dense512_g8_m); break;
    }
#undef FP_M
    for (int l = 1; l < m->n_layers; l++) {
        L = &m->layers[l];
#define FP_R(fn) fn(L->w, L->in, NULL, h, L->bias, L->act, NULL, g)
        switch (L->nb) {
        case 1: bad = _mm256_or_ps(bad, FP_R(fp_dense512_g1_r)); break;
        case 2: bad = _mm256_or_ps(bad, FP_R(fp_dense512_g2_r)); break;
        case 4: bad = _mm256_or_ps(bad, FP_R(fp_dense512_g4_r)); break;
        default: bad = _mm256_or_ps(bad, FP_R(fp_dense512_g8_r)); break;
        }
#undef FP_R
        h[0] = g[0]; h[1] = g[1]; h[2] = g[2]; h[3] = g[3];
    }
    if (L->nb == 1) {
        _mm256_storeu_ps(y, _mm512_castps512_ps256(h[0]));
    } else {
        _Pragma("GCC unroll 4")
        for (int c = 0; c < 4; c++)
            if (2 * c < L->nb) _mm512_storeu_ps(y + 16 * c, h[c]);
    }
    const __m256i bi = _mm256_castps_si256(bad);
    return _mm256_testz_si256(bi, bi) ? y : NULL;
}

/* signal = tanh(out0), confidence = sigmoid(out1) with the 16-lane polynomials (the same as
 * the AVX2 set's, so both sets give the same head) */
FP_TARGET_AVX512 void fp_head_avx512(const float *out, float *signal, float *confidence) {
    *signal = _mm512_cvtss_f32(fp_tanh512(_mm512_set1_ps(out[0])));
    *confidence = _mm512_cvtss_f32(fp_sigmoid512(_mm512_set1_ps(out[1])));
}
#endif
