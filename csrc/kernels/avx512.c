/* avx512.c: the AVX-512 kernel set (F+DQ+BW+VL, with FMA).
 *
 * Decision: as avx2.c, every function carries a target attribute (FP_TARGET_AVX512) instead
 * of a global -mavx512f, so the object loads on any x86-64 and fp_kernels_for() hands this
 * table out only where cpuid and XCR0 say ZMM state is saved. Tails use opmask loads and
 * stores (cheap on AVX-512, unlike AVX2's vmaskmov), so nothing past a caller's buffer is read.
 * The dense kernel keeps the blocked layout of fp_dense_layer (blocks of 8 rows): one 64-byte
 * load covers inputs i and i+1 of an 8-row block, so a zmm accumulator holds the even inputs'
 * partial sums in its low half and the odd inputs' in its high half, folded at the end.
 * Every function has a twin in scalar.c with the same contract. A small fp32 model also has a
 * fused pass here (fp_mlp_fused_avx512, see fp_mlp.h), the per-layer pass's bits in one call.
 */
#include "kernels.h"
#include "fp_mlp.h"
#include <math.h>
#include <string.h>

#if FP_HAVE_X86
#include <immintrin.h>

/* lanes [0, n) of 16, n in 0..16 */
static inline __mmask16 fp_mask16(int n) { return (__mmask16)((1u << n) - 1u); }

/* out = (raw[idx] - mean) * inv_std, gathered 16 at a time; the tail gathers masked */
FP_TARGET_AVX512 static void fp_zscore_gather_avx512(const float *raw, const int32_t *idx,
                                                     const float *mean, const float *inv_std,
                                                     float *out, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i ix = _mm512_loadu_si512((const void *)(idx + i));
        __m512 v = _mm512_i32gather_ps(ix, raw, 4);
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_sub_ps(v, _mm512_loadu_ps(mean + i)),
                                                _mm512_loadu_ps(inv_std + i)));
    }
    if (i < n) {
        const __mmask16 m = fp_mask16(n - i);
        __m512i ix = _mm512_maskz_loadu_epi32(m, idx + i);
        __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, ix, raw, 4);
        __m512 z = _mm512_mul_ps(_mm512_sub_ps(v, _mm512_maskz_loadu_ps(m, mean + i)),
                                 _mm512_maskz_loadu_ps(m, inv_std + i));
        _mm512_mask_storeu_ps(out + i, m, z);
    }
}

/* a permute plan (fp_zstep): each step loads its 32-float window of raw (masked at raw's
 * end), picks lanes with one vpermt2ps and blends them into the group; a group's last step
 * stores it, masked only when the group is partial (a full store is what the lookup's
 * loads of the features can forward from) */
FP_TARGET_AVX512 static int fp_zscore_perm_avx512(const float *raw, const fp_zstep *steps, int n,
                                                  const float *mean, const float *inv_std,
                                                  float *out) {
    __m512 v = _mm512_setzero_ps();
    /* NaN (quiet 0x01, signalling 0x80) or +-Inf (0x08, 0x10) in a loaded lane; masked-off
     * lanes load as 0 */
    __mmask16 bad = 0;
    for (int t = 0; t < n; t++) {
        const fp_zstep *s = &steps[t];
        const float *b = raw + s->win;
        const __m512i ix = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)s->p));
        const __m512 lo = _mm512_maskz_loadu_ps(s->ld_lo, b);
        const __m512 hi = _mm512_maskz_loadu_ps(s->ld_hi, b + 16);
        bad |= (__mmask16)(_mm512_fpclass_ps_mask(lo, 0x99) | _mm512_fpclass_ps_mask(hi, 0x99));
        const __m512 x = _mm512_permutex2var_ps(lo, ix, hi);
        v = _mm512_mask_mov_ps(v, s->take, x);
        if (s->store) {
            const int o = s->out;
            if (s->store == 0xFFFFu) {
                _mm512_storeu_ps(out + o, _mm512_mul_ps(_mm512_sub_ps(v, _mm512_loadu_ps(mean + o)),
                                                        _mm512_loadu_ps(inv_std + o)));
            } else {
                const __mmask16 m = s->store;
                const __m512 z = _mm512_mul_ps(_mm512_sub_ps(v, _mm512_maskz_loadu_ps(m, mean + o)),
                                               _mm512_maskz_loadu_ps(m, inv_std + o));
                _mm512_mask_storeu_ps(out + o, m, z);
            }
        }
    }
    return bad == 0;
}

