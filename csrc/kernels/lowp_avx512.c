/* lowp_avx512.c: bf16 / int8 dense kernels on AVX-512: one ZMM per 64-byte line of a
 * 16-row block. Native forms where the CPU has them (vdpbf16ps with AVX512_BF16, vpdpbusd
 * with AVX512_VNNI) and, beside them, the forms every AVX-512 CPU runs (widened bf16 + FMA;
 * vpmaddubsw + vpmaddwd with x's sign moved onto q by a masked subtract, as AVX-512 has
 * no vpsignb). Tails use masked loads, so nothing past x[in) is read.
 */
#include "fp_lowp.h"
#include <immintrin.h>
#include <string.h>

#define FP_TARGET_AVX512_BF16 \
    __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#define FP_TARGET_AVX512_VNNI \
    __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512vnni,avx2,fma")))

FP_TARGET_AVX512 static inline __mmask16 fp_tail16(int i, int n) {
    const int r = n - i;
    return r >= 16 ? (__mmask16)0xffff : (r <= 0 ? (__mmask16)0 : (__mmask16)((1u << r) - 1));
}

FP_TARGET_AVX512 static inline __m512i fp_clamp127(__m512i v) {
    return _mm512_min_epi32(_mm512_max_epi32(v, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
}

FP_TARGET_AVX512 static inline void fp_store_s8x16(__m512i v, int8_t *s, uint8_t *u) {
    const __m128i b = _mm512_cvtepi32_epi8(v);
    _mm_storeu_si128((__m128i *)s, b);
    _mm_storeu_si128((__m128i *)u, _mm_xor_si128(b, _mm_set1_epi8((char)0x80)));
}

/* the scalar twin's quantization (fp_lowp_q2), 16 at a time */
FP_TARGET_AVX512 static int fp_lowp_quant_avx512(const float *x, int in, int npad, unsigned char *buf,
                                                 fp_lowp_xq *q) {
    const __m512i am = _mm512_set1_epi32(0x7fffffff);
    __m512i m = _mm512_setzero_si512();
    for (int i = 0; i < in; i += 16)
        m = _mm512_max_epi32(m, _mm512_and_si512(_mm512_maskz_loadu_epi32(fp_tail16(i, in), x + i), am));
    const uint32_t mb = (uint32_t)_mm512_reduce_max_epi32(m);
    if (mb >= 0x7f800000u) return FP_LOWP_Q_BAD;
    if (fp_lowp_is_tiny(mb)) return FP_LOWP_Q_TINY;
    fp_lowp_xscale(mb, q);
    int8_t *x1 = (int8_t *)buf, *x2 = (int8_t *)buf + 2 * npad;
    uint8_t *u1 = buf + npad, *u2 = buf + 3 * npad;
    const __m512 vi1 = _mm512_set1_ps(q->inv1), vi2 = _mm512_set1_ps(q->inv2), vs1 = _mm512_set1_ps(q->s1);
    for (int i = 0; i < npad; i += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(fp_tail16(i, in), x + i);
        const __m512i a = fp_clamp127(_mm512_cvtps_epi32(_mm512_mul_ps(v, vi1)));
        const __m512 r = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(a), vs1, v);
        fp_store_s8x16(a, x1 + i, u1 + i);
        fp_store_s8x16(fp_clamp127(_mm512_cvtps_epi32(_mm512_mul_ps(r, vi2))), x2 + i, u2 + i);
    }
    return FP_LOWP_Q_OK;
}

FP_TARGET_AVX512 static inline __m512 fp_lowp_rows16(__m512 v, int act, float *y) {
    const __m512 bad = _mm512_sub_ps(v, v);
    if (act == FP_ACT_RELU) v = _mm512_max_ps(v, _mm512_setzero_ps());
    _mm512_store_ps(y, v);
    fp_lowp_act_tail(act, y);
    return bad;
}

FP_TARGET_AVX512 static inline __m512 fp_lowp_int8_rows(__m512i d1, __m512i d2, const fp_lowp_xq *q,
                                                       const fp_lowp_layer *L, int o, float *y) {
    const __m512 sw = _mm512_load_ps(L->scale + o);
    const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d2), _mm512_mul_ps(_mm512_set1_ps(q->s2), sw),
                                     _mm512_load_ps(L->bias + o));
    const __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), _mm512_mul_ps(_mm512_set1_ps(q->s1), sw), t);
    return fp_lowp_rows16(v, L->act, y + o);
}

