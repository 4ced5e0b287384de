/* avx2.c: the AVX2/FMA kernel set.
 *
 * Decision: the functions carry a target attribute instead of a global -mavx2, so this file
 * compiles to code that is safe to load on any x86-64; fp_kernels_for() hands out this table
 * only where cpuid says it runs. Unaligned loads are used for caller-owned inputs (raw
 * ticks), aligned loads only for memory we allocate (weights arena, scratch, cache slots).
 * Every function has a twin in scalar.c with the same contract. A small fp32 model also has a
 * fused pass here (fp_mlp_fused_avx2, see fp_mlp.h), the per-layer pass's bits in one call.
 */
#include "kernels.h"
#include "fp_mlp.h"
#include <math.h>
#include <string.h>

#if FP_HAVE_X86
#include <immintrin.h>

/* tail mask: lanes [0, n) set, n in 0..8 */
FP_TARGET_AVX2 static inline __m256i fp_tailmask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* out = (raw[idx] - mean) * inv_std, gathered 8 at a time */
FP_TARGET_AVX2 static void fp_zscore_gather_avx2(const float *raw, const int32_t *idx,
                                                 const float *mean, const float *inv_std,
                                                 float *out, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i ix = _mm256_loadu_si256((const __m256i *)(idx + i));
        __m256 v = _mm256_i32gather_ps(raw, ix, 4);
        __m256 z = _mm256_mul_ps(_mm256_sub_ps(v, _mm256_loadu_ps(mean + i)),
                                 _mm256_loadu_ps(inv_std + i));
        _mm256_storeu_ps(out + i, z);
    }
    for (; i < n; i++) out[i] = (raw[idx[i]] - mean[i]) * inv_std[i];
}

/* out[o + j] = (raw[r + j] - mean[o + j]) * inv_std[o + j] over each run, 8 lanes a step.
 * A run's last step loads raw masked (nothing past the run is read from the caller's
 * buffer) but stores all 8 lanes: masked stores are microcoded and slow on AMD, and the
 * lanes past the run land where the next run (or the window features) will write, or in
 * the slack the engine allocates after its buffers. */
FP_TARGET_AVX2 static void fp_zscore_runs_avx2(const float *raw, const int32_t *runs, int n_runs,
                                               const float *mean, const float *inv_std,
                                               float *out) {
    for (int k = 0; k < n_runs; k++) {
        const float *x = raw + runs[3 * k];
        const int o = runs[3 * k + 1], len = runs[3 * k + 2];
        int j = 0;
        for (; j + 8 <= len; j += 8) {
            __m256 z = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j),
                                                   _mm256_loadu_ps(mean + o + j)),
                                     _mm256_loadu_ps(inv_std + o + j));
            _mm256_storeu_ps(out + o + j, z);
        }
        if (j < len) {
            __m256 z = _mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(x + j, fp_tailmask(len - j)),
                                                   _mm256_loadu_ps(mean + o + j)),
                                     _mm256_loadu_ps(inv_std + o + j));
            _mm256_storeu_ps(out + o + j, z);
        }
    }
}

/* rolling mean and std of fields j..j+3 in double (running sums are double, of values less
 * ref, see fp_features.h); window_stats and window_zscore share it so they stay
 * bit-identical. Each product is rounded on its own, as the scalar twin's (built without
 * FMA): GCC contracts a product into the addition or subtraction after it (one vfmadd), and
 * q/n - m^2 cancels, so the fused form gave another std than scalar, ~1% apart; the empty
 * asm statements keep the products apart. */
