/* fp_simd.h: kernel sets and the runtime choice between them.
 *
 * Decision: AVX2/FMA code is compiled per function with a target attribute and
 * chosen once at run time by cpuid + xgetbv; nothing is built with -mavx2 or
 * -march=native, so the same binary runs (scalar) on a CPU without AVX2
 * instead of dying with SIGILL. Every kernel has a scalar twin with the same
 * signature; a kernel set is a table of function pointers (csrc/kernels/sets.c). The
 * kernels live by kind and set, csrc/kernels/<kind>_<isa>.c, named fp_<what>_<isa>. AVX-512
 * code is compiled the same way (FP_TARGET_AVX512), never with a global -mavx512f.
 */
#ifndef FP_SIMD_H
#define FP_SIMD_H

#include <stdint.h>
#include <stddef.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define FP_HAVE_X86 1
#define FP_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define FP_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")))
#else
#define FP_TARGET_AVX512
#define FP_HAVE_X86 0
#define FP_TARGET_AVX2
#endif

#define FP_ALIGN 64
#define FP_SLACK 8   /* floats of slack after buffers that 8-lane kernels may overrun */
#define FP_ROUND_UP(n, m) ((((n) + (m) - 1) / (m)) * (m))

/* Kernel sets, in increasing order of what they need: FP_ISA_AVX512 needs F+DQ+BW+VL with the
 * OS saving ZMM state (fp_cpu_has_avx512), FP_ISA_AVX2 needs AVX2+FMA with YMM state. */
typedef enum { FP_ISA_SCALAR = 0, FP_ISA_AVX2 = 1, FP_ISA_AVX512 = 2 } fp_isa;

enum { FP_ACT_IDENTITY = 0, FP_ACT_RELU = 1, FP_ACT_TANH = 2, FP_ACT_SIGMOID = 3 };

/* One dense layer as laid out in the weights arena: ceil(out/8) blocks of 8
 * output rows; block b holds w[b*8 + r][i] at w[(b*in + i)*8 + r], rows past
 * `out` are zero. Bias is padded to nb*8 with zeros. */
typedef struct {
    int in, out, nb, act;
    const float *w;     /* nb * in * 8 floats, 64-byte aligned */
    const float *bias;  /* nb * 8 floats, 64-byte aligned */
} fp_dense_layer;

/* One step of a z-score permute plan (fp_zperm_build, fp_features.h): the 32 floats of raw
 * from `win` (the lanes of each 16-float half that lie inside raw: ld_lo, ld_hi) feed lanes
 * `take` of an output group, lane j from raw[win + p[j]]. `store` != 0 marks the group's last
 * step: its lanes (of 16, from output `out`) are then written as (x - mean) * inv_std. */
typedef struct {
    uint8_t p[16];
    uint16_t take, ld_lo, ld_hi, store;
    int32_t win, out;
} fp_zstep;

typedef char fp_zstep_is_32_bytes[sizeof(fp_zstep) == 32 ? 1 : -1];

