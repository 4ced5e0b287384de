/* fp_bench.h: measurements the bench needs from C (not used on the hot path). */
#ifndef FP_BENCH_H
#define FP_BENCH_H
/* ns per 8-lane FMA instruction at full throughput; < 0 where AVX2+FMA is missing */
double fp_fma_ns_per_instr(long iters);
#endif
