/* lowp_avx2.c: bf16 / int8 dense kernels on AVX2 (+ AVX-VNNI for int8 where present).
 *
 * A 16-row block is two YMM per 64-byte line. bf16 is widened in registers (a shift for
 * the pair's first input, a mask for its second) and fed to FMA; int8 uses vpmaddubsw +
 * vpmaddwd over |x| and sign(x)*q (exact: see fp_lowp.h), or vpdpbusd over x + 128.
 * Each block's line stream is prefetched ahead (int8: FP_LOWP_PF bytes; bf16: in streamed
 * layers, see fp_lowp_bf16_avx2): the layer is one linear stream per block, and weights
 * beyond L2 arrive late without it.
 */
#include "fp_lowp.h"
#include <immintrin.h>
#include <string.h>

#define FP_TARGET_AVXVNNI __attribute__((target("avx2,fma,avxvnni")))

FP_TARGET_AVX2 static inline uint32_t fp_hmax_epu31(__m256i m) {
    __m128i h = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    return (uint32_t)_mm_cvtsi128_si32(h);
}

FP_TARGET_AVX2 static inline void fp_store_s8x8(__m256i q, int8_t *s, uint8_t *u) {
    const __m256i perm = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    __m256i t = _mm256_packs_epi32(q, q);
    t = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(t, t), perm);
    const __m128i b = _mm256_castsi256_si128(t);
    _mm_storel_epi64((__m128i *)s, b);
    _mm_storel_epi64((__m128i *)u, _mm_xor_si128(b, _mm_set1_epi8((char)0x80)));
}

/* the scalar twin's quantization (fp_lowp_q2), 8 at a time: same max bits, same products,
 * same fused residual, same rint */
FP_TARGET_AVX2 int fp_lowp_quant_avx2(const float *x, int in, int npad, unsigned char *buf,
                                      fp_lowp_xq *q) {
    const __m256i am = _mm256_set1_epi32(0x7fffffff);
    __m256i m0 = _mm256_setzero_si256(), m1 = m0;
    int i = 0;
    for (; i + 16 <= in; i += 16) {
        m0 = _mm256_max_epi32(m0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), am));
        m1 = _mm256_max_epi32(m1, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i + 8)), am));
    }
    for (; i + 8 <= in; i += 8)
        m0 = _mm256_max_epi32(m0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), am));
    uint32_t mb = fp_hmax_epu31(_mm256_max_epi32(m0, m1));
    for (; i < in; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        u &= 0x7fffffffu;
        mb = u > mb ? u : mb;
    }
    if (mb >= 0x7f800000u) return FP_LOWP_Q_BAD;
    if (fp_lowp_is_tiny(mb)) return FP_LOWP_Q_TINY;
    fp_lowp_xscale(mb, q);
    int8_t *x1 = (int8_t *)buf, *x2 = (int8_t *)buf + 2 * npad;
    uint8_t *u1 = buf + npad, *u2 = buf + 3 * npad;
    const __m256 vi1 = _mm256_set1_ps(q->inv1), vi2 = _mm256_set1_ps(q->inv2), vs1 = _mm256_set1_ps(q->s1);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    i = 0;
    for (; i + 8 <= in; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256i a = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v, vi1)), lo), hi);
        const __m256 r = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(a), vs1, v);
        const __m256i c = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(r, vi2)), lo), hi);
        fp_store_s8x8(a, x1 + i, u1 + i);
        fp_store_s8x8(c, x2 + i, u2 + i);
    }
    for (; i < in; i++) {
        long a, c;
        fp_lowp_q2(x[i], q, &a, &c);
        x1[i] = (int8_t)a;
        u1[i] = (uint8_t)(a + 128);
        x2[i] = (int8_t)c;
        u2[i] = (uint8_t)(c + 128);
    }
    memset(x1 + in, 0, (size_t)(npad - in));
    memset(u1 + in, 0x80, (size_t)(npad - in));
    memset(x2 + in, 0, (size_t)(npad - in));
    memset(u2 + in, 0x80, (size_t)(npad - in));
    return FP_LOWP_Q_OK;
}

