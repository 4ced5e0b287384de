/* fp_math.h: per-element math shared by the CPU kernels and the CUDA kernel.
 *
 * Decision: one definition of each activation and of the head, marked
 * __host__ __device__ under nvcc, so the CPU tests check the same formulas
 * the GPU runs.
 */
#ifndef FP_MATH_H
#define FP_MATH_H

#include <math.h>

#ifdef __CUDACC__
#define FP_HD __host__ __device__ __forceinline__
#else
#define FP_HD static inline
#endif

/* sigmoid(x) = 1 / (1 + e^-x), written to avoid overflow of e^-x for x << 0 */
FP_HD float fp_sigmoidf(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

/* act(x) for FP_ACT_* (0 identity, 1 relu, 2 tanh, 3 sigmoid) */
FP_HD float fp_actf(float x, int act) {
    switch (act) {
    case 1: return x > 0.0f ? x : 0.0f;
    case 2: return tanhf(x);
    case 3: return fp_sigmoidf(x);
    default: return x;
    }
}

/* head: signal = tanh(out0) in [-1, 1], confidence = sigmoid(out1) in [0, 1] */
FP_HD void fp_head(const float *out, float *signal, float *confidence) {
    *signal = tanhf(out[0]);
    *confidence = fp_sigmoidf(out[1]);
}

/* regression head: signal = tanh(out / scale), confidence = |signal| (how far the
 * prediction is from "no view", on the same scale) */
FP_HD void fp_head_regression(float out, float scale, float *signal, float *confidence) {
    const float s = tanhf(out / scale);
    *signal = s;
    *confidence = fabsf(s);
}

/* How far outside [0, 1] a classifier head's input may be and still count as a probability:
 * float32 rounding of a softmax, a logistic pair or a forest's averaged votes (a sum of
 * thousands of leaf values) stays orders of magnitude inside it; a margin, a decision score or
 * a z-score does not. */
#define FP_PROB_TOL 1e-4f

/* classifier head over probabilities p[0..n): signal = p[up] - p[down] in [-1, 1],
 * confidence = the largest probability (the model's belief in its own answer). Returns 0
 * when an output is not a probability (below -FP_PROB_TOL, above 1 + FP_PROB_TOL, or NaN at
 * p[0]; the caller refuses NaN elsewhere first): margins or scores read as probabilities made
 * signals beyond +-1 and confidences beyond [0, 1], or inside them and meaningless. Within
 * the tolerance the answer is clamped to its range. */
FP_HD int fp_head_classifier(const float *p, int n, int down, int up, float *signal,
                             float *confidence) {
    float m = p[0], lo = p[0];
    for (int i = 1; i < n; i++) {
        m = p[i] > m ? p[i] : m;
        lo = p[i] < lo ? p[i] : lo;
    }
    const float s = p[up] - p[down];
    *signal = s > 1.0f ? 1.0f : s < -1.0f ? -1.0f : s;
    *confidence = m > 1.0f ? 1.0f : m < 0.0f ? 0.0f : m;
    return lo >= -FP_PROB_TOL && m <= 1.0f + FP_PROB_TOL;
}

/* softmax in place, as onnxruntime's Softmax: subtract the max, exp, divide by the sum */
FP_HD void fp_softmaxf(float *x, int n) {
    float m = x[0], s = 0.0f;
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int i = 0; i < n; i++) { x[i] = expf(x[i] - m); s += x[i]; }
    for (int i = 0; i < n; i++) x[i] = x[i] / s;
}

#endif