typedef struct fp_kernels {
    const char *name;
    /* out[i] = (raw[idx[i]] - mean[i]) * inv_std[i],  i < n */
    void (*zscore_gather)(const float *raw, const int32_t *idx, const float *mean,
                          const float *inv_std, float *out, int n);
    /* the same over runs of consecutive indices: run r copies raw[runs[3r] + j] to
     * out[runs[3r+1] + j] for j < runs[3r+2]; out = (raw - mean) * inv_std there.
     * Runs are in increasing out order; out, mean and inv_std must have FP_SLACK floats
     * of slack past the last run (lanes past a run's end may be written with junk). */
    void (*zscore_runs)(const float *raw, const int32_t *runs, int n_runs, const float *mean,
                        const float *inv_std, float *out);
    /* rolling stats with raw's window fields added (and `old` removed when non-NULL), the
     * sums being of values less ref (fp_features.h): x = raw[w_idx[j]] - ref[j] and
     * o = old[j] - ref[j] in double, s = (sum - o) + x, q = (sumsq - o^2) + x^2 (the
     * commit's order), m = s/n, pm = ref + m, ps = sqrtf(max(q/n - m^2, 0) as a float), the
     * variance scaled by 2^200 and the root by 2^-100 where it is below 2^-100 (a float would
     * flush it); each product rounded on its own (no FMA) */
    void (*window_stats)(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                         const double *sum, const double *sumsq, const float *old,
                         double inv_n, float *pm, float *ps);
    /* out[i] = (x[i] - mean[i]) * inv_std[i],  i < n */
    void (*zscore)(const float *x, const float *mean, const float *inv_std, float *out, int n);
    /* *dot = sum a[i]*b[i], *na2 = sum a[i]^2, one pass, summed in double (cache decisions
     * at cosine thresholds like 0.999999 need more than float32's ~1e-7) */
    void (*dot_norm2)(const float *a, const float *b, int n, double *dot, double *na2);
    /* y[o] = act(bias[o] + sum_i w[o][i] * x[i]); y padded to nb*8. Returns 1 when every
     * pre-activation is finite, 0 when one is NaN/Inf (y is written either way). reverse:
     * walk the row groups last to first (same result; the caller alternates it per call) */
    int (*dense)(const fp_dense_layer *L, const float *x, float *y, int reverse);
    /* 1 if every x[i] is finite, else 0 */
    int (*allfinite)(const float *x, int n);
    /* *signal = tanh(out[0]), *confidence = sigmoid(out[1]) */
    void (*head)(const float *out, float *signal, float *confidence);
    /* *dot = sum a[i]*b[i], *na2 = sum a[i]^2, *nb2 = sum b[i]^2 in float32, one pass (the
     * cache's first look before diff_norms_f32). Its error bound assumes each sum runs in C
     * interleaved chains (term i in chain i mod C, 16 <= C <= 64, each chain a running sum
     * of rounded or fused products) reduced pairwise, so no term meets more than
     * FP_DOTF_ROUNDINGS(n) roundings. Lanes past n contribute nothing. */
    void (*dot_norms_f32)(const float *a, const float *b, int n, float *dot, float *na2,
                          float *nb2);
    /* window_stats then zscore of its 2 n_w outputs in one pass, bit-identical to the two
     * calls (pm, ps rounded to float, then (x - mean) * inv_std): feat[j] from pm[j],
     * feat[n_w + j] from ps[j], j < n_w; mean and inv_std are the window features' own.
     * With old and thr (n_w + 1 values, fp_window_thresholds; NULL: none) it also returns
     * whether committing this tick heals the window: its sums are the commit kernel's
     * ((sum - o) + x, window_stats' order too) and its criteria window_commit's, so the flag
     * is that commit's heal flag; else 0. Free on the way: the sums are in registers. */
    int (*window_zscore)(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                         const double *sum, const double *sumsq, const float *old,
                         double inv_n, const float *mean, const float *inv_std, float *feat,
                         const double *thr);
    /* dot_norm2 with sum b[i]^2 as a third output, in the same pass: *dot and *na2 are
     * bit-identical to dot_norm2's, *nb2 to dot_norm2(b, b, ...)'s *na2 */
    void (*dot_norms_f64)(const float *a, const float *b, int n, double *dot, double *na2,
                          double *nb2);
    /* zscore_gather's out through a permute plan (n steps, fp_zperm_build): the same values,
     * bit for bit; only the steps' lanes of out are written and nothing outside raw's
     * raw_len floats is read. On AVX-512 a plan step is two loads, one two-table permute
     * and a blend, where a 16-lane gather is microcoded (about 3x the time).
     * Returns 1 when every float the steps load (each step's 32-float window of raw, up to
     * raw_len) is finite, else 0: a plan from fp_zperm_build loads all of raw, so this is
     * allfinite(raw) without a pass of its own. */
    int (*zscore_perm)(const float *raw, const fp_zstep *steps, int n, const float *mean,
                       const float *inv_std, float *out);
    /* *dd = sum (a[i] - b[i])^2, *de = sum (a[i] - b[i]) (a[i] + b[i]), *na2 = sum a[i]^2,
     * *nb2 = sum b[i]^2 in float32, one pass: the cache's first look in the difference form
     * (fp_cache.h), whose error stays relative to |a - b|^2 where dot_norms_f32's cosine
     * cannot resolve 1e-6. Chains and reduction as dot_norms_f32 (16 <= C <= 64 chains,
     * pairwise), so a term meets at most FP_DOTF_ROUNDINGS(n) + 2 roundings (the two more:
     * a[i] - b[i] and a[i] + b[i], or the difference twice in the square). Lanes past n
     * contribute nothing and are not read. */
    void (*diff_norms_f32)(const float *a, const float *b, int n, float *dd, float *de,
                           float *na2, float *nb2);
    /* a tick into a window: x = raw[w_idx[j]] - ref[j] in double (ref: ticks, so float);
     * full (the ring row holds
     * the oldest tick, o = row[j] - ref[j]): sum = (sum - o) + x, sumsq = (sumsq - o*o) + x*x,
     * else sum += x, sumsq += x*x; row[j] = raw[w_idx[j]]. Every set gives the scalar twin's
     * doubles bit for bit (each product rounded on its own, never fused into an FMA).
     * undo (or NULL) receives what the commit overwrites, as it loads it: sum[0..n_w),
     * sumsq[0..n_w), fresh[0..2 n_w), then row's old n_w floats (read whether or not the
     * window is full), 36 n_w bytes.
     * With y = raw[w_idx[j]] - ref[n_w + j] (fref, the fresh sums' own ref: ref holds 2 n_w):
     * fresh[j] += y, fresh[n_w + j] += y*y (the window's sums since its ring last wrapped,
     * fp_features.h).
     * Returns 1 (heal: the caller recomputes the sums from the ring, fp_features.h) when
     * full and, for some field, the departing square outweighs the rest of its window 2^16
     * times over, o*o > 2^16 * (the new sumsq), or the new sum has the window's mean too far
     * from ref for q/n - (s/n)^2, sum*sum > thr[j] and sum*sum > thr[n_w] * sumsq
     * (fp_window_thresholds: thr has n_w + 1 values); else 0. */
    int (*window_commit)(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                         double *sum, double *sumsq, float *row, int full, const double *thr,
                         double *undo, double *fresh);
    /* a window's sums recomputed from its ring (fp_features.h's heal): rows rows of `stride`
     * floats, fields 0..n: sum[j] = sum over r of (ring[r stride + j] - ref[j]), sumsq[j] of
     * its square, in double, row after row (each set vectorizes across fields, so every set
     * gives the scalar twin's doubles bit for bit; each product rounded on its own) */
    void (*window_sums)(const float *ring, int rows, int stride, int n, const float *ref,
                        double *sum, double *sumsq);
    /* y[i] = log1p(x[i]), i < n, bit for bit glibc's FMA build of fdlibm's log1p (the one
     * it picks on a CPU with FMA and AVX2; fp_log1p_libm_fused() says whether this host's C
     * library gives the same): the live book's sizes and depths in one call */
    void (*log1p)(const double *x, double *y, int n);
    /* the live book's EWMAs, rows of 8 half-lives: out[8 s + j] = prev[8 s + j] + alpha[j] *
     * (x[s] - prev[8 s + j]), each operation rounded on its own (every set, the same bits) */
    void (*ewma8)(const double *prev, const double *x, const double *alpha, double *out,
                  int rows);
    /* r[i] = (float)o[i], i < n; the first i whose float is not finite, else -1 */
    int (*narrow_f32)(const double *o, float *r, int n);
    /* the live book's level checks on one update's ten levels a side: 1 when every price is
     * finite and > 0, every size finite and >= 0, bid prices not rising and ask prices not
     * falling from level to level; else 0 (fp_book.c then finds the first bad field) */
    int (*book_ok)(const double *bid_px, const double *bid_sz, const double *ask_px,
                   const double *ask_sz);
    /* which levels moved: bit 10 a + i where x_a[i] != old[10 a + i], for the four arrays
     * x0..x3 of ten values against the forty at old */
    uint64_t (*book_diff)(const double *x0, const double *x1, const double *x2,
                          const double *x3, const double *old);
    /* the live book's price fields, in ticks: o[i] = (bid_px[i] - mid) / tick, o[10 + i] =
     * (ask_px[i] - mid) / tick, o[60] the spread, o[84 + i] and o[93 + i] the gaps between
     * levels i and i + 1 (each operation rounded on its own: every set, the same bits) */
    void (*book_prices)(const double *bid_px, const double *ask_px, double mid, double tick,
                        double *o);
    /* out[i] = (b[i] - a[i]) / (b[i] + a[i]) where the sum is > 0, else 0, i < 10 */
    void (*book_imbalance)(const double *b, const double *a, double *out);
} fp_kernels;

