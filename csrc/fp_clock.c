/* fp_clock.c: TSC detection and calibration against CLOCK_MONOTONIC. */
#include "fp_clock.h"
#if FP_CLOCK_HAVE_TSC
#include <cpuid.h>
#endif

fp_clock_t fp_clock = {0, 1.0, 0, 0, 0.0};
static int g_clock_ready = 0;

static int fp_tsc_invariant(void) {
#if FP_CLOCK_HAVE_TSC
    unsigned int a, b, c, d;
    if (__get_cpuid_max(0x80000000, 0) < 0x80000007) return 0;
    __cpuid(0x80000007, a, b, c, d);
    return (d >> 8) & 1;
#else
    return 0;
#endif
}

void fp_clock_init(void) {
    if (g_clock_ready) return;
    fp_clock.use_tsc = 0;
#if FP_CLOCK_HAVE_TSC
    if (fp_tsc_invariant()) {
        int64_t n0 = fp_mono_ns();
        uint64_t t0 = __rdtsc();
        int64_t n1;
        do { n1 = fp_mono_ns(); } while (n1 - n0 < 5000000);   /* 5 ms */
        uint64_t t1 = __rdtsc();
        if (t1 > t0) {
            fp_clock.ns_per_tick = (double)(n1 - n0) / (double)(t1 - t0);
            fp_clock.base_tick = t1;
            fp_clock.base_ns = n1;
            fp_clock.use_tsc = 1;
        }
    }
#endif
    /* cost of one read, averaged over 1000 back-to-back reads */
    uint64_t a = fp_ticks(), b = a;
    for (int i = 0; i < 1000; i++) b = fp_ticks();
    fp_clock.read_cost_ns = (double)fp_ticks_to_ns(b - a) / 1000.0;
    g_clock_ready = 1;
}

const char *fp_clock_source(void) {
    return fp_clock.use_tsc ? "tsc" : "clock_gettime(CLOCK_MONOTONIC)";
}
