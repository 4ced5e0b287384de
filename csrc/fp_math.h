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

/* classifier head over probabilities p[0..n): signal = p[up] - p[down] in [-1, 1],
 * confidence = the largest probability (the model's belief in its own answer) */
FP_HD void fp_head_classifier(const float *p, int n, int down, int up, float *signal,
                              float *confidence) {
    float m = p[0];
    for (int i = 1; i < n; i++) m = p[i] > m ? p[i] : m;
    *signal = p[up] - p[down];
    *confidence = m;
}

/* softmax in place, as onnxruntime's Softmax: subtract the max, exp, divide by the sum */
FP_HD void fp_softmaxf(float *x, int n) {
    float m = x[0], s = 0.0f;
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int i = 0; i < n; i++) { x[i] = expf(x[i] - m); s += x[i]; }
    for (int i = 0; i < n; i++) x[i] = x[i] / s;
}

#endif