/* Roundings any term of a dot_norms_f32 sum can meet (diff_norms_f32: two more, for the
 * difference and the sum its terms start from): a chain of at most ceil(n/16) steps,
 * a product rounding when it is not fused, and at most 6 pairwise levels (up to 64 chains,
 * e.g. 4 ZMM accumulators of 16 lanes, reduced to 1). */
#define FP_DOTF_ROUNDINGS(n) (((n) + 15) / 16 + 7)

/* CPU feature bits, read once (cpuid + xgetbv for the OS's YMM state). */
int fp_cpu_has_avx2(void);
int fp_cpu_has_fma(void);
/* AVX-512 F+DQ+BW+VL with the OS saving opmask and ZMM state (XCR0 bits 5-7), and FMA */
int fp_cpu_has_avx512(void);
int fp_cpu_has_avx512_bf16(void);  /* vdpbf16ps (implies fp_cpu_has_avx512) */
int fp_cpu_has_avx512_vnni(void);  /* vpdpbusd on ZMM (implies fp_cpu_has_avx512) */
int fp_cpu_has_avx_vnni(void);     /* vpdpbusd on YMM (VEX), implies AVX2 */
/* Best set this CPU supports (avx512 over avx2 over scalar). */
fp_isa fp_isa_best(void);
/* 1 when this CPU can run the set */
int fp_isa_supported(fp_isa isa);
/* Kernel table for an ISA; NULL when this CPU cannot run it. */
const fp_kernels *fp_kernels_for(fp_isa isa);
/* 1 where this host's C library log1p is the build every set's log1p kernel reproduces (a
 * probe of a few thousand inputs, log1p_scalar.c), else 0: then callers keep libm's */
int fp_log1p_libm_fused(void);

/* The twins, exported so tests can call each one directly. */
extern const fp_kernels fp_kernels_scalar;
#if FP_HAVE_X86
extern const fp_kernels fp_kernels_avx2;
extern const fp_kernels fp_kernels_avx512;
#endif

/* Aligned allocation behind one wrapper; memory is zeroed. */
void *fp_aligned_alloc(size_t bytes);
void fp_aligned_free(void *p);

#endif