FP_TARGET_AVX2 static inline void fp_wstats4_avx2(const float *raw, const int32_t *w_idx,
                                                  const float *ref, const double *sum,
                                                  const double *sumsq, const float *old,
                                                  __m256d vn, int j, __m128 *pm, __m128 *ps,
                                                  const double *thr, double lim, int *heal) {
    const __m256d r = _mm256_cvtps_pd(_mm_loadu_ps(ref + j));
    __m256d x = _mm256_sub_pd(
        _mm256_cvtps_pd(_mm_i32gather_ps(raw, _mm_loadu_si128((const __m128i *)(w_idx + j)), 4)),
        r);
    __m256d xx = _mm256_mul_pd(x, x);
    __asm__("" : "+x"(xx));
    __m256d s = _mm256_loadu_pd(sum + j), q = _mm256_loadu_pd(sumsq + j);
    if (old) {
        /* the commit's order, (sum - o) + x, so that thr's flag is its heal flag */
        __m256d o = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(old + j)), r);
        __m256d oo = _mm256_mul_pd(o, o);
        __asm__("" : "+x"(oo));
        s = _mm256_add_pd(_mm256_sub_pd(s, o), x);
        q = _mm256_add_pd(_mm256_sub_pd(q, oo), xx);
        if (thr) {
            __m256d ss = _mm256_mul_pd(s, s);
            __asm__("" : "+x"(ss));
            const __m256d a = _mm256_cmp_pd(oo, _mm256_mul_pd(_mm256_set1_pd(0x1p16), q),
                                            _CMP_GT_OQ);
            const __m256d b = _mm256_and_pd(
                _mm256_cmp_pd(ss, _mm256_loadu_pd(thr + j), _CMP_GT_OQ),
                _mm256_cmp_pd(ss, _mm256_mul_pd(_mm256_set1_pd(lim), q), _CMP_GT_OQ));
            *heal |= _mm256_movemask_pd(_mm256_or_pd(a, b));
        }
    } else {
        s = _mm256_add_pd(s, x);
        q = _mm256_add_pd(q, xx);
    }
    __m256d m = _mm256_mul_pd(s, vn);
    __m256d qn = _mm256_mul_pd(q, vn), m2 = _mm256_mul_pd(m, m);
    __asm__("" : "+x"(qn), "+x"(m2));
    __m256d v = _mm256_max_pd(_mm256_sub_pd(qn, m2), _mm256_setzero_pd());
    *pm = _mm256_cvtpd_ps(_mm256_add_pd(r, m));
    /* the root of the float variance, scaled below 2^-100 (the scalar twin's comment) */
    const __m256d tiny = _mm256_cmp_pd(v, _mm256_set1_pd(0x1p-100), _CMP_LT_OQ);
    const __m256d vs = _mm256_mul_pd(v, _mm256_blendv_pd(_mm256_set1_pd(1.0),
                                                         _mm256_set1_pd(0x1p200), tiny));
    *ps = _mm_mul_ps(_mm_sqrt_ps(_mm256_cvtpd_ps(vs)),
                     _mm256_cvtpd_ps(_mm256_blendv_pd(_mm256_set1_pd(1.0),
                                                      _mm256_set1_pd(0x1p-100), tiny)));
}

/* rolling mean/std, 4 fields a step */
FP_TARGET_AVX2 static void fp_window_stats_avx2(const float *raw, const int32_t *w_idx, int n_w,
                                                const float *ref, const double *sum,
                                                const double *sumsq, const float *old,
                                                double inv_n, float *pm, float *ps) {
    const __m256d vn = _mm256_set1_pd(inv_n);
    int j = 0;
    for (; j + 4 <= n_w; j += 4) {
        __m128 m, d;
        fp_wstats4_avx2(raw, w_idx, ref, sum, sumsq, old, vn, j, &m, &d, NULL, 0.0, NULL);
        _mm_storeu_ps(pm + j, m);
        _mm_storeu_ps(ps + j, d);
    }
    if (j < n_w)
        fp_window_stats_scalar(raw, w_idx + j, n_w - j, ref + j, sum + j, sumsq + j,
                               old ? old + j : NULL, inv_n, pm + j, ps + j);
}

/* out = (x - mean) * inv_std */
FP_TARGET_AVX2 static void fp_zscore_avx2(const float *x, const float *mean, const float *inv_std,
                                          float *out, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 z = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(mean + i)),
                                 _mm256_loadu_ps(inv_std + i));
        _mm256_storeu_ps(out + i, z);
    }
    for (; i < n; i++) out[i] = (x[i] - mean[i]) * inv_std[i];
}

FP_TARGET_AVX2 static inline double fp_hsum256d(__m256d v) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

