/* fp_mlp.c: packing row-major dense weights into the blocked arena (fp32 blocks of 8 rows,
 * or the reduced-precision formats of fp_lowp.h for the hidden layers). */
#include "fp_mlp.h"
#include <string.h>

static size_t fp_layer_floats(int in, int out) {
    const size_t nb = (size_t)(out + 7) / 8;
    return FP_ROUND_UP(nb * (size_t)in * 8, 16) + FP_ROUND_UP(nb * 8, 16);
}

/* reduced precision for this layer? every layer but the output one (see fp_mlp) */
static int fp_layer_lowp(int wtype, int l, int n_layers) {
    return wtype != FP_WEIGHTS_FP32 && l < n_layers - 1;
}

size_t fp_mlp_arena_bytes_ex(int n_layers, const int *dims, int weights) {
    size_t bytes = 0;
    for (int l = 0; l < n_layers; l++)
        bytes += fp_layer_lowp(weights, l, n_layers)
                     ? fp_lowp_layer_bytes(weights, dims[l], dims[l + 1])
                     : fp_layer_floats(dims[l], dims[l + 1]) * sizeof(float);
    return FP_ROUND_UP(bytes, FP_ALIGN);
}

size_t fp_mlp_arena_bytes(int n_layers, const int *dims) {
    return fp_mlp_arena_bytes_ex(n_layers, dims, FP_WEIGHTS_FP32);
}

int fp_mlp_init(fp_mlp *m, int n_layers, const int *dims, const int *acts,
                const float *const *weights, const float *const *biases, void *mem) {
    return fp_mlp_init_ex(m, n_layers, dims, acts, weights, biases, mem, FP_WEIGHTS_FP32,
                          FP_ISA_SCALAR);
}

int fp_mlp_init_ex(fp_mlp *m, int n_layers, const int *dims, const int *acts,
                   const float *const *weights, const float *const *biases, void *mem,
                   int wtype, fp_isa isa) {
    memset(m, 0, sizeof(*m));
    if (n_layers < 1 || n_layers > FP_MAX_LAYERS) return -1;
    if (wtype < FP_WEIGHTS_FP32 || wtype > FP_WEIGHTS_INT8) return -1;
    for (int l = 0; l <= n_layers; l++)
        if (dims[l] < 1) return -1;
    if (wtype != FP_WEIGHTS_FP32) {
        m->lk = fp_lowp_for(isa);
        if (!m->lk) return -1;
        for (int l = 0; l < n_layers - 1; l++)
            if (wtype == FP_WEIGHTS_INT8 && dims[l] > FP_LOWP_INT8_MAX_IN) return -1;
    }
    m->weights = wtype;
    m->arena_bytes = fp_mlp_arena_bytes_ex(n_layers, dims, wtype);
    if (mem) {
        if (((uintptr_t)mem) % FP_ALIGN) return -1;
        m->arena = (float *)mem;
        memset(mem, 0, m->arena_bytes);
        m->arena_external = 1;
    } else {
        m->arena = (float *)fp_aligned_alloc(m->arena_bytes);
        if (!m->arena) return -1;
    }
    m->n_layers = n_layers;
    int width = FP_ROUND_UP(dims[0], 8);
    size_t scratch = 0;
    unsigned char *p = (unsigned char *)m->arena;
    for (int l = 0; l < n_layers; l++) {
        const int in = dims[l], out = dims[l + 1], nb = (out + 7) / 8;
        fp_dense_layer *L = &m->layers[l];
        L->in = in; L->out = out; L->nb = nb; L->act = acts[l];
        m->macs += (long long)in * out;
        if (fp_layer_lowp(wtype, l, n_layers)) {
            /* the fp32 view keeps the shape (nb * 8 >= out); its w/bias stay NULL */
            fp_lowp_pack(&m->lowp[l], wtype, in, out, acts[l], weights[l], biases[l], p);
            m->lowp_on[l] = 1;
            L->nb = m->lowp[l].nb * 2;
            p += fp_lowp_layer_bytes(wtype, in, out);
            if (fp_lowp_scratch_floats(in) > scratch) scratch = fp_lowp_scratch_floats(in);
        } else {
            float *w = (float *)p;
            float *bias = w + FP_ROUND_UP((size_t)nb * in * 8, 16);
            for (int o = 0; o < out; o++) {
                const int b = o / 8, r = o % 8;
                const float *src = weights[l] + (size_t)o * in;
                for (int i = 0; i < in; i++) w[((size_t)b * in + i) * 8 + r] = src[i];
                bias[o] = biases[l][o];
            }
            L->w = w;
            L->bias = bias;
            p += fp_layer_floats(in, out) * sizeof(float);
        }
        if (L->nb * 8 > width) width = L->nb * 8;
    }
    m->fused = wtype == FP_WEIGHTS_FP32 && n_layers >= 2 && m->arena_bytes <= FP_MLP_FUSED_BYTES;
    for (int l = 0; l < n_layers; l++) {
        const int nb = m->layers[l].nb;
        if (nb != 1 && nb != 2 && nb != 4 && nb != 8) m->fused = 0;
    }
    /* AVX2's form (see FP_FUSED_WIDE): wide where a hidden layer has 8 blocks, and then only
     * where every layer after the first is 1 or 8 blocks */
    int wide = 0, wide_ok = 1;
    for (int l = 0; l < n_layers; l++) {
        if (l < n_layers - 1 && m->layers[l].nb == 8) wide = 1;
        if (l > 0 && m->layers[l].nb != 1 && m->layers[l].nb != 8) wide_ok = 0;
    }
    m->fused_avx2 = !m->fused ? 0 : !wide ? FP_FUSED_NARROW : wide_ok ? FP_FUSED_WIDE : 0;
    /* scratch past the activations must start 64-byte aligned */
    m->act_width = scratch ? FP_ROUND_UP(width, 16) : width;
    m->max_width = m->act_width + (int)scratch;
    return 0;
}

void fp_mlp_free(fp_mlp *m) {
    if (m->arena && !m->arena_external) fp_aligned_free(m->arena);
    m->arena = NULL;
}