/* out[o + j] = (raw[r + j] - mean[o + j]) * inv_std[o + j] over each run, 16 lanes a step;
 * the last step of a run is masked on load and store (writes nothing past the run) */
FP_TARGET_AVX512 static void fp_zscore_runs_avx512(const float *raw, const int32_t *runs,
                                                   int n_runs, const float *mean,
                                                   const float *inv_std, float *out) {
    for (int k = 0; k < n_runs; k++) {
        const float *x = raw + runs[3 * k];
        const int o = runs[3 * k + 1], len = runs[3 * k + 2];
        int j = 0;
        for (; j + 16 <= len; j += 16) {
            __m512 z = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + j),
                                                   _mm512_loadu_ps(mean + o + j)),
                                     _mm512_loadu_ps(inv_std + o + j));
            _mm512_storeu_ps(out + o + j, z);
        }
        if (j < len) {
            const __mmask16 m = fp_mask16(len - j);
            __m512 z = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + j),
                                                   _mm512_maskz_loadu_ps(m, mean + o + j)),
                                     _mm512_maskz_loadu_ps(m, inv_std + o + j));
            _mm512_mask_storeu_ps(out + o + j, m, z);
        }
    }
}

/* rolling mean and std of fields j..j+7 (lanes past n_w masked off) in double, the same
 * operations as the scalar twin (so bit-identical to it); window_stats and window_zscore
 * share it. Each product rounded on its own, as the scalar twin's (built without FMA): GCC
 * contracts a product into the addition or subtraction after it (one vfmadd), and
 * q/n - mu^2 cancels, so the fused form gave another std than scalar, ~1% apart; the empty
 * asm statements keep the products apart. */
FP_TARGET_AVX512 static inline void fp_wstats8_avx512(const float *raw, const int32_t *w_idx,
                                                      const float *ref, const double *sum,
                                                      const double *sumsq, const float *old,
                                                      __m512d vn, int j, __mmask8 m,
                                                      __m256 *pm, __m256 *ps,
                                                      const double *thr, double lim,
                                                      __mmask8 *heal) {
    __m256i ix = _mm256_maskz_loadu_epi32(m, w_idx + j);
    __m256 xf = _mm256_mmask_i32gather_ps(_mm256_setzero_ps(), m, ix, raw, 4);
    const __m512d r = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, ref + j));
    __m512d x = _mm512_sub_pd(_mm512_cvtps_pd(xf), r);
    __m512d xx = _mm512_mul_pd(x, x);
    __asm__("" : "+v"(xx));
    __m512d s = _mm512_maskz_loadu_pd(m, sum + j), q = _mm512_maskz_loadu_pd(m, sumsq + j);
    if (old) {
        /* the commit's order, (sum - o) + x, so that thr's flag is its heal flag */
        __m512d o = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, old + j)), r);
        __m512d oo = _mm512_mul_pd(o, o);
        __asm__("" : "+v"(oo));
        s = _mm512_add_pd(_mm512_sub_pd(s, o), x);
        q = _mm512_add_pd(_mm512_sub_pd(q, oo), xx);
        if (thr) {
            __m512d ss = _mm512_mul_pd(s, s);
            __asm__("" : "+v"(ss));
            *heal |= _mm512_mask_cmp_pd_mask(m, oo, _mm512_mul_pd(_mm512_set1_pd(0x1p16), q),
                                             _CMP_GT_OQ);
            *heal |= _mm512_mask_cmp_pd_mask(
                _mm512_mask_cmp_pd_mask(m, ss, _mm512_maskz_loadu_pd(m, thr + j), _CMP_GT_OQ),
                ss, _mm512_mul_pd(_mm512_set1_pd(lim), q), _CMP_GT_OQ);
        }
    } else {
        s = _mm512_add_pd(s, x);
        q = _mm512_add_pd(q, xx);
    }
    __m512d mu = _mm512_mul_pd(s, vn);
    __m512d qn = _mm512_mul_pd(q, vn), mu2 = _mm512_mul_pd(mu, mu);
    __asm__("" : "+v"(qn), "+v"(mu2));
    __m512d v = _mm512_max_pd(_mm512_sub_pd(qn, mu2), _mm512_setzero_pd());
    *pm = _mm512_cvtpd_ps(_mm512_add_pd(r, mu));
    /* the root of the float variance, scaled below 2^-100 (the scalar twin's comment) */
    const __mmask8 tiny = _mm512_cmp_pd_mask(v, _mm512_set1_pd(0x1p-100), _CMP_LT_OQ);
    const __m256 rt =
        _mm256_sqrt_ps(_mm512_cvtpd_ps(_mm512_mask_mul_pd(v, tiny, v, _mm512_set1_pd(0x1p200))));
    *ps = _mm256_mask_mul_ps(rt, tiny, rt, _mm256_set1_ps(0x1p-100f));
}