/* 8 floats of a and b into the double accumulators: d += a*b, s += a*a (low / high halves) */
FP_TARGET_AVX2 static inline void fp_dot_norm2_step(__m256 av, __m256 bv, __m256d *d0, __m256d *d1,
                                                    __m256d *s0, __m256d *s1) {
    const __m256d alo = _mm256_cvtps_pd(_mm256_castps256_ps128(av));
    const __m256d ahi = _mm256_cvtps_pd(_mm256_extractf128_ps(av, 1));
    *d0 = _mm256_fmadd_pd(alo, _mm256_cvtps_pd(_mm256_castps256_ps128(bv)), *d0);
    *d1 = _mm256_fmadd_pd(ahi, _mm256_cvtps_pd(_mm256_extractf128_ps(bv, 1)), *d1);
    *s0 = _mm256_fmadd_pd(alo, alo, *s0);
    *s1 = _mm256_fmadd_pd(ahi, ahi, *s1);
}

/* dot = sum a*b, na2 = sum a*a in double (see fp_dot_norm2_scalar): each 8 floats widen to
 * two 4-lane halves, which are also the two FMA chains per quantity. Measured on 128 floats
 * about 16 ns against 6 for the float32 sums it replaces, and against 24 for the distance of
 * unit vectors with the norm guard in double (15 with a float norm guard, plus a normalising
 * pass on every store): the cheapest form that keeps cosine decisions exact to ~1e-14. */
FP_TARGET_AVX2 static void fp_dot_norm2_avx2(const float *a, const float *b, int n, double *dot,
                                             double *na2) {
    __m256d d0 = _mm256_setzero_pd(), d1 = d0, s0 = d0, s1 = d0;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        fp_dot_norm2_step(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), &d0, &d1, &s0, &s1);
    if (i < n) {
        /* masked lanes load as 0.0 and add nothing */
        const __m256i m = fp_tailmask(n - i);
        fp_dot_norm2_step(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m),
                          &d0, &d1, &s0, &s1);
    }
    *dot = fp_hsum256d(_mm256_add_pd(d0, d1));
    *na2 = fp_hsum256d(_mm256_add_pd(s0, s1));
}

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

/* How far ahead (bytes) each block's weight stream is prefetched, in layers whose weights
 * outgrow L2's share (FP_STREAM_BYTES): there the request goes out before the hardware
 * prefetcher, following G streams at once, would issue it (measured 89 -> 73 us on the
 * 1024x1024x1024x2 model); in cache it would only cost an instruction a line. */
#define FP_PF_AHEAD 1024
#define FP_STREAM_BYTES (512u * 1024u)

/* G blocks of 8 rows at once, U accumulators each (inputs i = u mod U go to chain u):
 * G*U = 8 independent FMA chains cover FMA latency x two FMA ports, and one broadcast of
 * x[i] serves G weight loads. Narrow layers (G = 2) get more chains per block; a lone block
 * (G = 1) keeps 4: with 8 its call took 33 ns instead of 11 on a 16x8 layer (measured), the
 * lone block of every odd-width layer, such as the 2-output head layer of every model.
 * Returns the OR of v - v over the blocks' pre-activations v: all zero bits iff every v is
 * finite (x - x is +0 for finite x, NaN for NaN and +-Inf); one subtract and one OR per
 * block of 8 rows, tested once per layer by the caller.
 * The epilogue loops are unrolled by pragma: left as loops (GCC's heuristics gave up once the
 * check was added), acc[][] indexed by a variable k must live on the stack, and every FMA of
 * the main loop went through memory (measured 236 -> 296 ns on the default 10304-MAC model).
 * R and O are for the fused small-model pass (fp_mlp_fused_avx2): R = 4 or 8 takes the inputs
 * from R registers (xr[c] = inputs 8c..8c+7, so in <= 8R; each input broadcast from its lane,
 * see FP_D256_LANE) instead of x, O = 1 leaves the outputs in registers (h[k] = block k's 8 rows,
 * as y would hold them) instead of storing them. Input i goes to the same chain in the same
 * order either way (i mod U below the last multiple of U, chain 0 past it), so every sum, and
 * so every bit, is the per-layer pass's. */
/* the fused pass's variants (R or O) inline into it, where their h[] and xr[] can stay in
 * registers (out of line, h[] went through the stack); the per-layer ones are left to GCC */
