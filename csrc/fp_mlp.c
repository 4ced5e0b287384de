/* fp_mlp.c: packing row-major dense weights into the blocked arena. */
#include "fp_mlp.h"
#include <string.h>

static size_t fp_layer_floats(int in, int out) {
    const size_t nb = (size_t)(out + 7) / 8;
    return FP_ROUND_UP(nb * (size_t)in * 8, 16) + FP_ROUND_UP(nb * 8, 16);
}

size_t fp_mlp_arena_bytes(int n_layers, const int *dims) {
    size_t f = 0;
    for (int l = 0; l < n_layers; l++) f += fp_layer_floats(dims[l], dims[l + 1]);
    return FP_ROUND_UP(f * sizeof(float), FP_ALIGN);
}

int fp_mlp_init(fp_mlp *m, int n_layers, const int *dims, const int *acts,
                const float *const *weights, const float *const *biases, void *mem) {
    memset(m, 0, sizeof(*m));
    if (n_layers < 1 || n_layers > FP_MAX_LAYERS) return -1;
    for (int l = 0; l <= n_layers; l++)
        if (dims[l] < 1) return -1;
    m->arena_bytes = fp_mlp_arena_bytes(n_layers, dims);
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
    m->max_width = FP_ROUND_UP(dims[0], 8);
    float *p = m->arena;
    for (int l = 0; l < n_layers; l++) {
        const int in = dims[l], out = dims[l + 1], nb = (out + 7) / 8;
        fp_dense_layer *L = &m->layers[l];
        L->in = in; L->out = out; L->nb = nb; L->act = acts[l];
        float *w = p;
        float *bias = p + FP_ROUND_UP((size_t)nb * in * 8, 16);
        for (int o = 0; o < out; o++) {
            const int b = o / 8, r = o % 8;
            const float *src = weights[l] + (size_t)o * in;
            for (int i = 0; i < in; i++) w[((size_t)b * in + i) * 8 + r] = src[i];
            bias[o] = biases[l][o];
        }
        L->w = w;
        L->bias = bias;
        p += fp_layer_floats(in, out);
        if (nb * 8 > m->max_width) m->max_width = nb * 8;
        m->macs += (long long)in * out;
    }
    return 0;
}

void fp_mlp_free(fp_mlp *m) {
    if (m->arena && !m->arena_external) fp_aligned_free(m->arena);
    m->arena = NULL;
}
