/* fp_clock.h: the clock behind every per-stage latency figure.
 *
 * Decision: stages are timed with RDTSC when the CPU has an invariant TSC
 * (cpuid 0x80000007 EDX bit 8: constant rate, runs in every C/P-state). One
 * read costs about 8-25 cycles (a few ns; fp_clock_read_cost_ns() measures it
 * at init), against 20-30 ns for clock_gettime(CLOCK_MONOTONIC) through the
 * vDSO, and a tick is timed at four points. Without an invariant TSC the clock
 * falls back to clock_gettime and says so (fp_clock_source()).
 * RDTSC is not serialising: a stage boundary may be off by the few cycles
 * the CPU reorders across it, which is below the resolution we report.
 *
 * Calibration: every sample of the two clocks is bracketed (TSC, CLOCK_MONOTONIC, TSC) and
 * only the tightest of several brackets is kept, so a preemption or an interrupt inside
 * one shows up as a wide bracket and is thrown away instead of skewing every figure for
 * the life of the process. ns_per_tick is fitted between two such samples ~10 ms apart,
 * then refitted over the whole baseline (import to now) at each re-anchor.
 * Re-anchoring: fp_ticks_to_mono_ns() maps ticks to CLOCK_MONOTONIC from an anchor that is
 * re-taken when it is older than ~1 s, so the mapping cannot drift away from
 * CLOCK_MONOTONIC. Engines on several threads share this clock: the anchor is published
 * under a seqlock (readers retry on a torn read, never block), and a re-anchor never moves
 * the mapping back: when the old mapping runs ahead of CLOCK_MONOTONIC the new one starts
 * where the old one is and slews (a slightly slower rate for the next period) instead of
 * jumping back. Readers racing a re-anchor can still differ by rounding, well under
 * FP_CLOCK_SLACK_NS.
 * A refit more than 0.2% (plus the calibration's error) from the rate in force is a step
 * between the clocks, not a rate: the rate is kept and the step taken out of the fit's baseline.
 * A TSC that goes back (reset on resume from suspend, a VM moved to a host whose TSC is
 * behind) is seen as a reading more than ~1 ms before the anchor; the next re-anchor
 * restarts the fit there, keeps the rate, and starts the mapping at CLOCK_MONOTONIC plus
 * the lead the old mapping had and what it can have gained since (NTP's slew over a
 * period), so no reading goes back past one taken before the jump; a reading taken on the
 * old TSC and converted after that re-anchor maps as the TSC now. A TSC that goes back by
 * less than ~1 ms is not told from a reading taken before another thread re-anchored: its
 * readings map back from the anchor until the TSC has caught up (the engine refuses steps
 * without ts_ns as time going backwards for that long).
 * Deltas are clamped: a negative TSC difference (t1 read before t0, e.g. across cores on a
 * broken TSC) converts to 0, never to a wrapped uint64.
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

/* how far back two engine-clock readings may disagree and still count as the same moment */
#define FP_CLOCK_SLACK_NS 1000
/* anchor age after which fp_ticks_to_mono_ns() re-anchors */
#define FP_CLOCK_REANCHOR_NS 1000000000LL

typedef struct {
    int use_tsc;
    double ns_per_tick;      /* TSC ticks -> ns for durations: the fitted rate */
    double read_cost_ns;     /* measured cost of one fp_ticks() */
    int cal_samples;         /* bracketed samples taken at calibration */
    double cal_bracket_ns;   /* width of the widest bracket kept (the calibration's error) */
    uint64_t reanchors;      /* re-anchors published since init */
    uint64_t reanchor_ticks; /* FP_CLOCK_REANCHOR_NS in ticks */
    uint64_t fit_tick;       /* first calibration sample: the slope is fitted from here */
    int64_t fit_ns;
    /* the anchor, under the seqlock: odd seq while a writer is publishing */
    uint32_t seq;
    uint64_t base_tick;
    int64_t base_ns;
    double map_ns_per_tick;  /* the rate from the anchor on: ns_per_tick, or slewing */
    uint64_t steps;          /* re-anchors that found the clocks stepped apart (rate kept) */
    int64_t lead_ns;         /* how far the anchor's mapping was ahead of CLOCK_MONOTONIC */
    uint64_t tsc_backs;      /* re-anchors after the TSC went back (a reset on resume) */
} fp_clock_t;

extern fp_clock_t fp_clock;

/* Calibrate once (about 10 ms); safe to call again, later calls do nothing. */
void fp_clock_init(void);
const char *fp_clock_source(void);
/* Re-take the anchor now (force) or only when it is older than FP_CLOCK_REANCHOR_NS.
 * Returns 1 when this call published a new anchor, 0 when it was not due, another thread
 * was publishing, or no sample had a tight enough bracket. Thread-safe. */
int fp_clock_reanchor(int force);
/* fp_ticks_to_mono_ns() for a reading past the anchor's period or before the anchor:
 * re-anchors where due (or where the TSC went back) and maps t from the anchor then in force */
int64_t fp_ticks_to_mono_ns_slow(uint64_t t);

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

static inline double fp_clock_slope(void) {
    double k;
    __atomic_load(&fp_clock.ns_per_tick, &k, __ATOMIC_RELAXED);
    return k;
}

/* fp_ticks_to_ns() with the clock source (tsc) and rate (k) already loaded, for a caller
 * converting several intervals at once */
static inline int64_t fp_ticks_to_ns_at(uint64_t dt, int tsc, double k) {
    const int64_t d = (int64_t)dt;
    if (d <= 0) return 0;
    return tsc ? (int64_t)((double)d * k) : d;
}

/* ns in a difference of two fp_ticks() values, t1 - t0; 0 when t1 is before t0 */
static inline int64_t fp_ticks_to_ns(uint64_t dt) {
    return fp_ticks_to_ns_at(dt, fp_clock.use_tsc, fp_clock_slope());
}

/* The anchor (base tick, base ns, mapping rate) as one consistent read of the seqlock: retried
 * while a writer is publishing or published in between, never blocking it */
static inline void fp_clock_anchor(uint64_t *bt, int64_t *bn, double *k) {
    uint32_t s0, s1;
    for (;;) {
        s0 = __atomic_load_n(&fp_clock.seq, __ATOMIC_ACQUIRE);
        *bt = __atomic_load_n(&fp_clock.base_tick, __ATOMIC_RELAXED);
        *bn = __atomic_load_n(&fp_clock.base_ns, __ATOMIC_RELAXED);
        __atomic_load(&fp_clock.map_ns_per_tick, k, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        s1 = __atomic_load_n(&fp_clock.seq, __ATOMIC_RELAXED);
        if (s0 == s1 && !(s0 & 1u)) return;
#if FP_CLOCK_HAVE_TSC
        _mm_pause();
#endif
    }
}

/* CLOCK_MONOTONIC-compatible ns from a raw timestamp (no second clock read). */
static inline int64_t fp_ticks_to_mono_ns(uint64_t t) {
    if (!fp_clock.use_tsc) return (int64_t)t;
    uint64_t bt;
    int64_t bn;
    double k;
    fp_clock_anchor(&bt, &bn, &k);
    const int64_t d = (int64_t)(t - bt);
    /* one unsigned compare catches both a reading past the anchor's period and one before
     * the anchor (negative d): taken before another thread re-anchored, or a TSC that went
     * back (reset on resume, a migration), which no later reading would ever catch up with:
     * every step() without ts_ns would be refused as time going backwards */
    if ((uint64_t)d > fp_clock.reanchor_ticks) return fp_ticks_to_mono_ns_slow(t);
    return bn + (int64_t)((double)d * k);
}

#endif