#define FP_D256_INL_00
#define FP_D256_INL_01 __attribute__((always_inline))
#define FP_D256_INL_40 __attribute__((always_inline))
#define FP_D256_INL_41 __attribute__((always_inline))
#define FP_D256_INL_80 __attribute__((always_inline))
#define FP_D256_INL_81 __attribute__((always_inline))
/* lane j of the register-held input chunk XC into FMA chain CH (compile-time indices, so
 * acc[][] stays in registers). The broadcast is a vpermilps by immediate of XC's half copied
 * to both halves (one vperm2f128 per half, shared by its 4 lanes): a vpermps needs an index
 * register per lane, and the fused pass measured 4-13% slower with it (16x8x8x8x2 17.1 vs
 * 15.0 ns, 64x32x16x2 58.6 vs 54.8, 64x64x64x64x2 280 vs 267). */
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
 * of one accumulator each (16 YMM registers leave no room for 2 each); measured on this Zen
 * core: 128x64 175 -> 156 ns. Streamed layers keep 4 blocks, as tuned for the prefetch.
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

/* The layers of more than one group: groups of 8 blocks (64 rows; 4 in streamed layers), then
 * at most one group each of 4, 2 and 1 blocks for the rest; `reverse` walks the same groups
 * last to first (the split by shifts: an idiv by a variable group size cost ~4 ns a call).
 * Each row's sum runs in the same order either way, so the result is bit-identical; callers
 * alternate it per forward pass (their own parity, never state in the shared model) so the
 * rows touched last (still in L1) are the first ones read next time, which matters once the
 * weights outgrow L1. Kept out of line so the one-group layers of fp_dense_avx2 run without
 * this frame's set-up. */
FP_TARGET_AVX2 __attribute__((noinline)) static __m256 fp_dense_groups(
    const fp_dense_layer *L, const float *x, float *y, int reverse, int stream) {
    const size_t bs = (size_t)L->in * 8;
    const int nb = L->nb, in = L->in, act = L->act;
    const int lg = stream ? 2 : 3, big = 1 << lg;
    const int n_big = nb >> lg;
    const int tail0 = n_big * big, rest = nb - tail0;
    const int t4 = rest & 4 ? tail0 : -1;
    const int t2 = rest & 2 ? tail0 + (rest & 4) : -1;
    const int t1 = rest & 1 ? nb - 1 : -1;
    __m256 bad = _mm256_setzero_ps();
#define FP_AT(fn, b) \
    fn(L->w + (size_t)(b) * bs, in, x, NULL, L->bias + (b) * 8, act, y + (b) * 8, NULL)
#define FP_BIG(b) (stream ? FP_AT(fp_dense_pf_g4, b) : FP_AT(fp_dense_g8, b))
    if (reverse) {
        if (t1 >= 0) bad = _mm256_or_ps(bad, FP_AT(fp_dense_g1, t1));
        if (t2 >= 0) bad = _mm256_or_ps(bad, FP_AT(fp_dense_g2, t2));
        if (t4 >= 0) bad = _mm256_or_ps(bad, FP_AT(fp_dense_g4, t4));
        for (int g = n_big - 1; g >= 0; g--) bad = _mm256_or_ps(bad, FP_BIG(g * big));
    } else {
        for (int g = 0; g < n_big; g++) bad = _mm256_or_ps(bad, FP_BIG(g * big));
        if (t4 >= 0) bad = _mm256_or_ps(bad, FP_AT(fp_dense_g4, t4));
        if (t2 >= 0) bad = _mm256_or_ps(bad, FP_AT(fp_dense_g2, t2));
        if (t1 >= 0) bad = _mm256_or_ps(bad, FP_AT(fp_dense_g1, t1));
    }
#undef FP_BIG
#undef FP_AT
    return bad;
}

/* y = act(W x + b) over the blocked layout; y is 32-byte aligned. Returns 0 when a
 * pre-activation is NaN/Inf (y is written either way). A layer that is one group (1, 2, 4 or
 * 8 blocks in cache: the narrow layers, the head layer of every model, each layer of the
 * default model) has no order to walk and runs inline here (measured, kernel alone: 64x32
 * 46 -> 42 ns, the default 128x64x32x2 model 205 -> 197 ns). */