FP_TARGET_AVX512 static inline int fp_lowp_ok512(__m512 bad) {
    const __m512i b = _mm512_castps_si512(bad);
    return _mm512_test_epi32_mask(b, b) == 0;
}

/* sum_g |x_g| * (sign(x_g) q_g): exact in int16 pairs, see fp_lowp.h */
FP_TARGET_AVX512 static inline __m512i fp_dot4_avx512(__m512i acc, int32_t xg, __m512i w, __m512i ones) {
    const __m512i xb = _mm512_set1_epi32(xg);
    const __m512i ws = _mm512_mask_sub_epi8(w, _mm512_movepi8_mask(xb), _mm512_setzero_si512(), w);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(xb), ws), ones));
}

FP_TARGET_AVX512 int fp_lowp_int8_avx512(const fp_lowp_layer *L, const float *x, float *y, void *scratch) {
    const int ng = L->ng, npad = (int)fp_lowp_scratch_floats(L->in);
    fp_lowp_xq q;
    const int qs = fp_lowp_quant_avx512(x, L->in, npad, (unsigned char *)scratch, &q);
    if (qs != FP_LOWP_Q_OK) return qs == FP_LOWP_Q_TINY ? fp_lowp_int8_exact(L, x, y) : fp_lowp_fail(L, y);
    const int32_t *x1 = (const int32_t *)scratch, *x2 = (const int32_t *)((const char *)scratch + 2 * npad);
    const __m512i ones = _mm512_set1_epi16(1);
    __m512 bad = _mm512_setzero_ps();
    for (int b = 0; b < L->nb; b++) {
        const __m512i *wb = (const __m512i *)((const char *)L->w + (size_t)b * ng * 64);
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, c0 = a0, c1 = a0;
        int g = 0;
        for (; g + 2 <= ng; g += 2) {
            _mm_prefetch((const char *)(wb + g) + FP_LOWP_PF, _MM_HINT_T0);
            _mm_prefetch((const char *)(wb + g) + FP_LOWP_PF + 64, _MM_HINT_T0);
            const __m512i w0 = _mm512_load_si512(wb + g), w1 = _mm512_load_si512(wb + g + 1);
            a0 = fp_dot4_avx512(a0, x1[g], w0, ones);
            c0 = fp_dot4_avx512(c0, x2[g], w0, ones);
            a1 = fp_dot4_avx512(a1, x1[g + 1], w1, ones);
            c1 = fp_dot4_avx512(c1, x2[g + 1], w1, ones);
        }
        if (g < ng) {
            const __m512i w0 = _mm512_load_si512(wb + g);
            a0 = fp_dot4_avx512(a0, x1[g], w0, ones);
            c0 = fp_dot4_avx512(c0, x2[g], w0, ones);
        }
        bad = _mm512_or_ps(bad, fp_lowp_int8_rows(_mm512_add_epi32(a0, a1), _mm512_add_epi32(c0, c1), &q,
                                                  L, b * FP_LOWP_ROWS, y));
    }
    return fp_lowp_ok512(bad);
}

/* vpdpbusd over u = x + 128: dot = acc - 128 * rowsum; 8 chains (4 groups x 2 steps) cover
 * its latency */