static inline __mmask8 fp_mask8_from(int left) {
    return (__mmask8)(left >= 8 ? 0xff : (1u << left) - 1u);
}

/* rolling mean/std, 8 fields a step */
FP_TARGET_AVX512 static void fp_window_stats_avx512(const float *raw, const int32_t *w_idx,
                                                    int n_w, const float *ref,
                                                    const double *sum, const double *sumsq,
                                                    const float *old, double inv_n, float *pm,
                                                    float *ps) {
    const __m512d vn = _mm512_set1_pd(inv_n);
    for (int j = 0; j < n_w; j += 8) {
        const __mmask8 m = fp_mask8_from(n_w - j);
        __m256 a, d;
        fp_wstats8_avx512(raw, w_idx, ref, sum, sumsq, old, vn, j, m, &a, &d, NULL, 0.0, NULL);
        _mm256_mask_storeu_ps(pm + j, m, a);
        _mm256_mask_storeu_ps(ps + j, m, d);
    }
}

/* out = (x - mean) * inv_std */
FP_TARGET_AVX512 static void fp_zscore_avx512(const float *x, const float *mean,
                                              const float *inv_std, float *out, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i),
                                                              _mm512_loadu_ps(mean + i)),
                                                _mm512_loadu_ps(inv_std + i)));
    if (i < n) {
        const __mmask16 m = fp_mask16(n - i);
        _mm512_mask_storeu_ps(out + i, m,
                              _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i),
                                                          _mm512_maskz_loadu_ps(m, mean + i)),
                                            _mm512_maskz_loadu_ps(m, inv_std + i)));
    }
}

/* 16 floats of a and b into the double accumulators: d += a*b, s += a*a (low / high halves) */
FP_TARGET_AVX512 static inline void fp_dot_norm2_step16(__m512 av, __m512 bv, __m512d *d0,
                                                        __m512d *d1, __m512d *s0, __m512d *s1) {
    const __m512d alo = _mm512_cvtps_pd(_mm512_castps512_ps256(av));
    const __m512d ahi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(av, 1));
    *d0 = _mm512_fmadd_pd(alo, _mm512_cvtps_pd(_mm512_castps512_ps256(bv)), *d0);
    *d1 = _mm512_fmadd_pd(ahi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(bv, 1)), *d1);
    *s0 = _mm512_fmadd_pd(alo, alo, *s0);
    *s1 = _mm512_fmadd_pd(ahi, ahi, *s1);
}

/* dot = sum a*b, na2 = sum a*a in double (see fp_dot_norm2_scalar): products of floats are
 * exact in double, so this differs from the scalar and AVX2 twins only by the order of a
 * double sum (~1e-16 relative), far below any cosine threshold the cache uses */
FP_TARGET_AVX512 static void fp_dot_norm2_avx512(const float *a, const float *b, int n,
                                                 double *dot, double *na2) {
    __m512d d0 = _mm512_setzero_pd(), d1 = d0, s0 = d0, s1 = d0;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        fp_dot_norm2_step16(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), &d0, &d1, &s0, &s1);
    if (i < n) {
        /* masked lanes load as 0.0 and add nothing */
        const __mmask16 m = fp_mask16(n - i);
        fp_dot_norm2_step16(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i),
                            &d0, &d1, &s0, &s1);
    }
    *dot = _mm512_reduce_add_pd(_mm512_add_pd(d0, d1));
    *na2 = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

/* e^x for 16 lanes, the same Cephes expf as fp_exp256 (avx2.c), operation for operation, so
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

/* How far ahead (bytes) each block's weight stream is prefetched, in layers past
 * FP_STREAM_BYTES only: weights streamed from L3 or memory need the request out before the
 * hardware prefetcher, which follows G streams at once and ramps up per 4 KB page, would
 * issue it; weights in L2 do not (a 256x256 layer measured ~5% slower with it at 256 to
 * 2048 bytes ahead). */