FP_TARGET_AVX2 static int fp_dense_avx2(const fp_dense_layer *L, const float *x, float *y,
                                        int reverse) {
    const int nb = L->nb, in = L->in, act = L->act;
    const size_t bytes = (size_t)in * 8 * (size_t)nb * sizeof(float);
    const int stream = bytes > FP_STREAM_BYTES;
    __m256 bad;
#define FP_ONE(fn) fn(L->w, in, x, NULL, L->bias, act, y, NULL)
    if (nb == 1) bad = FP_ONE(fp_dense_g1);
    else if (nb == 2) bad = FP_ONE(fp_dense_g2);
    else if (nb == 4 && !stream) bad = FP_ONE(fp_dense_g4);
    else if (nb == 8 && !stream) bad = FP_ONE(fp_dense_g8);
    else bad = fp_dense_groups(L, x, y, reverse, stream);
#undef FP_ONE
    const __m256i bi = _mm256_castps_si256(bad);
    return _mm256_testz_si256(bi, bi);
}

/* The whole forward pass of a small fp32 model (fp_mlp.fused: two or more layers of 1, 2, 4
 * or 8 blocks) whose hidden layers are at most 4 blocks (32 outputs) wide, in one call: each
 * hidden layer's outputs stay in four ymm registers and are the next layer's inputs (broadcast
 * lane by lane), where the per-layer pass stores them, calls the next layer through the kernel
 * table and broadcasts them back from memory (a call, a dispatch and a store-to-load round
 * trip on the critical path of every layer). Four input registers, 8 accumulators and the
 * broadcast fit the 16 ymm registers. Same group kernels, same sums in the same order: the
 * per-layer pass's bits. Returns y (the last layer's nb * 8 outputs) or NULL when any
 * pre-activation is NaN/Inf. Measured in one process against the per-layer pass, kernel
 * alone on this Zen 4 core: 32x16x2 20.8 -> 16.9 ns, 64x32x16x2 62.0 -> 52.9, 16x8x8x8x2
 * 21.9 -> 15.1; with the layers handed over through a local buffer instead of registers (no
 * call, no dispatch) 32x16x2 took 20.0 and 64x32x16x2 63.3. */
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
 * Measured in one process against the per-layer pass, kernel alone: 64x64x64x64x2 289 -> 266
 * ns, 64x64x2 95 -> 88, 16x64x8x2 45 -> 42, 64x64x64 149 -> 147; the 8-block layers through a
 * buffer instead gave no gain. A 2- or 4-block layer after 8 registers measured slower than
 * the per-layer pass (see FP_FUSED_WIDE). A narrow model keeps fp_mlp_fused_avx2's four
 * registers: eight, unused, cost it (32x16x2 17.2 -> 18.9). */
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

/* 1 if all finite: an IEEE float is finite iff its exponent bits are not all 1 */
FP_TARGET_AVX2 static int fp_allfinite_avx2(const float *x, int n) {
    const __m256i em = _mm256_set1_epi32(0x7f800000);
    __m256i bad = _mm256_setzero_si256(), b1 = bad, b2 = bad, b3 = bad;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i *p = (const __m256i *)(x + i);
        b1 = _mm256_or_si256(b1, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256(p), em), em));
        b2 = _mm256_or_si256(b2, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256(p + 1), em), em));
        b3 = _mm256_or_si256(b3, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256(p + 2), em), em));
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_loadu_si256(p + 3), em), em));
    }
    bad = _mm256_or_si256(_mm256_or_si256(bad, b1), _mm256_or_si256(b2, b3));
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), em);
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(v, em));
    }
    if (!_mm256_testz_si256(bad, bad)) return 0;
    for (; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* signal = tanh(out0), confidence = sigmoid(out1) with the 8-lane polynomials: one pass
 * each instead of two libm calls (tanhf goes through expm1f) on every miss */
FP_TARGET_AVX2 static void fp_head_avx2(const float *out, float *signal, float *confidence) {
    *signal = _mm256_cvtss_f32(fp_tanh256(_mm256_set1_ps(out[0])));
    *confidence = _mm256_cvtss_f32(fp_sigmoid256(_mm256_set1_ps(out[1])));
}

FP_TARGET_AVX2 static void fp_dot_norms_f32_avx2(const float *a, const float *b, int n,
                                                  float *dot, float *na2, float *nb2);
FP_TARGET_AVX2 static int fp_window_zscore_avx2(const float *raw, const int32_t *w_idx, int n_w,
                                                const float *ref, const double *sum,
                                                const double *sumsq, const float *old,
                                                double inv_n, const float *mean,
                                                const float *inv_std, float *feat,
                                                const double *thr);
FP_TARGET_AVX2 static void fp_dot_norms_f64_avx2(const float *a, const float *b, int n,
                                                  double *dot, double *na2, double *nb2);
FP_TARGET_AVX2 static void fp_diff_norms_f32_avx2(const float *a, const float *b, int n,
                                                   float *dd, float *de, float *na2, float *nb2);


/* fp_window_sums_scalar 4 fields a vector, each field's rows in the same order; the
 * squares kept out of an FMA (empty asm), as the scalar twin rounds them; fields past the
 * last 4 by the twin */
FP_TARGET_AVX2 static void fp_window_sums_avx2(const float *ring, int rows, int stride, int n,
                                               const float *ref, double *sum, double *sumsq) {
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const __m256d r = _mm256_cvtps_pd(_mm_loadu_ps(ref + j));
        __m256d s = _mm256_setzero_pd(), q = _mm256_setzero_pd();
        for (int k = 0; k < rows; k++) {
            const __m256d v = _mm256_sub_pd(
                _mm256_cvtps_pd(_mm_loadu_ps(ring + (size_t)k * stride + j)), r);
            __m256d vv = _mm256_mul_pd(v, v);
            __asm__("" : "+x"(vv));
            s = _mm256_add_pd(s, v);
            q = _mm256_add_pd(q, vv);
        }
        _mm256_storeu_pd(sum + j, s);
        _mm256_storeu_pd(sumsq + j, q);
    }
    if (j < n) fp_window_sums_scalar(ring + j, rows, stride, n - j, ref + j, sum + j, sumsq + j);
}

