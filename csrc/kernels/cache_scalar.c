/* cache_scalar.c: the cache look's dot products and norms without vector instructions, the
 * reference the vector sets' cache kernels are tested against.
 *
 * Decision: the double sums (dot_norm2, dot_norms_f64) run term after term; the float32 sums
 * run in 16 interleaved chains reduced pairwise, the order whose roundings
 * FP_DOTF_ROUNDINGS bounds (fp_simd.h), so a vector twin differs only by summation order.
 */
#include "kernels.h"

/* dot = sum a*b, na2 = sum a*a in double: a product of two floats is exact in double, so
 * the only error is the double sum's (~n * 1e-16 relative), far below any cosine threshold */
void fp_dot_norm2_scalar(const float *a, const float *b, int n, double *dot, double *na2) {
    double d = 0.0, s = 0.0;
    for (int i = 0; i < n; i++) {
        const double x = a[i];
        d += x * (double)b[i];
        s += x * x;
    }
    *dot = d;
    *na2 = s;
}

/* dot = sum a*b, na2 = sum a*a, nb2 = sum b*b in float32: 16 chains (term i in chain i mod 16),
 * then pairwise 16 -> 1, the order FP_DOTF_ROUNDINGS bounds (fp_simd.h) */
void fp_dot_norms_f32_scalar(const float *a, const float *b, int n,
                             float *dot, float *na2, float *nb2) {
    float d[16] = {0}, sa[16] = {0}, sb[16] = {0};
    int i = 0;
    /* a fixed 16-wide body the compiler keeps in registers (SSE2), same chains as the tail */
    for (; i + 16 <= n; i += 16)
        for (int c = 0; c < 16; c++) {
            d[c] += a[i + c] * b[i + c];
            sa[c] += a[i + c] * a[i + c];
            sb[c] += b[i + c] * b[i + c];
        }
    for (int c = 0; i + c < n; c++) {
        d[c] += a[i + c] * b[i + c];
        sa[c] += a[i + c] * a[i + c];
        sb[c] += b[i + c] * b[i + c];
    }
    for (int w = 8; w >= 1; w /= 2)
        for (int c = 0; c < w; c++) {
            d[c] += d[c + w];
            sa[c] += sa[c + w];
            sb[c] += sb[c + w];
        }
    *dot = d[0];
    *na2 = sa[0];
    *nb2 = sb[0];
}

/* dd = sum (a-b)^2, de = sum (a-b)(a+b), na2, nb2 in float32: the chains and reduction of
 * fp_dot_norms_f32_scalar, one difference and one sum rounded per term on top */
void fp_diff_norms_f32_scalar(const float *a, const float *b, int n, float *dd,
                              float *de, float *na2, float *nb2) {
    float d[16] = {0}, e[16] = {0}, sa[16] = {0}, sb[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int c = 0; c < 16; c++) {
            const float x = a[i + c], y = b[i + c], df = x - y;
            d[c] += df * df;
            e[c] += df * (x + y);
            sa[c] += x * x;
            sb[c] += y * y;
        }
    for (int c = 0; i + c < n; c++) {
        const float x = a[i + c], y = b[i + c], df = x - y;
        d[c] += df * df;
        e[c] += df * (x + y);
        sa[c] += x * x;
        sb[c] += y * y;
    }
    for (int w = 8; w >= 1; w /= 2)
        for (int c = 0; c < w; c++) {
            d[c] += d[c + w];
            e[c] += e[c + w];
            sa[c] += sa[c + w];
            sb[c] += sb[c + w];
        }
    *dd = d[0];
    *de = e[0];
    *na2 = sa[0];
    *nb2 = sb[0];
}

/* fp_dot_norm2_scalar's two sums and sum b*b beside them, each in the same order */
void fp_dot_norms_f64_scalar(const float *a, const float *b, int n, double *dot,
                             double *na2, double *nb2) {
    double d = 0.0, s = 0.0, t = 0.0;
    for (int i = 0; i < n; i++) {
        const double x = a[i], y = b[i];
        d += x * y;
        s += x * x;
        t += y * y;
    }
    *dot = d;
    *na2 = s;
    *nb2 = t;
}