/* 8 rows: v = fp_lowp_int8_pre over the two dots; relu in registers; returns v - v (NaN
 * bits iff v is NaN/Inf) */
FP_TARGET_AVX2 static inline __m256 fp_lowp_rows_int8(__m256i d1, __m256i d2, const fp_lowp_xq *q,
                                                     const float *scale, const float *bias, int act,
                                                     float *y) {
    const __m256 sw = _mm256_load_ps(scale);
    const __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d2), _mm256_mul_ps(_mm256_set1_ps(q->s2), sw),
                                     _mm256_load_ps(bias));
    __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_mul_ps(_mm256_set1_ps(q->s1), sw), t);
    const __m256 bad = _mm256_sub_ps(v, v);
    if (act == FP_ACT_RELU) v = _mm256_max_ps(v, _mm256_setzero_ps());
    _mm256_store_ps(y, v);
    return bad;
}

FP_TARGET_AVX2 static inline __m256 fp_lowp_rows_f32(__m256 sum, const float *bias, int act,
                                                    float *y) {
    __m256 v = _mm256_add_ps(sum, _mm256_load_ps(bias));
    const __m256 bad = _mm256_sub_ps(v, v);
    if (act == FP_ACT_RELU) v = _mm256_max_ps(v, _mm256_setzero_ps());
    _mm256_store_ps(y, v);
    return bad;
}

FP_TARGET_AVX2 static inline int fp_lowp_ok256(__m256 bad) {
    const __m256i b = _mm256_castps_si256(bad);
    return _mm256_testz_si256(b, b);
}

/* sum_g |x_g| * (sign(x_g) q_g) for one 8-row half: pairs <= 2 * 127 * 127 fit int16 */
FP_TARGET_AVX2 static inline __m256i fp_dot4_avx2(__m256i acc, __m256i xa, __m256i xb, __m256i w,
                                                 __m256i ones) {
    const __m256i t = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(w, xb));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(t, ones));
}

FP_TARGET_AVX2 int fp_lowp_int8_avx2(const fp_lowp_layer *L, const float *x, float *y, void *scratch) {
    const int ng = L->ng, npad = (int)fp_lowp_scratch_floats(L->in);
    fp_lowp_xq q;
    const int qs = fp_lowp_quant_avx2(x, L->in, npad, (unsigned char *)scratch, &q);
    if (qs != FP_LOWP_Q_OK) return qs == FP_LOWP_Q_TINY ? fp_lowp_int8_exact(L, x, y) : fp_lowp_fail(L, y);
    const int32_t *x1 = (const int32_t *)scratch, *x2 = (const int32_t *)((const char *)scratch + 2 * npad);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 bad = _mm256_setzero_ps();
    for (int b = 0; b < L->nb; b++) {
        const __m256i *wb = (const __m256i *)((const char *)L->w + (size_t)b * ng * 64);
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, c0 = a0, c1 = a0;
        for (int g = 0; g < ng; g++) {
            _mm_prefetch((const char *)(wb + 2 * g) + FP_LOWP_PF, _MM_HINT_T0);
            const __m256i w0 = _mm256_load_si256(wb + 2 * g), w1 = _mm256_load_si256(wb + 2 * g + 1);
            __m256i xb = _mm256_set1_epi32(x1[g]), xa = _mm256_abs_epi8(xb);
            a0 = fp_dot4_avx2(a0, xa, xb, w0, ones);
            a1 = fp_dot4_avx2(a1, xa, xb, w1, ones);
            xb = _mm256_set1_epi32(x2[g]);
            xa = _mm256_abs_epi8(xb);
            c0 = fp_dot4_avx2(c0, xa, xb, w0, ones);
            c1 = fp_dot4_avx2(c1, xa, xb, w1, ones);
        }
        const int o = b * FP_LOWP_ROWS;
        bad = _mm256_or_ps(bad, fp_lowp_rows_int8(a0, c0, &q, L->scale + o, L->bias + o, L->act, y + o));
        bad = _mm256_or_ps(bad, fp_lowp_rows_int8(a1, c1, &q, L->scale + o + 8, L->bias + o + 8, L->act, y + o + 8));
        fp_lowp_act_tail(L->act, y + o);
    }
    return fp_lowp_ok256(bad);
}

