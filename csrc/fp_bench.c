/* fp_bench.c: the two bounds of a GEMV on this core, measured, so the bench can state how far
 * the MLP kernel is from the bound for its size instead of assuming a clock: the FMA
 * throughput (8-lane and 16-lane) for weights in cache, and the streaming-read bandwidth
 * for weights that are not.
 * Decision: 12 independent accumulator chains, enough to cover FMA latency (4-5 cycles)
 * times two FMA ports on current x86 cores; the loop is pure register work. The read probe
 * sums a buffer of the size asked (the weights' size), read over and over, so it measures
 * the cache level (or memory) those weights actually stream from. */
#include "fp_simd.h"
#include "fp_clock.h"
#include <stdlib.h>

#include "fp_bench.h"

#if FP_HAVE_X86
#include <immintrin.h>
FP_TARGET_AVX2 static double fp_fma_ns_avx2(long iters) {
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    __m256 a0 = _mm256_set1_ps(0.f), a1 = _mm256_set1_ps(1.f), a2 = _mm256_set1_ps(2.f);
    __m256 a3 = _mm256_set1_ps(3.f), a4 = _mm256_set1_ps(4.f), a5 = _mm256_set1_ps(5.f);
    __m256 a6 = _mm256_set1_ps(6.f), a7 = _mm256_set1_ps(7.f), a8 = _mm256_set1_ps(8.f);
    __m256 a9 = _mm256_set1_ps(9.f), a10 = _mm256_set1_ps(10.f), a11 = _mm256_set1_ps(11.f);
    const int64_t t0 = fp_mono_ns();
    for (long i = 0; i < iters; i++) {
        a0 = _mm256_fmadd_ps(a0, m, c); a1 = _mm256_fmadd_ps(a1, m, c);
        a2 = _mm256_fmadd_ps(a2, m, c); a3 = _mm256_fmadd_ps(a3, m, c);
        a4 = _mm256_fmadd_ps(a4, m, c); a5 = _mm256_fmadd_ps(a5, m, c);
        a6 = _mm256_fmadd_ps(a6, m, c); a7 = _mm256_fmadd_ps(a7, m, c);
        a8 = _mm256_fmadd_ps(a8, m, c); a9 = _mm256_fmadd_ps(a9, m, c);
        a10 = _mm256_fmadd_ps(a10, m, c); a11 = _mm256_fmadd_ps(a11, m, c);
    }
    const int64_t t1 = fp_mono_ns();
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    volatile float sink = _mm256_cvtss_f32(s);
    (void)sink;
    return (double)(t1 - t0) / ((double)iters * 12.0);
}

/* the same 12 chains on 16 lanes (Zen 4 splits a zmm FMA in two 256-bit halves, so there
 * this is about twice the 8-lane time; Zen 5 runs it full width: the probe says which
 * instead of assuming either) */
FP_TARGET_AVX512 static double fp_fma_ns_avx512(long iters) {
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    __m512 a[12];
    for (int k = 0; k < 12; k++) a[k] = _mm512_set1_ps((float)k);
    const int64_t t0 = fp_mono_ns();
    for (long i = 0; i < iters; i++) {
        _Pragma("GCC unroll 12")
        for (int k = 0; k < 12; k++) a[k] = _mm512_fmadd_ps(a[k], m, c);
    }
    const int64_t t1 = fp_mono_ns();
    __m512 s = a[0];
    for (int k = 1; k < 12; k++) s = _mm512_add_ps(s, a[k]);
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return (double)(t1 - t0) / ((double)iters * 12.0);
}

/* Op latency (bench/scaling.py's latency bound of an MLP): one dependent chain, each op
 * taking the previous one's result, 8 per loop trip so the loop's own increment and branch
 * (other ports, off the chain) hide under it. The empty asm between ops keeps the compiler
 * from folding or reassociating the chain (max(max(a, c), c) would otherwise be one op); it
 * emits nothing, as does the one hiding the mul chain's constants. The operands keep the
 * value normal for any iters: FMA converges to 0.1, add climbs to 2 and stays (2 + 1e-7
 * rounds to 2), mul alternates * 0.5 and * 2 (exact). The chain's end value comes back in
 * *end, so the compiler must compute it, and a test can check it stayed normal (a mul chain
 * by 0.999999 went subnormal past ~1.1e7 trips, where a subnormal result costs a microcode
 * assist of ~100 cycles on Intel cores). */
#define FP_LAT_CHAIN(T, OPEXPR)                                                                 \
    const int64_t t0 = fp_mono_ns();                                                            \
    for (long i = 0; i < iters; i++) {                                                          \
        _Pragma("GCC unroll 8")                                                                 \
        for (int k = 0; k < 8; k++) { a = OPEXPR; __asm__ volatile("" : "+v"(a)); }            \
    }                                                                                           \
    const int64_t t1 = fp_mono_ns();                                                            \
    *end = T(a);                                                                                \
    return (double)(t1 - t0) / ((double)iters * 8.0);