#define FP_PF_AHEAD 1024

/* G blocks of 8 rows at once, U accumulators per block over pairs of inputs (pair p goes to
 * chain p mod U): G*U independent zmm chains cover FMA latency (a lone block keeps U = 4, as
 * in avx2.c: U = 8 measured 2-3x slower there); one permute of the x chunk
 * serves G weight loads. Per 16 inputs: one x load, 8 permutes, 8*G FMAs with the weights
 * as memory operands. Inputs past the last multiple of 16 run through a masked x chunk
 * (lanes past `in` are 0 and their weight loads are masked off, nothing read past the block).
 * Returns the OR of v - v over the pre-activations (zero bits iff all finite, as avx2.c).
 * The accumulators' zeroing is unrolled by pragma: as a loop, GCC zeroed acc[8][1] in memory
 * (rep stosq on the stack, every call) and the 8-chain lone block ran 3-4x slower.
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
 * latency, the default model's kernel ~1 ns less, measured in one process; a streamed layer
 * waits on memory, not on chains, and its prefetch distance was tuned with 2).
 * In-cache layers run 8 blocks (64 rows) at once where they have them: 16 chains and one
 * permute per 8 weight loads instead of 4 (measured on this Zen core, kernel alone: 128x64
 * 81 -> 73-77 ns, 512x256 3.0 -> 2.4 us, the default 128x64x32x2 model 117-121 -> 110-115 ns);
 * streamed layers keep 4 streams, which the prefetch distance was tuned for.
 * A lone block with a long row (the 2-output head layer of a wide model, 128 inputs or more)
 * takes 8 chains (g1w): with 4, each chain waits on its FMA's latency (4 cycles), one FMA a
 * cycle instead of two (measured: 1024x2 121 -> 91 ns, 256x2 27 -> 24 ns); short rows keep 4,
 * whose shorter reduction is what they wait on (16x2: 4.7 ns with 4, 5.5 with 8; 64x2 even).
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

/* A layer whose weights outgrow L2's share streams them: prefetching ahead pays there
 * (measured 75-80 -> 73-74 us on the 1024x1024x1024x2 model, at the read probe's bandwidth),
 * and costs in cache (see FP_PF_AHEAD). */
#define FP_STREAM_BYTES (512u * 1024u)

/* The layers of more than one group: groups of 8 blocks (64 rows; streamed layers: groups of
 * 4, see above), then at most one group each of 4, 2 and 1 blocks for the rest. `reverse`
 * walks the same groups last to first: each row's sum runs in the same order either way, so
 * the result is bit-identical (see fp_dense_avx2). Kept out of line so the one-group layers
 * of fp_dense_avx512 run without this frame's set-up. */
FP_TARGET_AVX512 __attribute__((noinline)) static __m256 fp_dense512_groups(
    const fp_dense_layer *L, const float *x, float *y, int reverse, int stream) {
    const size_t bs = (size_t)L->in * 8;
    const int nb = L->nb, in = L->in, act = L->act;
    /* the decomposition, in forward order: n_big groups of `big` blocks, then the tail */
    const int lg = stream ? 2 : 3, big = 1 << lg;  /* a shift, not an idiv (~4 ns a call) */
    const int n_big = nb >> lg;
    const int tail0 = n_big * big, rest = nb - tail0;
    const int t4 = rest & 4 ? tail0 : -1;              /* big == 8 only: rest < 4 when big == 4 */
    const int t2 = rest & 2 ? tail0 + (rest & 4) : -1;
    const int t1 = rest & 1 ? nb - 1 : -1;
    __m256 bad = _mm256_setzero_ps();
#define FP_AT(fn, b) \
    fn(L->w + (size_t)(b) * bs, in, x, NULL, L->bias + (b) * 8, act, y + (b) * 8, NULL)
#define FP_BIG(b) (stream ? FP_AT(fp_dense512_pf_g4, b) : FP_AT(fp_dense512_g8, b))
    if (reverse) {
        if (t1 >= 0) bad = _mm256_or_ps(bad, FP_AT(fp_dense512_g1, t1));
        if (t2 >= 0) bad = _mm256_or_ps(bad, FP_AT(fp_dense512_g2, t2));
        if (t4 >= 0) bad = _mm256_or_ps(bad, FP_AT(fp_dense512_g4, t4));
        for (int g = n_big - 1; g >= 0; g--) bad = _mm256_or_ps(bad, FP_BIG(g * big));
    } else {
        for (int g = 0; g < n_big; g++) bad = _mm256_or_ps(bad, FP_BIG(g * big));
        if (t4 >= 0) bad = _mm256_or_ps(bad, FP_AT(fp_dense512_g4, t4));
        if (t2 >= 0) bad = _mm256_or_ps(bad, FP_AT(fp_dense512_g2, t2));
        if (t1 >= 0) bad = _mm256_or_ps(bad, FP_AT(fp_dense512_g1, t1));
    }
#undef FP_BIG
#undef FP_AT
    return bad;
}

