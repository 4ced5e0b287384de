/* fp_clock.h: the clock behind every per-stage latency figure.
 *
 * Decision: stages are timed with RDTSC when the CPU has an invariant TSC
 * (cpuid 0x80000007 EDX bit 8: constant rate, runs in every C/P-state). One
 * read costs about 8-25 cycles (a few ns; fp_clock_read_cost_ns() measures it
 * at init), against 20-30 ns for clock_gettime(CLOCK_MONOTONIC) through the
 * vDSO, and a tick is timed at four points. Ticks are turned into ns with a
 * factor calibrated once against CLOCK_MONOTONIC. Without an invariant TSC
 * the clock falls back to clock_gettime and says so (fp_clock_source()).
 * RDTSC is not serialising: a stage boundary may be off by the few cycles
 * the CPU reorders across it, which is below the resolution we report.
 */
#ifndef FP_CLOCK_H
#define FP_CLOCK_H

#include <stdint.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define FP_CLOCK_HAVE_TSC 1
#else
#define FP_CLOCK_HAVE_TSC 0
#endif

typedef struct {
    int use_tsc;
    double ns_per_tick;    /* TSC ticks -> ns */
    uint64_t base_tick;    /* TSC at calibration */
    int64_t base_ns;       /* CLOCK_MONOTONIC at calibration */
    double read_cost_ns;   /* measured cost of one fp_ticks() */
} fp_clock_t;

extern fp_clock_t fp_clock;

/* Calibrate once (about 5 ms); safe to call again, later calls do nothing. */
void fp_clock_init(void);
const char *fp_clock_source(void);

static inline int64_t fp_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A raw timestamp: TSC ticks, or ns where there is no usable TSC. */
static inline uint64_t fp_ticks(void) {
#if FP_CLOCK_HAVE_TSC
    if (fp_clock.use_tsc) return __rdtsc();
#endif
    return (uint64_t)fp_mono_ns();
}

static inline int64_t fp_ticks_to_ns(uint64_t dt) {
    return fp_clock.use_tsc ? (int64_t)((double)dt * fp_clock.ns_per_tick) : (int64_t)dt;
}

/* CLOCK_MONOTONIC-compatible ns from a raw timestamp (no second clock read). */
static inline int64_t fp_ticks_to_mono_ns(uint64_t t) {
    if (!fp_clock.use_tsc) return (int64_t)t;
    return fp_clock.base_ns + (int64_t)((double)(int64_t)(t - fp_clock.base_tick) * fp_clock.ns_per_tick);
}

#endif
