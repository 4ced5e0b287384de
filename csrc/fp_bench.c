/* fp_bench.c: the FMA throughput of this core, measured, so the bench can state how far
 * the MLP kernel is from the bound for its multiply-adds instead of assuming a clock.
 * Decision: 12 independent accumulator chains, enough to cover FMA latency (4-5 cycles)
 * times two FMA ports on current x86 cores; the loop is pure register work. */
#include "fp_simd.h"
#include "fp_clock.h"

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
#endif

/* ns per 8-lane FMA instruction at full throughput; < 0 where AVX2+FMA is missing */
double fp_fma_ns_per_instr(long iters) {
#if FP_HAVE_X86
    if (fp_isa_best() == FP_ISA_AVX2) return fp_fma_ns_avx2(iters);
#endif
    (void)iters;
    return -1.0;
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