/* vpdpbusd (VEX) over u = x + 128: dot = acc - 128 * rowsum; two groups in flight (8 chains)
 * so the instruction's latency is covered */
FP_TARGET_AVXVNNI int fp_lowp_int8_avx2_vnni(const fp_lowp_layer *L, const float *x, float *y,
                                             void *scratch) {
    const int ng = L->ng, npad = (int)fp_lowp_scratch_floats(L->in);
    fp_lowp_xq q;
    const int qs = fp_lowp_quant_avx2(x, L->in, npad, (unsigned char *)scratch, &q);
    if (qs != FP_LOWP_Q_OK) return qs == FP_LOWP_Q_TINY ? fp_lowp_int8_exact(L, x, y) : fp_lowp_fail(L, y);
    const int32_t *u1 = (const int32_t *)((const char *)scratch + npad);
    const int32_t *u2 = (const int32_t *)((const char *)scratch + 3 * npad);
    __m256 bad = _mm256_setzero_ps();
    for (int b = 0; b < L->nb; b++) {
        const __m256i *wb = (const __m256i *)((const char *)L->w + (size_t)b * ng * 64);
        __m256i a[2][2][2];   /* [group parity][step][half] */
        for (int u = 0; u < 2; u++)
            for (int k = 0; k < 2; k++) a[u][k][0] = a[u][k][1] = _mm256_setzero_si256();
        int g = 0;
        for (; g + 2 <= ng; g += 2)
            for (int u = 0; u < 2; u++) {
                _mm_prefetch((const char *)(wb + 2 * (g + u)) + FP_LOWP_PF, _MM_HINT_T0);
                const __m256i w0 = _mm256_load_si256(wb + 2 * (g + u)), w1 = _mm256_load_si256(wb + 2 * (g + u) + 1);
                const __m256i b1 = _mm256_set1_epi32(u1[g + u]), b2 = _mm256_set1_epi32(u2[g + u]);
                a[u][0][0] = _mm256_dpbusd_avx_epi32(a[u][0][0], b1, w0);
                a[u][0][1] = _mm256_dpbusd_avx_epi32(a[u][0][1], b1, w1);
                a[u][1][0] = _mm256_dpbusd_avx_epi32(a[u][1][0], b2, w0);
                a[u][1][1] = _mm256_dpbusd_avx_epi32(a[u][1][1], b2, w1);
            }
        if (g < ng) {
            const __m256i w0 = _mm256_load_si256(wb + 2 * g), w1 = _mm256_load_si256(wb + 2 * g + 1);
            const __m256i b1 = _mm256_set1_epi32(u1[g]), b2 = _mm256_set1_epi32(u2[g]);
            a[0][0][0] = _mm256_dpbusd_avx_epi32(a[0][0][0], b1, w0);
            a[0][0][1] = _mm256_dpbusd_avx_epi32(a[0][0][1], b1, w1);
            a[0][1][0] = _mm256_dpbusd_avx_epi32(a[0][1][0], b2, w0);
            a[0][1][1] = _mm256_dpbusd_avx_epi32(a[0][1][1], b2, w1);
        }
        const int o = b * FP_LOWP_ROWS;
        for (int h = 0; h < 2; h++) {
            const __m256i zp = _mm256_slli_epi32(_mm256_load_si256((const __m256i *)(L->rowsum + o + 8 * h)), 7);
            const __m256i d1 = _mm256_sub_epi32(_mm256_add_epi32(a[0][0][h], a[1][0][h]), zp);
            const __m256i d2 = _mm256_sub_epi32(_mm256_add_epi32(a[0][1][h], a[1][1][h]), zp);
            bad = _mm256_or_ps(bad, fp_lowp_rows_int8(d1, d2, &q, L->scale + o + 8 * h,
                                                      L->bias + o + 8 * h, L->act, y + o + 8 * h));
        }
        fp_lowp_act_tail(L->act, y + o);
    }
    return fp_lowp_ok256(bad);
}