/* y = act(W x + b) over the blocked layout. Returns 0 when a pre-activation is NaN/Inf (y is
 * written either way). A layer that is one group (1, 2, 4 or 8 blocks in cache: the narrow
 * layers, the head layer of every model, each layer of the default model) has no order to
 * walk and runs inline here: through fp_dense512_groups' set-up and call it cost ~2-4 ns more
 * a layer (measured, kernel alone: 64x32 25 -> 23 ns, 128x64 75 -> 71 ns, the default
 * 128x64x32x2 model 107 -> 103 ns). */
FP_TARGET_AVX512 static int fp_dense_avx512(const fp_dense_layer *L, const float *x, float *y,
                                            int reverse) {
    const int nb = L->nb, in = L->in, act = L->act;
    const size_t bytes = (size_t)in * 8 * (size_t)nb * sizeof(float);
    const int stream = bytes > FP_STREAM_BYTES;
    __m256 bad;
#define FP_ONE(fn) fn(L->w, in, x, NULL, L->bias, act, y, NULL)
    if (nb == 1) bad = in >= 128 ? FP_ONE(fp_dense512_g1w) : FP_ONE(fp_dense512_g1);
    else if (nb == 2) bad = FP_ONE(fp_dense512_g2);
    else if (nb == 4 && !stream) bad = FP_ONE(fp_dense512_g4);
    else if (nb == 8 && !stream) bad = FP_ONE(fp_dense512_g8);
    else bad = fp_dense512_groups(L, x, y, reverse, stream);
#undef FP_ONE
    const __m256i bi = _mm256_castps_si256(bad);
    return _mm256_testz_si256(bi, bi);
}

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

/* 1 if all finite: an IEEE float is finite iff its exponent bits are not all 1 */
FP_TARGET_AVX512 static int fp_allfinite_avx512(const float *x, int n) {
    const __m512i em = _mm512_set1_epi32(0x7f800000);
    __mmask16 bad = 0, b1 = 0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512((const void *)(x + i)), em), em);
        b1 |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512((const void *)(x + i + 16)), em), em);
    }
    for (; i < n; i += 16) {
        /* masked-off lanes load as 0, which is finite */
        const __mmask16 m = n - i >= 16 ? 0xffff : fp_mask16(n - i);
        bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_maskz_loadu_epi32(m, x + i), em), em);
    }
    return (bad | b1) == 0;
}

/* signal = tanh(out0), confidence = sigmoid(out1) with the 16-lane polynomials (the same as
 * the AVX2 set's, so both sets give the same head) */
FP_TARGET_AVX512 static void fp_head_avx512(const float *out, float *signal, float *confidence) {
    *signal = _mm512_cvtss_f32(fp_tanh512(_mm512_set1_ps(out[0])));
    *confidence = _mm512_cvtss_f32(fp_sigmoid512(_mm512_set1_ps(out[1])));
}

/* fp_window_stats_avx512 and fp_zscore_avx512 in one pass, the same operations in the same
 * order (bit-identical to the two calls; both are elementwise): pm and ps stay in registers */
