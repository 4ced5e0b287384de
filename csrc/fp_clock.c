/* fp_clock.c: TSC detection, bracketed calibration against CLOCK_MONOTONIC, re-anchoring
 * (see fp_clock.h for the decisions). */
#include "fp_clock.h"
#if FP_CLOCK_HAVE_TSC
#include <cpuid.h>
#endif

fp_clock_t fp_clock = {0, 1.0, 0.0, 0, 0.0, 0, 0, 0, 0, 0, 0, 0, 1.0, 0, 0, 0};
static int g_clock_ready = 0;

#define FP_CLOCK_TRIES 16        /* brackets per calibration sample */
#define FP_CLOCK_REANCHOR_TRIES 3
#define FP_CLOCK_BASELINE_NS 10000000LL
#define FP_CLOCK_RATE_TOL 2e-3   /* 4x NTP's largest slew */
/* readings before the anchor map back at this fraction of its rate: below any mapping's
 * (rates in force differ by at most the refit tolerance, its calibration term and the
 * 1e-3 slew) */
#define FP_CLOCK_BACK_RATE (1.0 - 1e-2)

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

typedef struct {
    uint64_t tick;   /* middle of the bracket */
    int64_t ns;      /* CLOCK_MONOTONIC read inside it */
    uint64_t width;  /* ticks between the two TSC reads; UINT64_MAX: no good sample */
} fp_clock_sample;

/* the tightest of `tries` (TSC, CLOCK_MONOTONIC, TSC) brackets */
static fp_clock_sample fp_clock_bracket(int tries) {
    fp_clock_sample best = {0, 0, UINT64_MAX};
#if FP_CLOCK_HAVE_TSC
    for (int i = 0; i < tries; i++) {
        const uint64_t a = __rdtsc();
        const int64_t n = fp_mono_ns();
        const uint64_t b = __rdtsc();
        if (b > a && b - a < best.width) {
            best.tick = a + (b - a) / 2;
            best.ns = n;
            best.width = b - a;
        }
    }
#else
    (void)tries;
#endif
    return best;
}