const fp_kernels fp_kernels_avx2 = {
    "avx2",
    fp_zscore_gather_avx2,
    fp_zscore_runs_avx2,
    fp_window_stats_avx2,
    fp_zscore_avx2,
    fp_dot_norm2_avx2,
    fp_dense_avx2,
    fp_allfinite_avx2,
    fp_head_avx2,
    fp_dot_norms_f32_avx2,
    fp_window_zscore_avx2,
    fp_dot_norms_f64_avx2,
    /* AVX2 has no two-table permute (a 32-float window would take 4 vpermps and 3 blends
     * per 8 lanes), so the engine keeps runs or gathers there; the entry is the twin */
    fp_zscore_perm_scalar,
    fp_diff_norms_f32_avx2,
    fp_window_commit_scalar,
    fp_window_sums_avx2,
};

FP_TARGET_AVX2 static inline float fp_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* 8 lanes (the first `len` of them, 1..8) of a and b into one chain set: d += a*b, sa += a*a,
 * sb += b*b; masked lanes load as 0.0 and add nothing */
FP_TARGET_AVX2 static inline void fp_dot_norms_tail(const float *a, const float *b, int len,
                                                    __m256 *d, __m256 *sa, __m256 *sb) {
    const __m256i m = fp_tailmask(len < 8 ? len : 8);
    const __m256 x = _mm256_maskload_ps(a, m), y = _mm256_maskload_ps(b, m);
    *d = _mm256_fmadd_ps(x, y, *d);
    *sa = _mm256_fmadd_ps(x, x, *sa);
    *sb = _mm256_fmadd_ps(y, y, *sb);
}

/* dot = sum a*b, na2 = sum a*a, nb2 = sum b*b in float32: 4 accumulators of 8 lanes per sum
 * (32 chains, term i in chain i mod 32), 4 -> 1 then 8 lanes -> 1, pairwise: at most
 * ceil(n/32) + 5 roundings a term, inside FP_DOTF_ROUNDINGS(n). Named accumulators, not an
 * array: an array indexed in the tail loop would live on the stack (every FMA through
 * memory, measured 36 ns against 6 on 128 floats). */