FP_TARGET_AVX512 static int fp_window_zscore_avx512(const float *raw, const int32_t *w_idx,
                                                    int n_w, const float *ref,
                                                    const double *sum, const double *sumsq,
                                                    const float *old, double inv_n,
                                                    const float *mean, const float *inv_std,
                                                    float *feat, const double *thr) {
    const __m512d vn = _mm512_set1_pd(inv_n);
    const double *th = old ? thr : NULL;
    const double lim = th ? th[n_w] : 0.0;
    __mmask8 heal = 0;
    for (int j = 0; j < n_w; j += 8) {
        const __mmask8 m = fp_mask8_from(n_w - j);
        __m256 pm, ps;
        fp_wstats8_avx512(raw, w_idx, ref, sum, sumsq, old, vn, j, m, &pm, &ps, th, lim, &heal);
        _mm256_mask_storeu_ps(feat + j, m,
                              _mm256_mul_ps(_mm256_sub_ps(pm, _mm256_maskz_loadu_ps(m, mean + j)),
                                            _mm256_maskz_loadu_ps(m, inv_std + j)));
        _mm256_mask_storeu_ps(feat + n_w + j, m,
                              _mm256_mul_ps(_mm256_sub_ps(ps, _mm256_maskz_loadu_ps(m, mean + n_w + j)),
                                            _mm256_maskz_loadu_ps(m, inv_std + n_w + j)));
    }
    return heal != 0;
}

/* dot = sum a*b, na2 = sum a*a, nb2 = sum b*b in float32: 2 accumulators of 16 lanes per sum
 * (32 chains, term i in chain i mod 32, the tail keeping each term's chain), 2 -> 1 then
 * 16 lanes -> 1 pairwise: at most ceil(n/32) + 5 roundings a term, inside
 * FP_DOTF_ROUNDINGS(n) (fp_cache.h's error bound relies on it) */
FP_TARGET_AVX512 static inline float fp_hsum512_pairwise(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

FP_TARGET_AVX512 static void fp_dot_norms_f32_avx512(const float *a, const float *b, int n,
                                                     float *dot, float *na2, float *nb2) {
    __m512 d0 = _mm512_setzero_ps(), d1 = d0, a0 = d0, a1 = d0, b0 = d0, b1 = d0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 x = _mm512_loadu_ps(a + i), y = _mm512_loadu_ps(b + i);
        d0 = _mm512_fmadd_ps(x, y, d0); a0 = _mm512_fmadd_ps(x, x, a0); b0 = _mm512_fmadd_ps(y, y, b0);
        x = _mm512_loadu_ps(a + i + 16); y = _mm512_loadu_ps(b + i + 16);
        d1 = _mm512_fmadd_ps(x, y, d1); a1 = _mm512_fmadd_ps(x, x, a1); b1 = _mm512_fmadd_ps(y, y, b1);
    }
    if (i < n) {
        /* masked lanes load as 0.0 and add nothing */
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : fp_mask16(n - i);
        const __m512 x = _mm512_maskz_loadu_ps(m, a + i), y = _mm512_maskz_loadu_ps(m, b + i);
        d0 = _mm512_fmadd_ps(x, y, d0); a0 = _mm512_fmadd_ps(x, x, a0); b0 = _mm512_fmadd_ps(y, y, b0);
    }
    if (i + 16 < n) {
        const __mmask16 m = fp_mask16(n - i - 16);
        const __m512 x = _mm512_maskz_loadu_ps(m, a + i + 16), y = _mm512_maskz_loadu_ps(m, b + i + 16);
        d1 = _mm512_fmadd_ps(x, y, d1); a1 = _mm512_fmadd_ps(x, x, a1); b1 = _mm512_fmadd_ps(y, y, b1);
    }
    *dot = fp_hsum512_pairwise(_mm512_add_ps(d0, d1));
    *na2 = fp_hsum512_pairwise(_mm512_add_ps(a0, a1));
    *nb2 = fp_hsum512_pairwise(_mm512_add_ps(b0, b1));
}

FP_TARGET_AVX512 static inline void fp_diff_norms_step16(__m512 x, __m512 y, __m512 *d,
                                                         __m512 *e, __m512 *sa, __m512 *sb) {
    const __m512 df = _mm512_sub_ps(x, y);
    *d = _mm512_fmadd_ps(df, df, *d);
    *e = _mm512_fmadd_ps(df, _mm512_add_ps(x, y), *e);
    *sa = _mm512_fmadd_ps(x, x, *sa);
    *sb = _mm512_fmadd_ps(y, y, *sb);
}

/* dd = sum (a-b)^2, de = sum (a-b)(a+b), na2, nb2 in float32 with fp_dot_norms_f32_avx512's
 * chains and reduction (32 chains, 2 -> 1, 16 lanes -> 1 pairwise); masked lanes load as 0.0,
 * add nothing and read nothing past n */