void fp_clock_init(void) {
    if (g_clock_ready) return;
    fp_clock.use_tsc = 0;
#if FP_CLOCK_HAVE_TSC
    if (fp_tsc_invariant()) {
        const fp_clock_sample p0 = fp_clock_bracket(FP_CLOCK_TRIES);
        while (fp_mono_ns() - p0.ns < FP_CLOCK_BASELINE_NS) {}
        const fp_clock_sample p1 = fp_clock_bracket(FP_CLOCK_TRIES);
        if (p0.width != UINT64_MAX && p1.width != UINT64_MAX && p1.tick > p0.tick && p1.ns > p0.ns) {
            const double k = (double)(p1.ns - p0.ns) / (double)(p1.tick - p0.tick);
            fp_clock.ns_per_tick = k;
            fp_clock.map_ns_per_tick = k;
            fp_clock.cal_samples = 2 * FP_CLOCK_TRIES;
            fp_clock.cal_bracket_ns = (double)(p0.width > p1.width ? p0.width : p1.width) * k;
            fp_clock.fit_tick = p0.tick;
            fp_clock.fit_ns = p0.ns;
            fp_clock.base_tick = p1.tick;
            fp_clock.base_ns = p1.ns;
            fp_clock.reanchor_ticks = (uint64_t)((double)FP_CLOCK_REANCHOR_NS / k);
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

__attribute__((noinline, cold)) int fp_clock_reanchor(int force) {
    if (!fp_clock.use_tsc) return 0;
    uint32_t s = __atomic_load_n(&fp_clock.seq, __ATOMIC_RELAXED);
    if (s & 1u) return 0;   /* another thread is publishing */
    const uint64_t old_tick = __atomic_load_n(&fp_clock.base_tick, __ATOMIC_RELAXED);
    const fp_clock_sample p = fp_clock_bracket(FP_CLOCK_REANCHOR_TRIES);
    /* the TSC now reads more than ~1 ms before the anchor it published: it went back */
    const int back = (int64_t)(p.tick - old_tick) < -(int64_t)(fp_clock.reanchor_ticks >> 10);
    /* a preempted sample would make a worse anchor than the one we have: wait for the
     * next chance (a bracket as wide as 2 us against the calibration's tens of ns) */
    if (p.width == UINT64_MAX || (!back && p.tick <= fp_clock.fit_tick)) return 0;
    const double k_fit = fp_clock_slope();
    if ((double)p.width * k_fit > 2000.0 + fp_clock.cal_bracket_ns) return 0;
    if (!force && !back && (int64_t)(p.tick - old_tick) <= (int64_t)fp_clock.reanchor_ticks)
        return 0;
    if (!__atomic_compare_exchange_n(&fp_clock.seq, &s, s + 1u, 0, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED))
        return 0;
    __atomic_thread_fence(__ATOMIC_RELEASE);
    const uint64_t bt = fp_clock.base_tick;
    const int64_t bn = fp_clock.base_ns;
    const double k_map = fp_clock.map_ns_per_tick;
    int published = 0;
    if (bt == old_tick && back) {
        /* The fit's baseline is gone with the old TSC: restart it here at the rate in force
         * (the refit waits for a baseline of FP_CLOCK_BASELINE_NS, then the step test checks
         * it). Readings handed out before the jump were at most CLOCK_MONOTONIC plus the
         * lead the mapping had at its anchor plus what it gained since: nothing at the
         * fitted rate, but up to NTP's slew of CLOCK_MONOTONIC (500 ppm, a quarter of
         * FP_CLOCK_RATE_TOL) over the time since that anchor, at most a period (a reading
         * past it re-anchors first): start there and slew the lead away. */
        double since = (double)(p.ns - (bn - fp_clock.lead_ns));
        if (since < 0.0) since = 0.0;
        if (since > (double)FP_CLOCK_REANCHOR_NS) since = (double)FP_CLOCK_REANCHOR_NS;
        int64_t ns = p.ns + (fp_clock.lead_ns > 0 ? fp_clock.lead_ns : 0) +
                     (int64_t)(since * (FP_CLOCK_RATE_TOL / 4.0));
        if (ns < bn) ns = bn;
        double gap = (double)(ns - p.ns) / (double)FP_CLOCK_REANCHOR_NS;
        if (gap > 1e-3) gap = 1e-3;
        const double km = k_fit * (1.0 - gap);
        fp_clock.fit_tick = p.tick;
        fp_clock.fit_ns = p.ns;
        fp_clock.lead_ns = ns - p.ns;
        __atomic_store_n(&fp_clock.base_tick, p.tick, __ATOMIC_RELAXED);
        __atomic_store_n(&fp_clock.base_ns, ns, __ATOMIC_RELAXED);
        __atomic_store(&fp_clock.map_ns_per_tick, &km, __ATOMIC_RELAXED);
        __atomic_fetch_add(&fp_clock.tsc_backs, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&fp_clock.reanchors, 1, __ATOMIC_RELAXED);
        published = 1;
    } else if (bt == old_tick && p.tick > bt) {
        /* the rate over the whole baseline since calibration: its error shrinks as the
         * baseline grows (two tight brackets over seconds, not 10 ms) */
        double k = (double)(p.ns - fp_clock.fit_ns) / (double)(p.tick - fp_clock.fit_tick);
        /* The tolerance below holds for a baseline of at least the calibration's 10 ms (two
         * brackets' error over it). Only a fit restarted by a TSC that went back is shorter,
         * and a forced re-anchor soon after it refitted over microseconds: a bracket's error
         * over 2 ms passed as a rate 0.1% off (every duration with it), or over less counted a
         * step that never was. Keep the rate until the baseline is long enough. */
        if ((double)(p.tick - fp_clock.fit_tick) * k_fit < (double)FP_CLOCK_BASELINE_NS) k = k_fit;
        /* An invariant TSC's rate against CLOCK_MONOTONIC moves by NTP's slew (<= 500 ppm)
         * plus the fit's own error (two brackets over >= 10 ms): a refit further than that
         * from the rate in force is a step between the two clocks (a VM paused or migrated,
         * a suspend), not a rate. Folded into the rate it read every later duration wrong
         * by the step over the baseline (a 0.3 s step 1 s after import: durations 30% long,
         * and the old 0.5x-2x band let it in). Keep the rate, and take the step out of the
         * fit's first sample so that later refits keep the long baseline without it (a fit
         * restarted here would be a few us long at a forced re-anchor: 0.1% off). */
        const double tol = FP_CLOCK_RATE_TOL + 4.0 * (fp_clock.cal_bracket_ns + 2000.0) /
                                                   (double)FP_CLOCK_BASELINE_NS;
        if (!(k > k_fit * (1.0 - tol) && k < k_fit * (1.0 + tol))) {
            k = k_fit;
            fp_clock.fit_ns = p.ns - (int64_t)((double)(p.tick - fp_clock.fit_tick) * k_fit);
            __atomic_fetch_add(&fp_clock.steps, 1, __ATOMIC_RELAXED);
        }
        const int64_t old_map = bn + (int64_t)((double)(int64_t)(p.tick - bt) * k_map);
        int64_t ns = p.ns;
        double km = k;
        if (old_map > p.ns) {
            /* the old mapping is ahead: start where it is, and map at a slower rate for one
             * period so the gap closes by the next re-anchor (at most 0.1% slower; durations
             * keep the fitted rate) */
            double gap = (double)(old_map - p.ns) / (double)FP_CLOCK_REANCHOR_NS;
            if (gap > 1e-3) gap = 1e-3;
            ns = old_map;
            km = k * (1.0 - gap);
        }
        fp_clock.lead_ns = ns - p.ns;
        __atomic_store_n(&fp_clock.base_tick, p.tick, __ATOMIC_RELAXED);
        __atomic_store_n(&fp_clock.base_ns, ns, __ATOMIC_RELAXED);
        __atomic_store(&fp_clock.map_ns_per_tick, &km, __ATOMIC_RELAXED);
        __atomic_store(&fp_clock.ns_per_tick, &k, __ATOMIC_RELAXED);
        __atomic_fetch_add(&fp_clock.reanchors, 1, __ATOMIC_RELAXED);
        published = 1;
    }
    __atomic_store_n(&fp_clock.seq, s + 2u, __ATOMIC_RELEASE);
    return published;
}

__attribute__((noinline, cold)) int64_t fp_ticks_to_mono_ns_slow(uint64_t t) {
    uint64_t bt = __atomic_load_n(&fp_clock.base_tick, __ATOMIC_RELAXED);
    /* a reading shortly before the anchor (taken before another thread re-anchored) is
     * mapped back from it; a re-anchor only past the period or a TSC that went back */
    if ((int64_t)(t - bt) > (int64_t)fp_clock.reanchor_ticks ||
        (int64_t)(t - bt) < -(int64_t)(fp_clock.reanchor_ticks >> 10))
        fp_clock_reanchor(0);
    int64_t bn;
    double k;
    fp_clock_anchor(&bt, &bn, &k);
    /* A reading past the period of the anchor in force that is also later than the TSC now
     * was read before the TSC went back and is converted after another thread re-anchored
     * on the new TSC (a VM paused or a thread frozen between its read and this call): from
     * the new anchor it would map as far into the future as the TSC went back (hours after a
     * reset on resume), and one such reading as a symbol's last tick made every later step()
     * without ts_ns a refusal for that long. It was read before now: map it as now, which
     * the back re-anchor keeps at or after every reading taken before the jump. */
    if ((int64_t)(t - bt) > (int64_t)fp_clock.reanchor_ticks) {
        const uint64_t now = fp_ticks();
        if ((int64_t)(t - now) > 0) t = now;
    }
    const int64_t d = (int64_t)(t - bt);
    /* A reading before the anchor was read before a re-anchor and converted after it (a
     * thread preempted between its TSC read and this call). An earlier reading of that
     * thread went through an older mapping, whose rate may be slower than this one's by the
     * refit's tolerance and the slew (a few 1e-3): mapped back at this rate, the reading
     * fell behind it by that fraction of the preemption (microseconds, after a few ms
     * preempted), and the engine refuses a step more than 1 us behind its symbol's last one.
     * Mapped back at a rate below any mapping's, it cannot fall behind an older reading; it
     * is early by at most 1% of how far it predates the anchor. */
    if (d < 0) return bn + (int64_t)((double)d * k * FP_CLOCK_BACK_RATE);
    /* a reading past the period maps from the anchor then in force, a fresh one or (not
     * due yet: another thread publishing, a wide bracket) the old one, as before */
    return bn + (int64_t)((double)d * k);
}

const char *fp_clock_source(void) {
    return fp_clock.use_tsc ? "tsc" : "clock_gettime(CLOCK_MONOTONIC)";
}