FP_TARGET_AVX2 static void fp_dot_norms_f32_avx2(const float *a, const float *b, int n,
                                                  float *dot, float *na2, float *nb2) {
    __m256 d0 = _mm256_setzero_ps(), d1 = d0, d2 = d0, d3 = d0;
    __m256 a0 = d0, a1 = d0, a2 = d0, a3 = d0, b0 = d0, b1 = d0, b2 = d0, b3 = d0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 x = _mm256_loadu_ps(a + i), y = _mm256_loadu_ps(b + i);
        d0 = _mm256_fmadd_ps(x, y, d0); a0 = _mm256_fmadd_ps(x, x, a0); b0 = _mm256_fmadd_ps(y, y, b0);
        x = _mm256_loadu_ps(a + i + 8); y = _mm256_loadu_ps(b + i + 8);
        d1 = _mm256_fmadd_ps(x, y, d1); a1 = _mm256_fmadd_ps(x, x, a1); b1 = _mm256_fmadd_ps(y, y, b1);
        x = _mm256_loadu_ps(a + i + 16); y = _mm256_loadu_ps(b + i + 16);
        d2 = _mm256_fmadd_ps(x, y, d2); a2 = _mm256_fmadd_ps(x, x, a2); b2 = _mm256_fmadd_ps(y, y, b2);
        x = _mm256_loadu_ps(a + i + 24); y = _mm256_loadu_ps(b + i + 24);
        d3 = _mm256_fmadd_ps(x, y, d3); a3 = _mm256_fmadd_ps(x, x, a3); b3 = _mm256_fmadd_ps(y, y, b3);
    }
    /* the tail keeps each term's chain (i mod 32) */
    if (i < n) fp_dot_norms_tail(a + i, b + i, n - i, &d0, &a0, &b0);
    if (i + 8 < n) fp_dot_norms_tail(a + i + 8, b + i + 8, n - i - 8, &d1, &a1, &b1);
    if (i + 16 < n) fp_dot_norms_tail(a + i + 16, b + i + 16, n - i - 16, &d2, &a2, &b2);
    if (i + 24 < n) fp_dot_norms_tail(a + i + 24, b + i + 24, n - i - 24, &d3, &a3, &b3);
    *dot = fp_hsum256(_mm256_add_ps(_mm256_add_ps(d0, d1), _mm256_add_ps(d2, d3)));
    *na2 = fp_hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    *nb2 = fp_hsum256(_mm256_add_ps(_mm256_add_ps(b0, b1), _mm256_add_ps(b2, b3)));
}

/* 8 lanes (the first `len`, 1..8) into one chain set of fp_diff_norms_f32_avx2; masked lanes
 * load as 0.0 and add nothing */
FP_TARGET_AVX2 static inline void fp_diff_norms_step(__m256 x, __m256 y, __m256 *d, __m256 *e,
                                                     __m256 *sa, __m256 *sb) {
    const __m256 df = _mm256_sub_ps(x, y);
    *d = _mm256_fmadd_ps(df, df, *d);
    *e = _mm256_fmadd_ps(df, _mm256_add_ps(x, y), *e);
    *sa = _mm256_fmadd_ps(x, x, *sa);
    *sb = _mm256_fmadd_ps(y, y, *sb);
}

/* dd = sum (a-b)^2, de = sum (a-b)(a+b), na2, nb2 in float32: 2 accumulators of 8 lanes per
 * sum (16 chains, term i in chain i mod 16; four sums of 4 accumulators each would not fit
 * the 16 YMM registers), 2 -> 1 then 8 lanes -> 1 pairwise: at most ceil(n/16) + 5
 * roundings a term with the product's, inside FP_DOTF_ROUNDINGS(n), plus the difference
 * and the sum of each term */
FP_TARGET_AVX2 static void fp_diff_norms_f32_avx2(const float *a, const float *b, int n,
                                                   float *dd, float *de, float *na2, float *nb2) {
    __m256 d0 = _mm256_setzero_ps(), d1 = d0, e0 = d0, e1 = d0, a0 = d0, a1 = d0, b0 = d0,
           b1 = d0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        fp_diff_norms_step(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), &d0, &e0, &a0, &b0);
        fp_diff_norms_step(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), &d1, &e1, &a1,
                           &b1);
    }
    if (i < n) {
        const __m256i m = fp_tailmask(n - i < 8 ? n - i : 8);
        fp_diff_norms_step(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), &d0, &e0,
                           &a0, &b0);
    }
    if (i + 8 < n) {
        const __m256i m = fp_tailmask(n - i - 8);
        fp_diff_norms_step(_mm256_maskload_ps(a + i + 8, m), _mm256_maskload_ps(b + i + 8, m),
                           &d1, &e1, &a1, &b1);
    }
    *dd = fp_hsum256(_mm256_add_ps(d0, d1));
    *de = fp_hsum256(_mm256_add_ps(e0, e1));
    *na2 = fp_hsum256(_mm256_add_ps(a0, a1));
    *nb2 = fp_hsum256(_mm256_add_ps(b0, b1));
}