FP_TARGET_AVX512 static double fp_op_latency_avx512(int op, long iters, float *end) {
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    __m512 half = _mm512_set1_ps(0.5f), two = _mm512_set1_ps(2.0f);
    /* opaque to the compiler: it rewrote a * 2 as a + a, timing add for every other mul */
    __asm__("" : "+v"(half), "+v"(two));
    __m512 a = _mm512_set1_ps(1.0f);
#define FP_LAT512_FIRST(v) _mm512_cvtss_f32(v)
    switch (op) {
    case 0: { FP_LAT_CHAIN(FP_LAT512_FIRST, _mm512_fmadd_ps(a, m, c)) }
    case 1: { FP_LAT_CHAIN(FP_LAT512_FIRST, _mm512_add_ps(a, c)) }
    case 2: { FP_LAT_CHAIN(FP_LAT512_FIRST, _mm512_mul_ps(a, (k & 1) ? two : half)) }
    case 3: { FP_LAT_CHAIN(FP_LAT512_FIRST, _mm512_max_ps(a, c)) }
    default: return -1.0;
    }
#undef FP_LAT512_FIRST
}

FP_TARGET_AVX2 static double fp_op_latency_avx2(int op, long iters, float *end) {
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    __m256 half = _mm256_set1_ps(0.5f), two = _mm256_set1_ps(2.0f);
    /* opaque to the compiler: it rewrote a * 2 as a + a, timing add for every other mul */
    __asm__("" : "+v"(half), "+v"(two));
    __m256 a = _mm256_set1_ps(1.0f);
#define FP_LAT256_FIRST(v) _mm256_cvtss_f32(v)
    switch (op) {
    case 0: { FP_LAT_CHAIN(FP_LAT256_FIRST, _mm256_fmadd_ps(a, m, c)) }
    case 1: { FP_LAT_CHAIN(FP_LAT256_FIRST, _mm256_add_ps(a, c)) }
    case 2: { FP_LAT_CHAIN(FP_LAT256_FIRST, _mm256_mul_ps(a, (k & 1) ? two : half)) }
    case 3: { FP_LAT_CHAIN(FP_LAT256_FIRST, _mm256_max_ps(a, c)) }
    default: return -1.0;
    }
#undef FP_LAT256_FIRST
}
#undef FP_LAT_CHAIN

/* one pass over n floats (n a multiple of 64), 4 loads of 64 bytes an iteration into 4 sums;
 * pf: each line also asked for 1024 bytes ahead (past L2 the GEMV kernels prefetch their
 * weight streams, so a probe that does not would be a bound they beat) */
