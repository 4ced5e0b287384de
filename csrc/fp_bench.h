/* fp_bench.h: measurements the bench needs from C (not used on the hot path). */
#ifndef FP_BENCH_H
#define FP_BENCH_H
#include <stddef.h>
/* ns per 8-lane FMA instruction at full throughput; < 0 where AVX2+FMA is missing */
double fp_fma_ns_per_instr(long iters);
/* ns per 16-lane FMA instruction at full throughput; < 0 where the AVX-512 set cannot run */
double fp_fma512_ns_per_instr(long iters);
/* ns from one op's inputs to its result (latency: one dependent chain of 8 * `iters` ops) on the
 * widest vector set this CPU runs (16 lanes on AVX-512, 8 on AVX2): op 0 = FMA, 1 = add,
 * 2 = multiply, 3 = max; < 0 for another op or without AVX2+FMA */
double fp_op_latency_ns(int op, long iters);
/* fp_op_latency_ns, with the chain's final value (lane 0) in *end: it stays a normal float
 * for any iters (a subnormal would time a microcode assist, not the op) */
double fp_op_latency_probe(int op, long iters, float *end);
/* streaming-read GB/s over a buffer of `bytes`, best of `passes` (past 512 KB each pass also
 * with software prefetch, the faster counting); < 0 on allocation failure */
double fp_read_gbps(size_t bytes, int passes);
/* spin on this core for duration_ns; histogram (40 log2 buckets) of clock gaps above
 * threshold_ns; returns the number of gaps */
long long fp_jitter_probe(long long duration_ns, long long threshold_ns, long long *hist,
                          long long *max_gap_ns, long long *reads);
#endif