FP_TARGET_AVX512_VNNI int fp_lowp_int8_avx512_vnni(const fp_lowp_layer *L, const float *x, float *y,
                                                   void *scratch) {
    const int ng = L->ng, npad = (int)fp_lowp_scratch_floats(L->in);
    fp_lowp_xq q;
    const int qs = fp_lowp_quant_avx512(x, L->in, npad, (unsigned char *)scratch, &q);
    if (qs != FP_LOWP_Q_OK) return qs == FP_LOWP_Q_TINY ? fp_lowp_int8_exact(L, x, y) : fp_lowp_fail(L, y);
    const int32_t *u1 = (const int32_t *)((const char *)scratch + npad);
    const int32_t *u2 = (const int32_t *)((const char *)scratch + 3 * npad);
    __m512 bad = _mm512_setzero_ps();
    for (int b = 0; b < L->nb; b++) {
        const __m512i *wb = (const __m512i *)((const char *)L->w + (size_t)b * ng * 64);
        __m512i a[4][2];
        for (int u = 0; u < 4; u++) a[u][0] = a[u][1] = _mm512_setzero_si512();
        int g = 0;
        for (; g + 4 <= ng; g += 4)
            for (int u = 0; u < 4; u++) {
                _mm_prefetch((const char *)(wb + g + u) + FP_LOWP_PF, _MM_HINT_T0);
                const __m512i w = _mm512_load_si512(wb + g + u);
                a[u][0] = _mm512_dpbusd_epi32(a[u][0], _mm512_set1_epi32(u1[g + u]), w);
                a[u][1] = _mm512_dpbusd_epi32(a[u][1], _mm512_set1_epi32(u2[g + u]), w);
            }
        for (; g < ng; g++) {
            const __m512i w = _mm512_load_si512(wb + g);
            a[0][0] = _mm512_dpbusd_epi32(a[0][0], _mm512_set1_epi32(u1[g]), w);
            a[0][1] = _mm512_dpbusd_epi32(a[0][1], _mm512_set1_epi32(u2[g]), w);
        }
        const int o = b * FP_LOWP_ROWS;
        const __m512i zp = _mm512_slli_epi32(_mm512_load_si512(L->rowsum + o), 7);
        const __m512i d1 = _mm512_add_epi32(_mm512_add_epi32(a[0][0], a[1][0]), _mm512_add_epi32(a[2][0], a[3][0]));
        const __m512i d2 = _mm512_add_epi32(_mm512_add_epi32(a[0][1], a[1][1]), _mm512_add_epi32(a[2][1], a[3][1]));
        bad = _mm512_or_ps(bad, fp_lowp_int8_rows(_mm512_sub_epi32(d1, zp), _mm512_sub_epi32(d2, zp), &q, L, o, y));
    }
    return fp_lowp_ok512(bad);
}

/* widened bf16 + FMA: input 2p is v << 16, input 2p+1 is v & ~0xffff */
FP_TARGET_AVX512 int fp_lowp_bf16_avx512(const fp_lowp_layer *L, const float *x, float *y, void *scratch) {
    (void)scratch;
    const int ng = L->ng, in = L->in, full = in / 2;
    const __m512i hm = _mm512_set1_epi32((int)0xffff0000u);
    __m512 bad = _mm512_setzero_ps();
    for (int b = 0; b < L->nb; b++) {
        const __m512i *wb = (const __m512i *)((const char *)L->w + (size_t)b * ng * 64);
        __m512 a[8];
        for (int c = 0; c < 8; c++) a[c] = _mm512_setzero_ps();
        int p = 0;
        for (; p + 4 <= full; p += 4)
            for (int u = 0; u < 4; u++) {
                _mm_prefetch((const char *)(wb + p + u) + FP_LOWP_PF, _MM_HINT_T0);
                const __m512i v = _mm512_load_si512(wb + p + u);
                a[2 * u] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)),
                                           _mm512_set1_ps(x[2 * (p + u)]), a[2 * u]);
                a[2 * u + 1] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, hm)),
                                               _mm512_set1_ps(x[2 * (p + u) + 1]), a[2 * u + 1]);
            }
        for (; p < full; p++) {
            const __m512i v = _mm512_load_si512(wb + p);
            a[0] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), _mm512_set1_ps(x[2 * p]), a[0]);
            a[1] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, hm)), _mm512_set1_ps(x[2 * p + 1]), a[1]);
        }
        if (in & 1)   /* the last pair has no second input: x[in] is not ours to read */
            a[0] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_load_si512(wb + full), 16)),
                                   _mm512_set1_ps(x[in - 1]), a[0]);
        const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])),
                                       _mm512_add_ps(_mm512_add_ps(a[4], a[5]), _mm512_add_ps(a[6], a[7])));
        const int o = b * FP_LOWP_ROWS;
        bad = _mm512_or_ps(bad, fp_lowp_rows16(_mm512_add_ps(s, _mm512_load_ps(L->bias + o)), L->act, y + o));
    }
    return fp_lowp_ok512(bad);
}