/* fp_window_stats_avx2 and fp_zscore_avx2 in one pass, the same operations in the same
 * order (so bit-identical to the two calls): pm and ps stay in registers instead of going
 * through a scratch buffer whose 16-byte stores the 32-byte z-score loads could not forward */
FP_TARGET_AVX2 static int fp_window_zscore_avx2(const float *raw, const int32_t *w_idx, int n_w,
                                                const float *ref, const double *sum,
                                                const double *sumsq, const float *old,
                                                double inv_n, const float *mean,
                                                const float *inv_std, float *feat,
                                                const double *thr) {
    const __m256d vn = _mm256_set1_pd(inv_n);
    const double *th = old ? thr : NULL;
    const double lim = th ? th[n_w] : 0.0;
    int heal = 0;
    int j = 0;
    for (; j + 4 <= n_w; j += 4) {
        __m128 pm, ps;
        fp_wstats4_avx2(raw, w_idx, ref, sum, sumsq, old, vn, j, &pm, &ps, th, lim, &heal);
        _mm_storeu_ps(feat + j, _mm_mul_ps(_mm_sub_ps(pm, _mm_loadu_ps(mean + j)),
                                           _mm_loadu_ps(inv_std + j)));
        _mm_storeu_ps(feat + n_w + j, _mm_mul_ps(_mm_sub_ps(ps, _mm_loadu_ps(mean + n_w + j)),
                                                 _mm_loadu_ps(inv_std + n_w + j)));
    }
    /* the last fields by the twin, one at a time (its out are feat[j] and feat[n_w + j]) */
    for (; j < n_w; j++) {
        float f[2];
        const float mj[2] = {mean[j], mean[n_w + j]}, ij[2] = {inv_std[j], inv_std[n_w + j]};
        double t[2] = {th ? th[j] : 0.0, lim};
        heal |= fp_window_zscore_scalar(raw, w_idx + j, 1, ref + j, sum + j, sumsq + j,
                                        old ? old + j : NULL, inv_n, mj, ij, f, th ? t : NULL);
        feat[j] = f[0];
        feat[n_w + j] = f[1];
    }
    return heal != 0;
}

/* fp_dot_norm2_step's chains for dot and |a|^2, and two more for |b|^2 (low / high halves),
 * each summed and reduced as fp_dot_norm2_avx2 sums and reduces its own */
FP_TARGET_AVX2 static inline void fp_dot_norms3_step(__m256 av, __m256 bv, __m256d *d0,
                                                     __m256d *d1, __m256d *s0, __m256d *s1,
                                                     __m256d *t0, __m256d *t1) {
    const __m256d blo = _mm256_cvtps_pd(_mm256_castps256_ps128(bv));
    const __m256d bhi = _mm256_cvtps_pd(_mm256_extractf128_ps(bv, 1));
    fp_dot_norm2_step(av, bv, d0, d1, s0, s1);
    *t0 = _mm256_fmadd_pd(blo, blo, *t0);
    *t1 = _mm256_fmadd_pd(bhi, bhi, *t1);
}

FP_TARGET_AVX2 static void fp_dot_norms_f64_avx2(const float *a, const float *b, int n,
                                                  double *dot, double *na2, double *nb2) {
    __m256d d0 = _mm256_setzero_pd(), d1 = d0, s0 = d0, s1 = d0, t0 = d0, t1 = d0;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        fp_dot_norms3_step(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), &d0, &d1, &s0, &s1,
                           &t0, &t1);
    if (i < n) {
        const __m256i m = fp_tailmask(n - i);
        fp_dot_norms3_step(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m),
                           &d0, &d1, &s0, &s1, &t0, &t1);
    }
    *dot = fp_hsum256d(_mm256_add_pd(d0, d1));
    *na2 = fp_hsum256d(_mm256_add_pd(s0, s1));
    *nb2 = fp_hsum256d(_mm256_add_pd(t0, t1));
}
#endif