/* bf16 by widening: a lane holds one row's pair (inputs 2p, 2p+1); v << 16 is input 2p's
 * weight as fp32 and v & 0xffff0000 input 2p+1's, one single-uop op each (no unpack or
 * cross-lane shuffle). Per 8 rows x 2 inputs that is 1 load, 1 shift, 1 and and 2 FMAs, so
 * the loop is bound by the FP pipes and the 6-wide dispatch, not by the bytes it streams;
 * what follows is tuned to that:
 * - two blocks (32 rows) per pass: one broadcast pair of x serves 8 FMAs, and 8 independent
 *   chains ([block][half][even/odd input]) cover FMA latency x 2 FMA pipes;
 * - the weight vector is pinned in a register (FP_PIN): left alone GCC folds the same 32
 *   bytes into the vpand as a second load, loads the dispatch cannot spare;
 * - layers past FP_LOWP_STREAM_BYTES prefetch each block's stream FP_LOWP_BF16_PF bytes
 *   ahead, one line per line read; in-cache layers skip it (an instruction a line for
 *   nothing).
 * Each row sums its even inputs in one chain and its odd inputs in another, each in input
 * order, then even + odd, then + bias: an order other than the scalar twin's, so the two
 * agree within fp32 rounding (tests/test_weights.py), not bit for bit. A lone block (odd
 * block count) keeps 8 chains by taking two pairs per step ([half][pair parity][even/odd]). */
#define FP_LOWP_BF16_PF 1024
#define FP_LOWP_STREAM_BYTES (512u * 1024u)
#define FP_PIN(v) __asm__("" : "+x"(v))

FP_TARGET_AVX2 static inline __attribute__((always_inline)) __m256
fp_bf16_two_blocks(const __m256i *w0, size_t bstride, int in, const float *x, const float *bias,
                   int act, float *y, const int pf) {
    const int full = in / 2;
    const __m256i hm = _mm256_set1_epi32((int)0xffff0000u);
    __m256 a[2][2][2];   /* [block][half][even / odd input] */
    for (int k = 0; k < 2; k++)
        for (int h = 0; h < 2; h++) a[k][h][0] = a[k][h][1] = _mm256_setzero_ps();
    for (int p = 0; p < full; p++) {
        const __m256 x0 = _mm256_broadcast_ss(x + 2 * p), x1 = _mm256_broadcast_ss(x + 2 * p + 1);
        for (int k = 0; k < 2; k++)
            for (int h = 0; h < 2; h++) {
                __m256i v = _mm256_load_si256(w0 + k * bstride + 2 * p + h);
                FP_PIN(v);
                a[k][h][0] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), x0, a[k][h][0]);
                a[k][h][1] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, hm)), x1, a[k][h][1]);
            }
        if (pf) {
            _mm_prefetch((const char *)(w0 + 2 * p) + FP_LOWP_BF16_PF, _MM_HINT_T0);
            _mm_prefetch((const char *)(w0 + bstride + 2 * p) + FP_LOWP_BF16_PF, _MM_HINT_T0);
        }
    }
    if (in & 1) {   /* the last pair has no second input: x[in] is not ours to read */
        const __m256 x0 = _mm256_broadcast_ss(x + in - 1);
        for (int k = 0; k < 2; k++)
            for (int h = 0; h < 2; h++)
                a[k][h][0] = _mm256_fmadd_ps(
                    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_load_si256(w0 + k * bstride + 2 * full + h), 16)),
                    x0, a[k][h][0]);
    }
    __m256 bad = _mm256_setzero_ps();
    for (int k = 0; k < 2; k++)
        for (int h = 0; h < 2; h++)
            bad = _mm256_or_ps(bad, fp_lowp_rows_f32(_mm256_add_ps(a[k][h][0], a[k][h][1]),
                                                     bias + 16 * k + 8 * h, act, y + 16 * k + 8 * h));
    return bad;
}