/* vdpbf16ps over x = hi + lo: w*hi + w*lo carries ~16 bits of x's mantissa, so the native path
 * stays close to the widened one. hi is x truncated to bf16 (its top 16 bits), not rounded:
 * |hi| <= |x|, so a finite x never becomes an infinite hi (nearest-even takes every |x| above
 * bf16's largest finite, ~3.3961e38, to Inf, which refused inputs the other sets accept) and
 * no product w*hi overflows where w*x does not. lo = x - hi is exact in fp32 (x's low 16 bits)
 * and rounded to nearest-even: |x - hi - lo| <= 2^-16 |x|.
 * vdpbf16ps and vcvtneps2bf16 read and write denormals as 0 whatever MXCSR says: a layer with
 * a denormal bf16 weight, or an input whose hi or lo would be one (0 < |x| < 2^-102), is
 * run by the widened form instead (weights ~3e38 under inputs ~1e-38 lost a pre-activation
 * of 3 here and nowhere else). The check rides the split loop: one compare per 16 inputs. */
FP_TARGET_AVX512_BF16 int fp_lowp_bf16_avx512_bf16(const fp_lowp_layer *L, const float *x, float *y,
                                                   void *scratch) {
    if (L->denormal) return fp_lowp_bf16_avx512(L, x, y, scratch);
    const int ng = L->ng, in = L->in;
    uint16_t *hi = (uint16_t *)scratch;
    uint16_t *lo = (uint16_t *)((char *)scratch + 2 * fp_lowp_scratch_floats(in));
    /* |x| bits - 1 below 2^-102's bits - 1: nonzero and under 2^-102 (0 wraps to the top) */
    const __m512i am = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
    const __m512i tiny_bits = _mm512_set1_epi32(0x0c800000 - 1);
    __mmask16 tiny = 0;
    for (int i = 0; i < in; i += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(fp_tail16(i, in), x + i);
        const __m512i vb = _mm512_castps_si512(v);
        tiny |= _mm512_cmplt_epu32_mask(_mm512_sub_epi32(_mm512_and_si512(vb, am), one), tiny_bits);
        const __m512 hf = _mm512_castsi512_ps(_mm512_and_si512(vb, _mm512_set1_epi32((int)0xffff0000u)));
        _mm256_storeu_si256((__m256i *)(hi + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(vb, 16)));
        _mm256_storeu_si256((__m256i *)(lo + i), (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, hf)));
    }
    if (tiny) return fp_lowp_bf16_avx512(L, x, y, scratch);
    const int32_t *h2 = (const int32_t *)hi, *l2 = (const int32_t *)lo;
    __m512 bad = _mm512_setzero_ps();
    for (int b = 0; b < L->nb; b++) {
        const __m512i *wb = (const __m512i *)((const char *)L->w + (size_t)b * ng * 64);
        __m512 a[4][2];
        for (int u = 0; u < 4; u++) a[u][0] = a[u][1] = _mm512_setzero_ps();
        int p = 0;
        for (; p + 4 <= ng; p += 4)
            for (int u = 0; u < 4; u++) {
                _mm_prefetch((const char *)(wb + p + u) + FP_LOWP_PF, _MM_HINT_T0);
                const __m512bh w = (__m512bh)_mm512_load_si512(wb + p + u);
                a[u][0] = _mm512_dpbf16_ps(a[u][0], w, (__m512bh)_mm512_set1_epi32(h2[p + u]));
                a[u][1] = _mm512_dpbf16_ps(a[u][1], w, (__m512bh)_mm512_set1_epi32(l2[p + u]));
            }
        for (; p < ng; p++) {
            const __m512bh w = (__m512bh)_mm512_load_si512(wb + p);
            a[0][0] = _mm512_dpbf16_ps(a[0][0], w, (__m512bh)_mm512_set1_epi32(h2[p]));
            a[0][1] = _mm512_dpbf16_ps(a[0][1], w, (__m512bh)_mm512_set1_epi32(l2[p]));
        }
        __m512 s = _mm512_setzero_ps();
        for (int u = 0; u < 4; u++) s = _mm512_add_ps(s, _mm512_add_ps(a[u][0], a[u][1]));
        const int o = b * FP_LOWP_ROWS;
        bad = _mm512_or_ps(bad, fp_lowp_rows16(_mm512_add_ps(s, _mm512_load_ps(L->bias + o)), L->act, y + o));
    }
    return fp_lowp_ok512(bad);
}
