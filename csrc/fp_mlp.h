/* fp_mlp.h: the MLP forward pass over a packed, 64-byte-aligned weights arena.
 *
 * Decision: weights are repacked once at load into blocks of 8 output rows
 * (see fp_dense_layer) so the AVX2 kernel reads each weight exactly once with
 * aligned loads, broadcasts one input and keeps 8 outputs per register; any
 * width works, the last block is zero-padded. All layers live in one arena so
 * the whole model is a single contiguous (huge-page friendly) allocation.
 * A small model (fp_mlp.fused) runs on AVX-512 and AVX2 as one call that keeps each layer's
 * outputs in registers as the next layer's inputs: at its size the per-layer call, store and
 * reload are on the critical path, which is what such a model waits on (not the FMA rate).
 */
#ifndef FP_MLP_H
#define FP_MLP_H

#include "fp_simd.h"
#include "fp_lowp.h"

#define FP_MAX_LAYERS 16

/* Reduced-precision weights (FP_WEIGHTS_BF16 / INT8) apply to the hidden layers; the output
 * layer stays fp32: it is a few outputs wide, so it costs nothing to stream, and the signal
 * is read straight from it, so it keeps no quantization error of its own. */
typedef struct {
    int n_layers;
    fp_dense_layer layers[FP_MAX_LAYERS];
    fp_lowp_layer lowp[FP_MAX_LAYERS];  /* used where lowp_on[l] */
    int lowp_on[FP_MAX_LAYERS];
    int weights;           /* FP_WEIGHTS_* asked for */
    const fp_lowp_kernels *lk;          /* the reduced-precision kernels for the engine's set */
    float *arena;          /* owned unless arena_external */
    size_t arena_bytes;
    int arena_external;
    int act_width;         /* widest padded activation, floats (a multiple of 16) */
    int max_width;         /* floats each forward buffer needs: act_width + lowp scratch */
    long long macs;        /* multiply-adds per forward pass (unpadded) */
    int fused;             /* small fp32 model, run in one call on AVX-512 (FP_MLP_FUSED_BYTES) */
    int fused_avx2;        /* how AVX2 runs it: 0 per layer, FP_FUSED_NARROW or FP_FUSED_WIDE */
} fp_mlp;

/* A model runs fused (all layers in one call, activations kept in registers; see
 * fp_mlp_fused_avx512 and fp_mlp_fused_avx2) when it has 2 or more layers, all fp32, each of
 * 1, 2, 4 or 8 blocks of 8 rows (so no layer gives more than 64 inputs to the next), and its
 * weights total at most FP_MLP_FUSED_BYTES: the models whose per-layer call, store and reload
 * are a visible share of the pass. Past that the per-layer pass costs the same.
 * AVX2 (fp_mlp.fused_avx2) has 16 registers, not 32, and an 8-block hidden layer is 8 of them:
 * FP_FUSED_NARROW, hidden layers of at most 4 blocks, runs every fused model of those;
 * FP_FUSED_WIDE, with an 8-block hidden layer, only where every layer after the first is 1 or
 * 8 blocks. An 8-block layer's outputs in 8 registers feeding a 2- or 4-block layer (8
 * accumulators besides) spill on the critical path, and through a local buffer gain nothing,
 * so such a model runs per layer on AVX2. */
#define FP_FUSED_NARROW 1
#define FP_FUSED_WIDE 2
#define FP_MLP_FUSED_BYTES (128u * 1024u)

/* bytes the arena needs for these dims */
size_t fp_mlp_arena_bytes(int n_layers, const int *dims);
size_t fp_mlp_arena_bytes_ex(int n_layers, const int *dims, int weights);

/* Pack row-major weights[l] (dims[l+1] x dims[l]) and biases into `mem`
 * (64-byte aligned, fp_mlp_arena_bytes long) or, when mem is NULL, into a
 * fresh allocation. Returns 0, or -1 when out of memory / bad dims. */
int fp_mlp_init(fp_mlp *m, int n_layers, const int *dims, const int *acts,
                const float *const *weights, const float *const *biases, void *mem);
/* the same with a weight format (FP_WEIGHTS_*) for the hidden layers, run by isa's kernels;
 * -1 as well when isa has no reduced-precision kernels on this CPU */
int fp_mlp_init_ex(fp_mlp *m, int n_layers, const int *dims, const int *acts,
                   const float *const *weights, const float *const *biases, void *mem,
                   int wtype, fp_isa isa);
void fp_mlp_free(fp_mlp *m);

#if FP_HAVE_X86
/* the fused pass of an m->fused model on the AVX-512 set: out in y (nb * 8 floats of the last
 * layer, 64-byte aligned scratch), the same bits as the per-layer pass; NULL on NaN/Inf */
const float *fp_mlp_fused_avx512(const fp_mlp *m, const float *x, float *y);
/* the same on the AVX2 set, for m->fused_avx2 FP_FUSED_NARROW and FP_FUSED_WIDE models */
const float *fp_mlp_fused_avx2(const fp_mlp *m, const float *x, float *y);
const float *fp_mlp_fused_avx2_wide(const fp_mlp *m, const float *x, float *y);
#endif

/* out = mlp(x); a and b are scratch of max_width floats, 64-byte aligned (a reduced-precision
 * layer keeps its quantized input past act_width in its output buffer).
 * Returns a pointer to the last layer's output (a or b), or NULL when a layer's
 * pre-activations are NaN/Inf (the activations would hide it: relu maps NaN to 0, tanh
 * maps Inf to 1), so no finite-looking answer comes out of an overflowed model.
 * reverse: the row-group order for this call (see fp_kernels.dense); callers keep the
 * alternation in their own state, the model is read-only here and may be shared.
 * An m->fused model on the AVX-512 set, an m->fused_avx2 one on the AVX2 set, takes the
 * fused pass (same bits, out in a). */
static inline const float *fp_mlp_forward(const fp_kernels *k, const fp_mlp *m, const float *x,
                                          float *a, float *b, int reverse) {
#if FP_HAVE_X86
    if (m->fused && k == &fp_kernels_avx512) return fp_mlp_fused_avx512(m, x, a);
    if (m->fused_avx2 && k == &fp_kernels_avx2)
        return m->fused_avx2 == FP_FUSED_WIDE ? fp_mlp_fused_avx2_wide(m, x, a)
                                              : fp_mlp_fused_avx2(m, x, a);
#endif
    const float *in = x;
    float *out = a;
    for (int l = 0; l < m->n_layers; l++) {
        if (m->lowp_on[l]) {
            const fp_lowp_layer *L = &m->lowp[l];
            const fp_lowp_dense_fn f = L->wtype == FP_WEIGHTS_BF16 ? m->lk->bf16 : m->lk->int8;
            if (!f(L, in, out, out + m->act_width)) return NULL;
        } else if (!k->dense(&m->layers[l], in, out, reverse)) {
            return NULL;
        }
        in = out;
        out = (out == a) ? b : a;
    }
    return in;
}

#endif