FP_TARGET_AVX512 static void fp_diff_norms_f32_avx512(const float *a, const float *b, int n,
                                                      float *dd, float *de, float *na2,
                                                      float *nb2) {
    __m512 d0 = _mm512_setzero_ps(), d1 = d0, e0 = d0, e1 = d0, a0 = d0, a1 = d0, b0 = d0,
           b1 = d0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        fp_diff_norms_step16(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), &d0, &e0, &a0, &b0);
        fp_diff_norms_step16(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), &d1, &e1,
                             &a1, &b1);
    }
    if (i < n) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : fp_mask16(n - i);
        fp_diff_norms_step16(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i),
                             &d0, &e0, &a0, &b0);
    }
    if (i + 16 < n) {
        const __mmask16 m = fp_mask16(n - i - 16);
        fp_diff_norms_step16(_mm512_maskz_loadu_ps(m, a + i + 16),
                             _mm512_maskz_loadu_ps(m, b + i + 16), &d1, &e1, &a1, &b1);
    }
    *dd = fp_hsum512_pairwise(_mm512_add_ps(d0, d1));
    *de = fp_hsum512_pairwise(_mm512_add_ps(e0, e1));
    *na2 = fp_hsum512_pairwise(_mm512_add_ps(a0, a1));
    *nb2 = fp_hsum512_pairwise(_mm512_add_ps(b0, b1));
}

/* fp_dot_norm2_avx512's chains for dot and |a|^2, and two more for |b|^2 in the same order
 * and reduction, so *dot and *na2 equal dot_norm2(a, b) and *nb2 equals dot_norm2(b, b)'s
 * na2 bit for bit (the cache keeps |b|^2 from one and compares with the other) */
FP_TARGET_AVX512 static inline void fp_dot_norms3_step16(__m512 av, __m512 bv, __m512d *d0,
                                                         __m512d *d1, __m512d *s0, __m512d *s1,
                                                         __m512d *t0, __m512d *t1) {
    const __m512d blo = _mm512_cvtps_pd(_mm512_castps512_ps256(bv));
    const __m512d bhi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(bv, 1));
    fp_dot_norm2_step16(av, bv, d0, d1, s0, s1);
    *t0 = _mm512_fmadd_pd(blo, blo, *t0);
    *t1 = _mm512_fmadd_pd(bhi, bhi, *t1);
}

FP_TARGET_AVX512 static void fp_dot_norms_f64_avx512(const float *a, const float *b, int n,
                                                     double *dot, double *na2, double *nb2) {
    __m512d d0 = _mm512_setzero_pd(), d1 = d0, s0 = d0, s1 = d0, t0 = d0, t1 = d0;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        fp_dot_norms3_step16(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), &d0, &d1, &s0, &s1,
                             &t0, &t1);
    if (i < n) {
        const __mmask16 m = fp_mask16(n - i);
        fp_dot_norms3_step16(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i),
                             &d0, &d1, &s0, &s1, &t0, &t1);
    }
    *dot = _mm512_reduce_add_pd(_mm512_add_pd(d0, d1));
    *na2 = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    *nb2 = _mm512_reduce_add_pd(_mm512_add_pd(t0, t1));
}

/* fp_window_commit_scalar 8 fields a step: the fields gathered, widened to double, the
 * same operations in the same order (each product kept apart from the sum it goes into by
 * an empty asm statement, so never fused: the scalar twin rounds it on its own); lanes past
 * n_w masked on every load and store */
