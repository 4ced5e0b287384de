/* log1p_scalar.c: log1p(x) of a batch, bit for bit the C library's on this host, without a
 * call per value: the scalar twin of log1p_avx2.c and log1p_avx512.c.
 *
 * Decision: the live book's fields are tested bit for bit against numpy's adapter run with
 * the C library's log1p, so this is glibc's log1p itself (fdlibm's s_log1p.c, as glibc 2.28+
 * builds it for a CPU with FMA and AVX2: its x86-64 build picks that copy by ifunc, and GCC
 * fused six products into their sums there). Each fusion is an fma() here and nothing else
 * may fuse (fp-contract=off). fp_log1p_libm_fused() checks at run time that the C library
 * is that copy; fp_book.c falls back to libm where it is not. Lanes not in the book's
 * domain (x < 0 beyond 2^-29 in size, or -NaN) go to libm per value.
 */
#pragma GCC optimize("fp-contract=off")
#include "kernels.h"
#include "log1p_consts.h"
#include <math.h>
#include <string.h>

/* log1p(x) for one x, glibc's FMA build: the same paths and the same roundings */
static inline double fp_log1p1(double x) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    const uint64_t ab = bits & 0x7fffffffffffffffULL;
    if (ab < FP_L1P_TINY) return ab < FP_L1P_NEGL ? x : fma(-(x * x), 0.5, x);
    if (bits >> 63) return log1p(x);              /* x <= -2^-29 or -NaN: not the book's */
    if (ab >= 0x7ff0000000000000ULL) return x + x;
    int64_t k = 0, hu = 1;
    double f = x, c = 0.0;
    if (bits >= FP_L1P_K0) {                      /* x >= 0.41422: 1 + x = 2^k (1 + f) */
        double u = bits < FP_L1P_BIG ? 1.0 + x : x;
        uint64_t ub;
        memcpy(&ub, &u, sizeof ub);
        k = (int64_t)(ub >> 52) - 1023;
        if (bits < FP_L1P_BIG) c = (k > 0 ? 1.0 - (u - x) : x - (u - 1.0)) / u;
        hu = (int64_t)((ub >> 32) & 0xfffff);
        uint64_t nb = ub & 0x000fffffffffffffULL;
        if (hu < 0x6a09e) {
            nb |= 0x3ff0000000000000ULL;
        } else {
            k += 1;
            nb |= 0x3fe0000000000000ULL;
            hu = (0x100000 - hu) >> 2;
        }
        memcpy(&u, &nb, sizeof u);
        f = u - 1.0;
    }
    const double hfsq = (0.5 * f) * f, kd = (double)k;
    if (hu == 0) {
        if (f == 0.0) return k == 0 ? 0.0 : fma(kd, FP_L1P_LN2_HI, fma(kd, FP_L1P_LN2_LO, c));
        const double R = fma(-f, FP_L1P_TWO3, 1.0) * hfsq;
        if (k == 0) return f - R;
        return fma(kd, FP_L1P_LN2_HI, -((R - fma(kd, FP_L1P_LN2_LO, c)) - f));
    }
    const double s = f / (2.0 + f), z = s * s;
    const double z2 = z * z, z4 = z2 * z2, z6 = z2 * z4;
    const double R2 = fma(z, FP_L1P_LP3, FP_L1P_LP2), R3 = fma(z, FP_L1P_LP5, FP_L1P_LP4);
    const double R4 = fma(z, FP_L1P_LP7, FP_L1P_LP6);
    double R = fma(z, FP_L1P_LP1, z2 * R2);
    R = fma(z4, R3, R);
    R = fma(z6, R4, R);
    const double w = s * (hfsq + R);
    if (k == 0) return f - (hfsq - w);
    return fma(kd, FP_L1P_LN2_HI, -((hfsq - (fma(kd, FP_L1P_LN2_LO, c) + w)) - f));
}

/* y[i] = log1p(x[i]), i < n */
void fp_log1p_scalar(const double *x, double *y, int n) {
    for (int i = 0; i < n; i++) y[i] = fp_log1p1(x[i]);
}

/* inputs whose log1p differs by an ulp between glibc's FMA build and its plain one (an
 * unfused build of the same code): the probe's witnesses that the FMA build is the one here */
static const double fp_log1p_witness[] = {
    0x1.079561a7488fep-1, 0x1.1a0446486f41bp-2, 0x1.2e53de45da7dp-1, 0x1.6413f5e9b2698p-3,
    0x1.30739132da626p+13, 0x1.49226c4992e0fp+9, 0x1.6a2dp+17, 0x1.4f3a8p+17,
    0x1.6d606a48p+29, 0x1.97f5eefp+28, 0x1.29931d539fad1p+39, 0x1.61514ae39e2cp+38,
};

/* libm's log1p through a pointer the compiler cannot see through: on a constant argument
 * GCC would otherwise fold log1p(x) to the correctly rounded value at compile time */
static double (*volatile fp_libm_log1p)(double) = log1p;

static int fp_log1p_same(double x) {
    const double a = fp_libm_log1p(x), b = fp_log1p1(x);
    return !memcmp(&a, &b, sizeof a);
}

int fp_log1p_libm_fused(void) {
    for (size_t i = 0; i < sizeof fp_log1p_witness / sizeof fp_log1p_witness[0]; i++)
        if (!fp_log1p_same(fp_log1p_witness[i])) return 0;
    for (int i = 0; i < FP_L1P_NPROBE; i++)
        if (!fp_log1p_same(fp_log1p_probe(i))) return 0;
    return 1;
}