FP_TARGET_AVX512 static inline __attribute__((always_inline)) float
fp_read_pass_avx512_body(const float *p, size_t n, const int pf) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < n; i += 64) {
        if (pf)
            for (int l = 0; l < 4; l++) _mm_prefetch((const char *)(p + i) + 1024 + 64 * l, _MM_HINT_T0);
        s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
        s1 = _mm512_add_ps(s1, _mm512_load_ps(p + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_load_ps(p + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_load_ps(p + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

FP_TARGET_AVX2 static inline __attribute__((always_inline)) float
fp_read_pass_avx2_body(const float *p, size_t n, const int pf) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < n; i += 32) {
        if (pf)
            for (int l = 0; l < 2; l++) _mm_prefetch((const char *)(p + i) + 1024 + 64 * l, _MM_HINT_T0);
        s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
    }
    s0 = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    float t[8];
    _mm256_storeu_ps(t, s0);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

FP_TARGET_AVX512 static float fp_read_pass_avx512(const float *p, size_t n) {
    return fp_read_pass_avx512_body(p, n, 0);
}
FP_TARGET_AVX512 static float fp_read_pass_pf_avx512(const float *p, size_t n) {
    return fp_read_pass_avx512_body(p, n, 1);
}
FP_TARGET_AVX2 static float fp_read_pass_avx2(const float *p, size_t n) {
    return fp_read_pass_avx2_body(p, n, 0);
}
FP_TARGET_AVX2 static float fp_read_pass_pf_avx2(const float *p, size_t n) {
    return fp_read_pass_avx2_body(p, n, 1);
}
#endif

static float fp_read_pass_scalar(const float *p, size_t n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < n; i += 4) { s0 += p[i]; s1 += p[i + 1]; s2 += p[i + 2]; s3 += p[i + 3]; }
    return s0 + s1 + s2 + s3;
}

/* ns per 8-lane FMA instruction at full throughput; < 0 where AVX2+FMA is missing. iters < 1
 * runs one trip: a time over no instructions would be 0/0 (NaN) or, negative, read as "no AVX2" */
double fp_fma_ns_per_instr(long iters) {
#if FP_HAVE_X86
    if (iters < 1) iters = 1;
    if (fp_isa_supported(FP_ISA_AVX2)) return fp_fma_ns_avx2(iters);
#endif
    (void)iters;
    return -1.0;
}

/* ns per 16-lane FMA instruction at full throughput; < 0 where the AVX-512 set cannot run */
double fp_fma512_ns_per_instr(long iters) {
#if FP_HAVE_X86
    if (iters < 1) iters = 1;
    if (fp_isa_supported(FP_ISA_AVX512)) return fp_fma_ns_avx512(iters);
#endif
    (void)iters;
    return -1.0;
}

/* latency of one op of the MLP's critical path, and the chain's end value (see fp_bench.h) */
double fp_op_latency_probe(int op, long iters, float *end) {
    *end = 0.0f;
#if FP_HAVE_X86
    if (iters < 1) iters = 1;
    if (fp_isa_supported(FP_ISA_AVX512)) return fp_op_latency_avx512(op, iters, end);
    if (fp_isa_supported(FP_ISA_AVX2)) return fp_op_latency_avx2(op, iters, end);
#endif
    (void)op; (void)iters;
    return -1.0;
}

double fp_op_latency_ns(int op, long iters) {
    volatile float end;
    float e;
    const double ns = fp_op_latency_probe(op, iters, &e);
    end = e;
    (void)end;
    return ns;
}

/* Streaming-read bandwidth in GB/s (1e9 bytes/s) over a buffer of `bytes` (rounded up to 256),
 * read `passes` times after one warm-up pass with the widest loads the CPU has (past 512 KB
 * each time with and without software prefetch); the best pass counts. < 0 when the buffer cannot be allocated. */
double fp_read_gbps(size_t bytes, int passes) {
    bytes = FP_ROUND_UP(bytes < 256 ? 256 : bytes, 256);
    const size_t n = bytes / sizeof(float);
    float *p = (float *)fp_aligned_alloc(bytes);
    if (!p) return -1.0;
    for (size_t i = 0; i < n; i++) p[i] = (float)(i & 7);
    float (*pass)(const float *, size_t) = fp_read_pass_scalar;
    float (*pass_pf)(const float *, size_t) = NULL;
#if FP_HAVE_X86
    if (fp_isa_supported(FP_ISA_AVX512)) pass = fp_read_pass_avx512, pass_pf = fp_read_pass_pf_avx512;
    else if (fp_isa_supported(FP_ISA_AVX2)) pass = fp_read_pass_avx2, pass_pf = fp_read_pass_pf_avx2;
#endif
    /* beyond 512 KB (where the GEMV kernels start prefetching) each pass is also tried with software
     * prefetch, alternating, and the faster counts: the bound is what the core can read */
    if (bytes <= (1u << 19)) pass_pf = NULL;
    volatile float sink = pass(p, n);
    if (pass_pf) sink += pass_pf(p, n);
    /* small buffers: repeat within a timed pass so one pass lasts well over the clock's cost */
    const int inner = bytes >= (1u << 22) ? 1 : (int)((1u << 22) / bytes);
    int64_t best = INT64_MAX;
    for (int r = 0; r < (passes < 1 ? 1 : passes); r++) {
        for (int v = 0; v < (pass_pf ? 2 : 1); v++) {
            float (*f)(const float *, size_t) = v ? pass_pf : pass;
            const int64_t t0 = fp_mono_ns();
            for (int k = 0; k < inner; k++) sink += f(p, n);
            const int64_t dt = fp_mono_ns() - t0;
            if (dt < best) best = dt;
        }
    }
    (void)sink;
    fp_aligned_free(p);
    return best > 0 ? (double)bytes * inner / (double)best : -1.0;
}

/* Spin for duration_ns reading the clock back to back; every gap between two reads longer
 * than threshold_ns is counted in hist[k] for gap in [2^k, 2^(k+1)) ns (k < 40). A gap is
 * time the core was taken away: an interrupt, a preemption, an SMI, a hypervisor exit. */
long long fp_jitter_probe(long long duration_ns, long long threshold_ns, long long *hist,
                          long long *max_gap_ns, long long *reads) {
    fp_clock_init();
    for (int k = 0; k < 40; k++) hist[k] = 0;
    long long n = 0, gaps = 0, maxg = 0;
    const uint64_t start = fp_ticks();
    uint64_t prev = start;
    for (;;) {
        const uint64_t now = fp_ticks();
        n++;
        const long long g = fp_ticks_to_ns(now - prev);
        if (g > threshold_ns) {
            int k = 0;
            while (k < 39 && (1LL << (k + 1)) <= g) k++;
            hist[k]++;
            gaps++;
            if (g > maxg) maxg = g;
        }
        prev = now;
        if (fp_ticks_to_ns(now - start) >= duration_ns) break;
    }
    *max_gap_ns = maxg;
    *reads = n;
    return gaps;
}