FP_TARGET_AVX512 static int fp_window_commit_avx512(const float *raw, const int32_t *w_idx, int n_w,
                                                    const float *ref, double *sum,
                                                    double *sumsq, float *row, int full,
                                                    const double *thr, double *undo,
                                                    double *fresh) {
    float *undo_row = undo ? (float *)(undo + 4 * n_w) : NULL;
    const __m512d lim = _mm512_set1_pd(thr[n_w]);
    __mmask8 heal = 0;
    for (int j = 0; j < n_w; j += 8) {
        const __mmask8 m = (__mmask8)(n_w - j >= 8 ? 0xFFu : (1u << (n_w - j)) - 1u);
        const __m256i ix = _mm256_maskz_loadu_epi32(m, w_idx + j);
        const __m256 xf = _mm256_mmask_i32gather_ps(_mm256_setzero_ps(), m, ix, raw, 4);
        const __m512d xd = _mm512_cvtps_pd(xf),
                      r = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, ref + j));
        const __m512d x = _mm512_sub_pd(xd, r),
                      y = _mm512_sub_pd(xd, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, ref + n_w + j)));
        __m512d xx = _mm512_mul_pd(x, x), yy = _mm512_mul_pd(y, y);
        __asm__("" : "+v"(xx), "+v"(yy));
        __m512d s = _mm512_maskz_loadu_pd(m, sum + j), q = _mm512_maskz_loadu_pd(m, sumsq + j);
        const __m256 of = _mm256_maskz_loadu_ps(m, row + j);
        const __m512d fs = _mm512_maskz_loadu_pd(m, fresh + j),
                      fq = _mm512_maskz_loadu_pd(m, fresh + n_w + j);
        if (undo) {
            _mm512_mask_storeu_pd(undo + j, m, s);
            _mm512_mask_storeu_pd(undo + n_w + j, m, q);
            _mm512_mask_storeu_pd(undo + 2 * n_w + j, m, fs);
            _mm512_mask_storeu_pd(undo + 3 * n_w + j, m, fq);
            _mm256_mask_storeu_ps(undo_row + j, m, of);
        }
        if (full) {
            const __m512d o = _mm512_sub_pd(_mm512_cvtps_pd(of), r);
            __m512d oo = _mm512_mul_pd(o, o);
            __asm__("" : "+v"(oo));
            s = _mm512_add_pd(_mm512_sub_pd(s, o), x);
            q = _mm512_add_pd(_mm512_sub_pd(q, oo), xx);
            heal |= _mm512_mask_cmp_pd_mask(m, oo, _mm512_mul_pd(q, _mm512_set1_pd(0x1p16)),
                                            _CMP_GT_OQ);
            const __m512d ss = _mm512_mul_pd(s, s);
            heal |= _mm512_mask_cmp_pd_mask(
                _mm512_mask_cmp_pd_mask(m, ss, _mm512_maskz_loadu_pd(m, thr + j), _CMP_GT_OQ),
                ss, _mm512_mul_pd(lim, q), _CMP_GT_OQ);
        } else {
            s = _mm512_add_pd(s, x);
            q = _mm512_add_pd(q, xx);
        }
        _mm512_mask_storeu_pd(sum + j, m, s);
        _mm512_mask_storeu_pd(sumsq + j, m, q);
        _mm256_mask_storeu_ps(row + j, m, xf);
        _mm512_mask_storeu_pd(fresh + j, m, _mm512_add_pd(fs, y));
        _mm512_mask_storeu_pd(fresh + n_w + j, m, _mm512_add_pd(fq, yy));
    }
    return heal != 0;
}

/* fp_window_sums_scalar 8 fields a vector (lanes past n masked), each field's rows in the
 * same order, the squares kept out of an FMA (empty asm) as the scalar twin rounds them */
FP_TARGET_AVX512 static void fp_window_sums_avx512(const float *ring, int rows, int stride,
                                                   int n, const float *ref, double *sum,
                                                   double *sumsq) {
    for (int j = 0; j < n; j += 8) {
        const __mmask8 m = fp_mask8_from(n - j);
        const __m512d r = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, ref + j));
        __m512d s = _mm512_setzero_pd(), q = _mm512_setzero_pd();
        for (int k = 0; k < rows; k++) {
            const __m512d v = _mm512_sub_pd(
                _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, ring + (size_t)k * stride + j)), r);
            __m512d vv = _mm512_mul_pd(v, v);
            __asm__("" : "+v"(vv));
            s = _mm512_add_pd(s, v);
            q = _mm512_add_pd(q, vv);
        }
        _mm512_mask_storeu_pd(sum + j, m, s);
        _mm512_mask_storeu_pd(sumsq + j, m, q);
    }
}

const fp_kernels fp_kernels_avx512 = {
    "avx512",
    fp_zscore_gather_avx512,
    fp_zscore_runs_avx512,
    fp_window_stats_avx512,
    fp_zscore_avx512,
    fp_dot_norm2_avx512,
    fp_dense_avx512,
    fp_allfinite_avx512,
    fp_head_avx512,
    fp_dot_norms_f32_avx512,
    fp_window_zscore_avx512,
    fp_dot_norms_f64_avx512,
    fp_zscore_perm_avx512,
    fp_diff_norms_f32_avx512,
    fp_window_commit_avx512,
    fp_window_sums_avx512,
};
#endif