FP_TARGET_AVX2 static inline __attribute__((always_inline)) __m256
fp_bf16_one_block(const __m256i *wb, int in, const float *x, const float *bias, int act, float *y,
                  const int pf) {
    const int full = in / 2;
    const __m256i hm = _mm256_set1_epi32((int)0xffff0000u);
    __m256 a[2][4];   /* [half][2 * pair parity + even / odd input] */
    for (int h = 0; h < 2; h++)
        for (int c = 0; c < 4; c++) a[h][c] = _mm256_setzero_ps();
    int p = 0;
    for (; p + 2 <= full; p += 2) {
        if (pf) {
            _mm_prefetch((const char *)(wb + 2 * p) + FP_LOWP_BF16_PF, _MM_HINT_T0);
            _mm_prefetch((const char *)(wb + 2 * p) + FP_LOWP_BF16_PF + 64, _MM_HINT_T0);
        }
        for (int u = 0; u < 2; u++) {
            const __m256 x0 = _mm256_broadcast_ss(x + 2 * (p + u));
            const __m256 x1 = _mm256_broadcast_ss(x + 2 * (p + u) + 1);
            for (int h = 0; h < 2; h++) {
                __m256i v = _mm256_load_si256(wb + 2 * (p + u) + h);
                FP_PIN(v);
                a[h][2 * u] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), x0, a[h][2 * u]);
                a[h][2 * u + 1] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, hm)), x1, a[h][2 * u + 1]);
            }
        }
    }
    for (; p < full; p++) {
        const __m256 x0 = _mm256_broadcast_ss(x + 2 * p), x1 = _mm256_broadcast_ss(x + 2 * p + 1);
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_load_si256(wb + 2 * p + h);
            a[h][0] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), x0, a[h][0]);
            a[h][1] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, hm)), x1, a[h][1]);
        }
    }
    if (in & 1) {
        const __m256 x0 = _mm256_broadcast_ss(x + in - 1);
        for (int h = 0; h < 2; h++)
            a[h][0] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_load_si256(wb + 2 * full + h), 16)), x0, a[h][0]);
    }
    __m256 bad = _mm256_setzero_ps();
    for (int h = 0; h < 2; h++) {
        const __m256 s = _mm256_add_ps(_mm256_add_ps(a[h][0], a[h][1]), _mm256_add_ps(a[h][2], a[h][3]));
        bad = _mm256_or_ps(bad, fp_lowp_rows_f32(s, bias + 8 * h, act, y + 8 * h));
    }
    return bad;
}

FP_TARGET_AVX2 int fp_lowp_bf16_avx2(const fp_lowp_layer *L, const float *x, float *y, void *scratch) {
    (void)scratch;
    const int ng = L->ng, in = L->in, act = L->act, nb = L->nb;
    const size_t bstride = (size_t)ng * 2;   /* YMM per block */
    const __m256i *w = (const __m256i *)L->w;
    const int stream = (size_t)nb * ng * 64 > FP_LOWP_STREAM_BYTES;
    __m256 bad = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        const __m256i *w0 = w + (size_t)b * bstride;
        const int o = b * FP_LOWP_ROWS;
        bad = _mm256_or_ps(bad, stream ? fp_bf16_two_blocks(w0, bstride, in, x, L->bias + o, act, y + o, 1)
                                       : fp_bf16_two_blocks(w0, bstride, in, x, L->bias + o, act, y + o, 0));
        fp_lowp_act_tail(act, y + o);
        fp_lowp_act_tail(act, y + o + FP_LOWP_ROWS);
    }
    if (b < nb) {
        const int o = b * FP_LOWP_ROWS;
        bad = _mm256_or_ps(bad, stream ? fp_bf16_one_block(w + (size_t)b * bstride, in, x, L->bias + o, act, y + o, 1)
                                       : fp_bf16_one_block(w + (size_t)b * bstride, in, x, L->bias + o, act, y + o, 0));
        fp_lowp_act_tail(act, y + o);
    }
    return fp_lowp_ok256(bad);
}
