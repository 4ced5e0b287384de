/* log1p_consts.h: the constants and input bounds of fdlibm's log1p (s_log1p.c, as glibc
 * builds it), shared by the log1p kernel of every set, and the probe values that tell
 * whether the C library's log1p is that build (log1p_scalar.c). */
#ifndef FP_LOG1P_CONSTS_H
#define FP_LOG1P_CONSTS_H

#include <stdint.h>

/* bounds on the bits of |x| (high word << 32): below NEGL log1p(x) is x, below TINY
 * x - x*x/2, below K0 (0.41422) f = x with k = 0, from BIG (2^53) on 1 + x is x */
#define FP_L1P_NEGL 0x3c90000000000000ULL
#define FP_L1P_TINY 0x3e20000000000000ULL
#define FP_L1P_K0 0x3fda827a00000000ULL
#define FP_L1P_BIG 0x4340000000000000ULL

#define FP_L1P_LN2_HI 0x1.62e42fee00000p-1  /* ln 2, its high part (k * it is exact for |k| < 2000) */
#define FP_L1P_LN2_LO 0x1.a39ef35793c76p-33  /* and the rest */
#define FP_L1P_TWO3 0x1.5555555555555p-1  /* 2/3, the |f| < 2^-20 path's */
#define FP_L1P_LP1 0x1.5555555555593p-1
#define FP_L1P_LP2 0x1.999999997fa04p-2
#define FP_L1P_LP3 0x1.2492494229359p-2
#define FP_L1P_LP4 0x1.c71c51d8e78afp-3
#define FP_L1P_LP5 0x1.7466496cb03dep-3
#define FP_L1P_LP6 0x1.39a09d078c69fp-3
#define FP_L1P_LP7 0x1.2f112df3e5244p-3
/* Lp1..Lp7: log(1+f) = f - (hfsq - s (hfsq + R(s^2))), s = f / (2 + f) */

/* the probe: FP_L1P_NPROBE inputs spread over every path (sizes, depths, fractions, times) */
#define FP_L1P_NPROBE 4096
static inline double fp_log1p_probe(int i) {
    const uint64_t h = (uint64_t)i * 0x9e3779b97f4a7c15ULL;
    const double frac = (double)(h >> 11) * 0x1p-53;                /* [0, 1) */
    switch (i & 3) {
    case 0: return frac * 0.5;                                     /* k = 0 */
    case 1: return frac * 1e4;                                     /* sizes */
    case 2: return (double)(h >> 40) + frac;                       /* depths, whole or not */
    default: return frac * 0x1p-28;                                /* near the tiny paths */
    }
}

#endif
