/* fp_engine.c: engine construction and the per-tick stages (see fp_engine.h). */
#include "fp_engine.h"
#include "fp_math.h"
#include <math.h>
#include <string.h>

/* a copy with FP_SLACK floats of zeroed slack after it */
static void *fp_copy_aligned(const void *src, size_t bytes) {
    void *p = fp_aligned_alloc(bytes + FP_SLACK * sizeof(float));
    if (p && bytes) memcpy(p, src, bytes);
    return p;
}

void fp_engine_free(fp_engine *e) {
    if (!e) return;
    fp_mlp_free(&e->mlp);
    fp_trees_free(&e->trees);
    fp_aligned_free(e->fs.z_idx);
    fp_aligned_free(e->fs.w_idx);
    fp_aligned_free(e->fs.runs);
    fp_aligned_free(e->fs.zsteps);
    fp_aligned_free(e->fs.mean);
    fp_aligned_free(e->fs.inv_std);
    fp_aligned_free(e->fs.w_thr);
    fp_aligned_free(e->fs.in_off);
    fp_aligned_free(e->fs.in_scale);
    if (!e->state_external) {
        fp_aligned_free(e->slots);
        fp_aligned_free(e->wins);
    }
    fp_aligned_free(e->pre);
    fp_aligned_free(e->feat);
    fp_aligned_free(e->buf_a);
    fp_aligned_free(e->buf_b);
    fp_aligned_free(e->out);
    fp_aligned_free(e->xin);
    fp_aligned_free(e->ts_scratch);
    fp_aligned_free(e->undo);
    fp_aligned_free(e->lat);
    if (e->books) {
        for (int i = 0; i < e->n_symbols; i++) fp_book_free(e->books[i]);
        fp_aligned_free(e->books);
    }
    fp_aligned_free(e);
}

void fp_engine_sizes(const fp_engine_params *p, size_t *weights, size_t *state) {
    fp_feature_spec fs;
    memset(&fs, 0, sizeof(fs));
    fs.n_w = p->n_w;
    fs.window = p->n_w > 0 ? p->window : 1;
    *weights = p->model_kind == FP_MODEL_TREES ? fp_trees_arena_bytes(p->trees)
                                               : fp_mlp_arena_bytes_ex(p->n_layers, p->dims, p->weight_type);
    *state = (fp_slot_stride(p->n_z + 2 * p->n_w) + fp_window_stride(&fs)) * (size_t)p->n_symbols;
}

/* The shape checks of fp_engine_create that need no allocation: sizes, indices, the head,
 * the post-processing and the activations. Returns the engine's output count, -1 when p is
 * refused. */
static int fp_params_n_out(const fp_engine_params *p, int n_feat, int trees) {
    if (trees && (!p->trees || p->trees->n_feat != n_feat || p->post != FP_POST_NONE))
        return -1;
    if (p->raw_len < 1 || p->n_z < 0 || p->n_w < 0 || n_feat < 1 || p->n_symbols < 1 ||
        (p->n_w > 0 && p->window < 1) ||
        (!trees && (p->n_layers < 1 || p->n_layers > FP_MAX_LAYERS || p->dims[0] != n_feat ||
                    p->dims[p->n_layers] < 1)) ||
        p->lat_capacity < 1 || (p->lat_capacity & (p->lat_capacity - 1)))
        return -1;
    const int width = trees ? p->trees->n_targets : p->dims[p->n_layers];
    if (p->post < FP_POST_NONE || p->post > FP_POST_LOGISTIC2 || (p->post == FP_POST_LOGISTIC2 && width != 1))
        return -1;
    const int n_out = p->post == FP_POST_LOGISTIC2 ? 2 : width;
    /* the head's indices must be distinct outputs: a wrong index would read past the model,
     * and a zeroed params struct (head_idx {0, 0}) must be refused, not read as
     * tanh(out0) / sigmoid(out0) */
    if (p->head == FP_HEAD_TANH_SIGMOID) {
        if (n_out < 2 || p->head_idx[0] < 0 || p->head_idx[0] >= n_out || p->head_idx[1] < 0 ||
            p->head_idx[1] >= n_out || p->head_idx[0] == p->head_idx[1]) return -1;
    } else if (p->head == FP_HEAD_REGRESSION) {
        if (p->head_idx[0] < 0 || p->head_idx[0] >= n_out || !(p->head_scale > 0.0f) ||
            !isfinite(p->head_scale)) return -1;
    } else if (p->head == FP_HEAD_CLASSIFIER) {
        if (n_out < 2 || p->head_idx[0] < 0 || p->head_idx[0] >= n_out || p->head_idx[2] < 0 ||
            p->head_idx[2] >= n_out || p->head_idx[1] < -1 || p->head_idx[1] >= n_out ||
            p->head_idx[0] == p->head_idx[2]) return -1;
    } else {
        return -1;
    }
    for (int i = 0; i < p->n_z; i++)
        if (p->z_idx[i] < 0 || p->z_idx[i] >= p->raw_len) return -1;
    for (int i = 0; i < p->n_w; i++)
        if (p->w_idx[i] < 0 || p->w_idx[i] >= p->raw_len) return -1;
    for (int l = 0; !trees && l < p->n_layers; l++)
        if (p->acts[l] < FP_ACT_IDENTITY || p->acts[l] > FP_ACT_SIGMOID) return -1;
    return n_out;
}

fp_engine *fp_engine_create(const fp_engine_params *p, int *err) {
    *err = FP_ERR_PARAM;
    const int n_feat = p->n_z + 2 * p->n_w;
    const int trees = p->model_kind == FP_MODEL_TREES;
    if (p->model_kind != FP_MODEL_MLP && !trees) return NULL;
    const int n_out = fp_params_n_out(p, n_feat, trees);
    if (n_out < 0) return NULL;
    const fp_kernels *k = fp_kernels_for(p->isa);
    if (!k) return NULL;
    if (p->weight_type < FP_WEIGHTS_FP32 || p->weight_type > FP_WEIGHTS_INT8 ||
        (p->weight_type != FP_WEIGHTS_FP32 && !fp_lowp_for(p->isa)))
        return NULL;
    const fp_trees_eval_fn tev = trees ? fp_trees_eval_for(p->isa) : NULL;
    if (trees && !tev) return NULL;

    *err = FP_ERR_NOMEM;
    fp_engine *e = (fp_engine *)fp_aligned_alloc(sizeof(fp_engine));
    if (!e) return NULL;
    e->k = k;
    e->isa = p->isa;
    e->policy = p->policy;
    fp_cache_plan_init(&e->cache_plan, &p->policy, n_feat);
    e->n_symbols = p->n_symbols;
    e->n_out = n_out;
    e->post = p->post;
    e->head = p->head;
    e->head_scale = p->head_scale;
    e->stage_times = 1;
    memcpy(e->head_idx, p->head_idx, sizeof(e->head_idx));
    fp_feature_spec *fs = &e->fs;
    fs->raw_len = p->raw_len; fs->n_z = p->n_z; fs->n_w = p->n_w;
    fs->window = p->n_w > 0 ? p->window : 1;
    fs->inv_window = 1.0 / (double)fs->window;
    fs->n_feat = n_feat;
    fs->z_idx = (int32_t *)fp_copy_aligned(p->z_idx, sizeof(int32_t) * p->n_z);
    fs->w_idx = (int32_t *)fp_copy_aligned(p->w_idx, sizeof(int32_t) * p->n_w);
    fs->mean = (float *)fp_copy_aligned(p->mean, sizeof(float) * n_feat);
    fs->inv_std = (float *)fp_copy_aligned(p->inv_std, sizeof(float) * n_feat);
    const int scaled = p->in_offset != NULL && p->in_scale != NULL;
    fs->in_off = scaled ? (float *)fp_copy_aligned(p->in_offset, sizeof(float) * n_feat) : NULL;
    fs->in_scale = scaled ? (float *)fp_copy_aligned(p->in_scale, sizeof(float) * n_feat) : NULL;
    fs->w_thr = (double *)fp_aligned_alloc(sizeof(double) * (size_t)(p->n_w + 1));
    if (fs->w_thr && fs->inv_std) fp_window_thresholds(fs, fs->w_thr);
    fs->runs = (int32_t *)fp_aligned_alloc(sizeof(int32_t) * 3 * (size_t)(p->n_z + 1));
    if (fs->runs) {
        fs->n_runs = fp_feature_runs(p->z_idx, p->n_z, fs->runs);
        /* runs pay off once they average 4+ fields, except on AVX-512: its runs kernel ends
         * each run with a masked 512-bit store, slow on AMD, where gathers or the permute
         * plan win; both paths compute the same (x - mean) * inv_std per field */
        if (fs->n_runs * 4 > p->n_z || p->isa == FP_ISA_AVX512) fs->n_runs = 0;
    }
    /* AVX-512: the z-scores through a permute plan, any z_idx: a step is two loads and a
     * permute, where a 16-lane gather is microcoded */
    const int n_zsteps_max = ((p->n_z + 15) / 16) * ((p->raw_len + 31) / 32);
    const int want_plan = p->isa == FP_ISA_AVX512 && p->n_z > 0;
    if (want_plan) {
        fs->zsteps = (fp_zstep *)fp_aligned_alloc(sizeof(fp_zstep) * (size_t)n_zsteps_max);
        if (fs->zsteps) fs->n_zsteps = fp_zperm_build(p->z_idx, p->n_z, p->raw_len, fs->zsteps);
    }
    e->model_kind = p->model_kind;
    if (trees) {
        const int rc = fp_trees_init(&e->trees, p->trees, p->arena_mem);
        if (rc) {
            *err = rc == -2 ? FP_ERR_NOMEM : FP_ERR_PARAM;
            fp_engine_free(e);
            return NULL;
        }
        e->trees_eval = tev;
        fp_trees_choose(&e->trees, tev);
    } else if (fp_mlp_init_ex(&e->mlp, p->n_layers, p->dims, p->acts, p->weights, p->biases, p->arena_mem,
                              p->weight_type, p->isa)) {
        e->mlp.arena = NULL;
        fp_engine_free(e);
        return NULL;
    }
    e->slot_stride = fp_slot_stride(n_feat);
    e->win_stride = fp_window_stride(fs);
    if (p->state_mem) {
        if ((uintptr_t)p->state_mem % FP_ALIGN) { *err = FP_ERR_PARAM; fp_engine_free(e); return NULL; }
        e->state_external = 1;
        e->slots = (unsigned char *)p->state_mem;
        e->wins = e->slots + e->slot_stride * p->n_symbols;
        memset(e->slots, 0, (e->slot_stride + e->win_stride) * p->n_symbols);
    } else {
        e->slots = (unsigned char *)fp_aligned_alloc(e->slot_stride * p->n_symbols);
        e->wins = (unsigned char *)fp_aligned_alloc(e->win_stride * p->n_symbols);
    }
    const size_t w = FP_ROUND_UP((size_t)(n_feat > e->mlp.max_width ? n_feat : e->mlp.max_width), 16) + FP_SLACK;
    e->pre = (float *)fp_aligned_alloc(sizeof(float) * w);
    e->feat = (float *)fp_aligned_alloc(sizeof(float) * w);
    e->buf_a = (float *)fp_aligned_alloc(sizeof(float) * w);
    e->buf_b = (float *)fp_aligned_alloc(sizeof(float) * w);
    e->out = (float *)fp_aligned_alloc(sizeof(float) * (FP_ROUND_UP((size_t)n_out, 16) + FP_SLACK));
    e->xin = (float *)fp_aligned_alloc(sizeof(float) * w);
    e->ts_scratch = (int64_t *)fp_aligned_alloc(sizeof(int64_t) * p->n_symbols);
    e->undo = (unsigned char *)fp_aligned_alloc(fp_window_undo_bytes(fs));
    e->lat = (fp_lat *)fp_aligned_alloc(sizeof(fp_lat) * (size_t)p->lat_capacity);
    e->lat_mask = (uint64_t)p->lat_capacity - 1;
    e->books = (fp_book **)fp_aligned_alloc(sizeof(fp_book *) * (size_t)p->n_symbols);
    if (e->books) memset(e->books, 0, sizeof(fp_book *) * (size_t)p->n_symbols);
    if (!fs->z_idx || !fs->w_idx || !fs->mean || !fs->inv_std || !fs->w_thr || !fs->runs ||
        (scaled && (!fs->in_off || !fs->in_scale)) ||
        (want_plan && !fs->zsteps) || !e->slots || !e->wins || !e->pre ||
        !e->feat || !e->buf_a || !e->buf_b || !e->out || !e->xin || !e->ts_scratch || !e->undo || !e->lat ||
        !e->books) {
        fp_engine_free(e);
        return NULL;
    }
    fp_clock_init();
    *err = FP_OK;
    return e;
}

void fp_engine_reset_symbol(fp_engine *e, int32_t symbol) {
    if (symbol < 0 || symbol >= e->n_symbols) return;
    memset(e->slots + e->slot_stride * (size_t)symbol, 0, e->slot_stride);
    memset(e->wins + e->win_stride * (size_t)symbol, 0, e->win_stride);
    if (e->books[symbol]) fp_book_clear(e->books[symbol]);
}

void fp_engine_reset(fp_engine *e) {
    memset(e->slots, 0, e->slot_stride * e->n_symbols);
    memset(e->wins, 0, e->win_stride * e->n_symbols);
    e->ticks = e->hits = e->misses = 0;
    memset(e->miss_reason, 0, sizeof(e->miss_reason));
    memset(e->lat, 0, sizeof(fp_lat) * (e->lat_mask + 1));
    for (int i = 0; i < e->n_symbols; i++)
        if (e->books[i]) fp_book_clear(e->books[i]);
}

/* ns into a uint32 record, saturating (a 4.3 s stall records as 4.3 s, not as a wrap) */
static inline uint32_t fp_sat32(int64_t ns) {
    return ns <= 0 ? 0u : ns >= (int64_t)UINT32_MAX ? UINT32_MAX : (uint32_t)ns;
}

static inline fp_slot *fp_slot_at(fp_engine *e, int32_t s) {
    return (fp_slot *)(e->slots + e->slot_stride * (size_t)s);
}

static inline unsigned char *fp_win_at(fp_engine *e, int32_t s) {
    return e->wins + e->win_stride * (size_t)s;
}

void fp_engine_set_stage_times(fp_engine *e, int on) { e->stage_times = on ? 1 : 0; }
int fp_engine_stage_times(const fp_engine *e) { return e->stage_times; }

/* fp_step_begin's work; early: commit the tick's window before the lookup, keeping an undo
 * record (fp_step's path: it restores the record when the tick is refused). Always inlined,
 * so the compiler jumps from the lookup's last comparison straight into fp_step's hit code:
 * as a call (GCC's choice for a large function used twice) the verdict goes back through
 * p->reason in memory, and a rare hit mispredicts a second branch on it. */
static inline __attribute__((always_inline)) int fp_begin_impl(fp_engine *e, const float *raw,
                                                               int32_t symbol, int64_t ts_ns,
                                                               fp_pending *p, const int early) {
    p->t0 = fp_ticks();
    if (symbol < 0 || symbol >= e->n_symbols) return FP_ERR_SYMBOL;
    /* The features first, into scratch (no state changes before every check passed): they
     * say whether raw is all finite, which the z-score permute plan checks as it loads raw
     * instead of a pass of allfinite of its own. A finite raw can still overflow
     * (x - mean) * inv_std or the window's stats. No pass over the features checks that
     * here: loading them right after the feature kernels' overlapping stores stalls store
     * forwarding. Instead
     * the lookup treats a non-finite |f|^2 as a miss and the model refuses the tick: every
     * dense row sums w * x over all inputs, and 0 * Inf and w * NaN are NaN, so the first
     * layer's finiteness flag sees any bad feature; fp_step_finish names the cause. */
    if (!fp_features_compute(e->k, &e->fs, fp_win_at(e, symbol), raw, e->feat))
        return FP_ERR_NONFINITE_INPUT;
    fp_slot *s = fp_slot_at(e, symbol);
    int64_t now = ts_ns >= 0 ? ts_ns : fp_ticks_to_mono_ns(p->t0);
    if (now < s->last_ns) {
        /* the engine clock is monotonic up to a re-anchor's rounding (fp_clock.h): that is
         * clock noise, not a tick out of order */
        if (ts_ns >= 0 || s->last_ns - now > FP_CLOCK_SLACK_NS) return FP_ERR_TIME_BACKWARDS;
        now = s->last_ns;
    }
    p->raw = raw;
    p->symbol = symbol;
    p->now = now;
    if (early) {
        /* fp_step: the tick's window committed now, before the cache decides (a hit, the
         * branch rarely taken, then has less work behind the decision), with the undo record
         * fp_finish_impl restores when the model refuses the tick; timed with the features
         * (on begin/finish the commit is at the end, with the store) */
        fp_window_commit(e->k, &e->fs, fp_win_at(e, symbol), raw, e->undo);
    }
    /* without stage times only t0 and the end are read (fp_step_finish) */
    const int st = e->stage_times;
    p->t1 = st ? fp_ticks() : p->t0;
    p->reason = fp_cache_lookup_plan(e->k, &e->cache_plan, s, e->feat, e->fs.n_feat, now, &p->norm);
    /* The clock is read here only after a lookup that compared vectors and missed (a read
     * costs about a tenth of a hit). A hit's lookup and store are one stage, timed
     * from t1 to the end; a lookup refused by a flag or a counter (cache off, cold slot,
     * age, run: a few loads and compares, ~1 ns) is counted into the inference after it. */
    p->t2 = (st && (p->reason == FP_MISS_COSINE || p->reason == FP_MISS_NORM)) ? fp_ticks() : p->t1;
    return FP_OK;
}

int fp_step_begin(fp_engine *e, const float *raw, int32_t symbol, int64_t ts_ns, fp_pending *p) {
    return fp_begin_impl(e, raw, symbol, ts_ns, p, 0);
}

/* the model on x: the MLP, then the post transform into e->out (NULL: a layer overflowed);
 * a tree ensemble maps any feature to a finite leaf, so a NaN/Inf feature (an overflowed
 * z-score) is refused here instead of being read as a missing value */
/* the last layer's outputs -> the model's outputs (e->out), or y itself without a post
 * transform; the CPU model stage and a GPU backend's tick both go through here */
const float *fp_post_apply(fp_engine *e, const float *y) {
    if (e->post == FP_POST_NONE) return y;
    float *o = e->out;
    if (e->post == FP_POST_SOFTMAX) {
        memcpy(o, y, sizeof(float) * e->n_out);
        fp_softmaxf(o, e->n_out);
    } else {                                  /* FP_POST_LOGISTIC2, as skl2onnx writes it */
        const float p1 = fp_sigmoidf(y[0]);
        o[0] = 1.0f - p1;
        o[1] = p1;
    }
    return o;
}

/* One fp32 layer (fp_dense_layer's blocked layout) with its sums in double: products of two
 * floats are exact and no sum of them leaves double's range, so this is the pre-activation
 * to a few double roundings, whatever order a kernel set sums in. 0 when one is not finite
 * as a float32 (or x holds a NaN/Inf). */
static int fp_dense_f64(const fp_dense_layer *L, const float *x, float *y) {
    int ok = 1;
    for (int b = 0; b < L->nb; b++) {
        const float *wb = L->w + (size_t)b * L->in * 8;
        for (int r = 0; r < 8; r++) {
            double acc = L->bias[b * 8 + r];
            for (int i = 0; i < L->in; i++) acc += (double)wb[(size_t)i * 8 + r] * x[i];
            const float v = (float)acc;
            ok &= isfinite(v) != 0;
            y[b * 8 + r] = fp_actf(v, L->act);
        }
    }
    return ok;
}

/* fp_dense_f64 over a bf16 layer (fp_lowp_layer's blocks of 16 rows, input pairs) */
static int fp_lowp_bf16_f64(const fp_lowp_layer *L, const float *x, float *y) {
    const uint16_t *w = (const uint16_t *)L->w;
    int ok = 1;
    for (int b = 0; b < L->nb; b++)
        for (int r = 0; r < FP_LOWP_ROWS; r++) {
            double acc = L->bias[b * FP_LOWP_ROWS + r];
            for (int i = 0; i < L->in; i++) {
                const size_t at = (((size_t)b * L->ng + i / 2) * FP_LOWP_ROWS + r) * 2 + i % 2;
                union { uint32_t u; float f; } c = {(uint32_t)w[at] << 16};
                acc += (double)c.f * x[i];
            }
            const float v = (float)acc;
            ok &= isfinite(v) != 0;
            y[b * FP_LOWP_ROWS + r] = fp_actf(v, L->act);
        }
    return ok;
}

/* The MLP on x, refused only where a layer's pre-activation itself leaves float32's range.
 * Each set sums a row in its own order (scalar input by input, AVX2 in chains, AVX-512 in
 * even/odd halves and chains), and terms near FLT_MAX overflow a partial sum in one order and
 * not in another, so the sets would refuse different ticks. So a pass that overflowed runs again layer by layer, and a layer whose
 * float32 sums overflow is summed in double (fp_dense_f64), the same decision on every set.
 * A pass that did not overflow stands: its exact sums can then be past the range only by
 * its own rounding error (the band within ~n 2^-24 of FLT_MAX where rounding decides, on any
 * set). An int8 layer (the same integers and scalings on every set) is redone the same way,
 * for its scalings' own overflow: fp_lowp_int8_exact sums s_w q_i x_i against x as it is,
 * where the kernels' scale product s1 s_w (x's step times the row's) can overflow on its own
 * (a row with one weight near FLT_MAX under an input past ~16k made it Inf, and a dot of 0
 * then NaN, for a pre-activation far inside the range). Only refused passes pay for this: the
 * redo is out of line, off the hot path. */
__attribute__((noinline, cold)) static const float *fp_mlp_redo(fp_engine *e, const float *x) {
    const fp_mlp *m = &e->mlp;
    const int rev = (int)e->mlp_parity;
    const float *in = x;
    float *out = e->buf_a;
    for (int l = 0; l < m->n_layers; l++) {
        if (m->lowp_on[l]) {
            const fp_lowp_layer *L = &m->lowp[l];
            if (L->wtype == FP_WEIGHTS_BF16) {
                if (!m->lk->bf16(L, in, out, out + m->act_width) && !fp_lowp_bf16_f64(L, in, out))
                    return NULL;
            } else if (!m->lk->int8(L, in, out, out + m->act_width) &&
                       !fp_lowp_int8_exact(L, in, out)) {
                return NULL;
            }
        } else if (!e->k->dense(&m->layers[l], in, out, rev) &&
                   !fp_dense_f64(&m->layers[l], in, out)) {
            return NULL;
        }
        in = out;
        out = (out == e->buf_a) ? e->buf_b : e->buf_a;
    }
    return in;
}

static inline const float *fp_mlp_forward_exact(fp_engine *e, const float *x) {
    const float *y = fp_mlp_forward(e->k, &e->mlp, x, e->buf_a, e->buf_b, (int)e->mlp_parity);
    return __builtin_expect(y != NULL, 1) ? y : fp_mlp_redo(e, x);
}

static inline const float *fp_model_eval(fp_engine *e, const float *x) {
    if (e->model_kind == FP_MODEL_TREES) {
        if (!e->k->allfinite(x, e->fs.n_feat)) return NULL;
        e->trees_eval(&e->trees, x, e->out);
        return e->out;
    }
    e->mlp_parity ^= 1u;
    const float *y = fp_mlp_forward_exact(e, x);
    return y ? fp_post_apply(e, y) : NULL;
}

const float *fp_infer_cpu(fp_engine *e) { return fp_model_eval(e, e->feat); }

int fp_predict(fp_engine *e, const float *x, float *out) {
    /* a private copy: the kernels may read the slack past n_feat, the caller's array has none */
    memcpy(e->xin, x, sizeof(float) * e->fs.n_feat);
    if (e->model_kind == FP_MODEL_TREES) {
        /* here a NaN feature is a missing value, as the ONNX spec reads it */
        e->trees_eval(&e->trees, e->xin, out);
        return e->k->allfinite(out, e->n_out) ? FP_OK : FP_ERR_NONFINITE_OUTPUT;
    }
    const float *y = fp_model_eval(e, e->xin);
    if (!y) {
        /* the overflowed layer's values are in the scratch; report them all as non-finite */
        for (int i = 0; i < e->n_out; i++) out[i] = NAN;
        return FP_ERR_NONFINITE_OUTPUT;
    }
    memcpy(out, y, sizeof(float) * e->n_out);
    return e->k->allfinite(out, e->n_out) ? FP_OK : FP_ERR_NONFINITE_OUTPUT;
}

/* outputs -> (signal, confidence) by the engine's head; 0 when a classifier head's outputs
 * are not probabilities (fp_head_classifier) */
static inline int fp_apply_head(const fp_engine *e, const float *out, float *sig, float *conf) {
    if (e->head == FP_HEAD_TANH_SIGMOID) {
        if (e->head_idx[0] == 0 && e->head_idx[1] == 1) {
            e->k->head(out, sig, conf);
        } else {
            const float o2[2] = {out[e->head_idx[0]], out[e->head_idx[1]]};
            e->k->head(o2, sig, conf);
        }
    } else if (e->head == FP_HEAD_REGRESSION) {
        fp_head_regression(out[e->head_idx[0]], e->head_scale, sig, conf);
    } else {
        return fp_head_classifier(out, e->n_out, e->head_idx[0], e->head_idx[2], sig, conf);
    }
    return 1;
}

/* a tick the classifier head refused: its outputs kept in e->out (the MLP's scratch or a
 * caller's array otherwise) for the caller to name them; cold, off the hot path */
__attribute__((noinline, cold)) static int fp_refuse_not_probability(fp_engine *e,
                                                                      const float *out2) {
    if (out2 != e->out) memmove(e->out, out2, sizeof(float) * e->n_out);
    return FP_ERR_NOT_PROBABILITY;
}

/* fp_step_finish's work; committed: fp_begin_impl committed the window early (restored here
 * when the tick is refused, not committed again when it is applied) */
static inline int fp_finish_impl(fp_engine *e, fp_pending *p, const float *out2,
                                 int64_t extern_infer_ns, fp_result *r, const int committed) {
    fp_slot *s = fp_slot_at(e, p->symbol);
    /* t3: end of inference, head included. On a hit nothing ran since t2: one clock read
     * saved. An external backend's time comes in extern_infer_ns, the head's is added. */
    const int st = e->stage_times;
    uint64_t t3 = p->t2, th = p->t2;
    if (p->reason == FP_HIT) {
        r->signal = s->signal;
        r->confidence = s->confidence;
        r->cached = 1;
        s->run++;
        e->hits++;
    } else {
        /* refused before anything is written (no slot, no counter) and, where fp_step
         * committed the window early, with the window restored from its undo record */
        if (!out2 || !e->k->allfinite(out2, e->n_out)) {
            if (committed) fp_window_restore(&e->fs, fp_win_at(e, p->symbol), e->undo);
            return e->k->allfinite(e->feat, e->fs.n_feat) ? FP_ERR_NONFINITE_OUTPUT
                                                           : FP_ERR_NONFINITE_FEATURE;
        }
        if (st && extern_infer_ns >= 0) th = fp_ticks();
        float sig, conf;
        const int probs = fp_apply_head(e, out2, &sig, &conf);
        if (st) t3 = fp_ticks();
        if (__builtin_expect(!probs, 0)) {
            if (committed) fp_window_restore(&e->fs, fp_win_at(e, p->symbol), e->undo);
            return fp_refuse_not_probability(e, out2);
        }
        if (!(sig == sig) || !(conf == conf)) {
            if (committed) fp_window_restore(&e->fs, fp_win_at(e, p->symbol), e->undo);
            return FP_ERR_NONFINITE_OUTPUT;
        }
        if (e->policy.enabled) {
            /* the key and |key| in double when the lookup's double path computed it (else
             * unknown: the float32 look sums |cached| itself, and the double path computes it
             * once when it needs it) */
            memcpy(fp_slot_features(s), e->feat, sizeof(float) * e->fs.n_feat);
            s->norm = p->norm;
            s->signal = sig;
            s->confidence = conf;
            s->run = 0;
            s->computed_ns = p->now;
            s->valid = 1;
        }
        r->signal = sig;
        r->confidence = conf;
        r->cached = 0;
        e->misses++;
        e->miss_reason[p->reason]++;
    }
    s->last_ns = p->now;
    if (!committed) fp_window_commit(e->k, &e->fs, fp_win_at(e, p->symbol), p->raw, NULL);
    e->ticks++;
    const uint64_t t4 = fp_ticks();
    /* Past t4 nothing is timed, but the Python caller waits for it: the clock's rate is
     * loaded once for every conversion (each fp_ticks_to_ns() reloads it and the clock
     * source), and the record is built in registers and stored whole. Same values as
     * fp_ticks_to_ns() gives: 0 for a negative or zero interval, else trunc(ticks * k). */
    const int tsc = fp_clock.use_tsc;
    const double k = fp_clock_slope();
    const int64_t total = fp_ticks_to_ns_at(t4 - p->t0, tsc, k);
    fp_lat rec;
    rec.total = fp_sat32(total);
    r->reason = p->reason;
    r->total_ns = total;
    if (!st) {
        /* not measured: -1 in the result, 0 in the record (fp_engine_set_stage_times) */
        r->feature_ns = r->cache_ns = r->infer_ns = -1;
        rec.feature = rec.cache = rec.infer = 0;
    } else {
        const int64_t f = fp_ticks_to_ns_at(p->t1 - p->t0, tsc, k);
        const int64_t c = fp_ticks_to_ns_at(p->t2 - p->t1, tsc, k) + fp_ticks_to_ns_at(t4 - t3, tsc, k);
        const int64_t i = p->reason == FP_HIT ? 0
                          : extern_infer_ns >= 0 ? extern_infer_ns + fp_ticks_to_ns_at(t3 - th, tsc, k)
                          : fp_ticks_to_ns_at(t3 - p->t2, tsc, k);
        r->feature_ns = f;
        r->cache_ns = c;
        r->infer_ns = i;
        rec.feature = fp_sat32(f);
        rec.cache = fp_sat32(c);
        /* a miss records at least 1 ns of inference: stats() tells hits from misses by a
         * record's infer > 0, and a coarse clock (clock_gettime on a host without an
         * invariant TSC, ticks of microseconds) would record a small model's miss as 0 */
        rec.infer = fp_sat32(i + (i == 0 && p->reason != FP_HIT));
    }
    e->lat[(e->ticks - 1) & e->lat_mask] = rec;
    return FP_OK;
}

int fp_step_finish(fp_engine *e, fp_pending *p, const float *out2, int64_t extern_infer_ns,
                   fp_result *r) {
    return fp_finish_impl(e, p, out2, extern_infer_ns, r, 0);
}

/* Local aliases of the stages: fp_step calls them directly instead of through the PLT
 * (each is an exported symbol of a -fPIC shared object, so a plain call may be interposed
 * and goes through the PLT), and the compiler may inline them here. */
static __typeof__(fp_infer_cpu) fp_infer_cpu_local __attribute__((alias("fp_infer_cpu")));

int fp_step(fp_engine *e, const float *raw, int32_t symbol, int64_t ts_ns, fp_result *r) {
    fp_pending p;
    int rc = fp_begin_impl(e, raw, symbol, ts_ns, &p, 1);
    if (rc != FP_OK) return rc;
    const float *out = p.reason == FP_HIT ? NULL : fp_infer_cpu_local(e);
    return fp_finish_impl(e, &p, out, -1, r, 1);
}

/* how many rows ahead step_batch prefetches a row's raw (a row costs ~300 ns, memory ~100) */
#define FP_BATCH_PF_ROWS 2
/* how many rows a piece with a time budget (fp_step_batch_piece) runs between two reads of
 * the clock: one read (~9 ns on the TSC, ~25 through clock_gettime) per 256 rows of at
 * least ~100 ns each (a check; a step is ~300 ns and up) is under 0.1%, and a piece
 * overruns its budget by at most 256 rows */
#define FP_BATCH_CLOCK_ROWS 256

/* whether a pass that started at row i0, in a piece that started at fp_ticks() t0 with
 * budget_ns (<= 0: no limit), stops before row i: the clock is read every
 * FP_BATCH_CLOCK_ROWS rows only, and a pass always runs its first FP_BATCH_CLOCK_ROWS rows,
 * so a piece moves on whatever the budget */
static inline int fp_piece_over(int64_t i, int64_t i0, uint64_t t0, int64_t budget_ns) {
    return budget_ns > 0 && i > i0 && ((i - i0) % FP_BATCH_CLOCK_ROWS) == 0
           && fp_ticks_to_ns(fp_ticks() - t0) >= budget_ns;
}

/* Without ts the engine clock only moves forward, so checking it once against each
 * symbol's last tick is enough. Only the batch's own symbols are read into the scratch: a
 * copy of every symbol's last tick would cost each call O(n_symbols) scattered slot reads. A
 * symbol
 * out of range is skipped here and refused in order by the pass after. Returns now0, the
 * time the rows without ts are checked at. */
static int64_t fp_batch_check_begin(fp_engine *e, const int32_t *symbols, int64_t n) {
    const int64_t now0 = fp_ticks_to_mono_ns(fp_ticks());
    for (int64_t i = 0; i < n; i++) {
        const int32_t s = symbols[i];
        if (s >= 0 && s < e->n_symbols) e->ts_scratch[s] = fp_slot_at(e, s)->last_ns;
    }
    return now0;
}

/* pass 1 on rows [i0, n), against the scratch as the rows before i0 left it: -1 with
 * *checked the end of the rows checked (n, or less when the piece's budget ran out), or the
 * bad row with *err */
static int64_t fp_batch_check_rows(fp_engine *e, const float *raws, int64_t row_stride,
                                   const int32_t *symbols, const int64_t *ts, int64_t i0,
                                   int64_t n, int64_t now0, uint64_t t0, int64_t budget_ns,
                                   int *err, int64_t *checked) {
    int64_t i;
    for (i = i0; i < n; i++) {
        if (fp_piece_over(i, i0, t0, budget_ns)) break;
        const int32_t s = symbols[i];
        if (s < 0 || s >= e->n_symbols) { *err = FP_ERR_SYMBOL; return i; }
        if (!e->k->allfinite(raws + i * row_stride, e->fs.raw_len)) {
            *err = FP_ERR_NONFINITE_INPUT;
            return i;
        }
        int64_t t = ts ? ts[i] : now0;
        if (t < e->ts_scratch[s]) {
            /* engine clock: tolerate a re-anchor's rounding, as fp_step_begin does */
            if (ts || e->ts_scratch[s] - t > FP_CLOCK_SLACK_NS) {
                *err = FP_ERR_TIME_BACKWARDS;
                return i;
            }
            t = e->ts_scratch[s];
        }
        e->ts_scratch[s] = t;
    }
    *err = FP_OK;
    *checked = i;
    return -1;
}

/* pass 2 on rows [i0, n) of a batch whose every row passed pass 1: -1 with *applied the end
 * of the rows applied (n, or less when the piece's budget ran out), or the row the model stage
 * refused with *err and *applied that row. Each row's raw is prefetched FP_BATCH_PF_ROWS rows
 * ahead: a batch bigger than the caches comes from memory, and the z-score plan loads a
 * row's windows in its own order (each group's, then those no feature reads), which the
 * hardware prefetcher does not follow from row to row. */
static int64_t fp_step_rows(fp_engine *e, const float *raws, int64_t row_stride,
                            const int32_t *symbols, const int64_t *ts, int64_t i0, int64_t n,
                            uint64_t t0, int64_t budget_ns, float *signal, float *confidence,
                            uint8_t *cached, int64_t *total_ns, int *err, int64_t *applied) {
    const size_t row_bytes = (size_t)e->fs.raw_len * sizeof(float);
    int64_t i;
    for (i = i0; i < n; i++) {
        if (fp_piece_over(i, i0, t0, budget_ns)) break;
        if (i + FP_BATCH_PF_ROWS < n) {
            const char *next = (const char *)(raws + (i + FP_BATCH_PF_ROWS) * row_stride);
            for (size_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(next + o);
        }
        fp_result r;
        int rc = fp_step(e, raws + i * row_stride, symbols[i], ts ? ts[i] : -1, &r);
        if (rc != FP_OK) { *err = rc; *applied = i; return i; }
        if (signal) signal[i] = r.signal;
        if (confidence) confidence[i] = r.confidence;
        if (cached) cached[i] = (uint8_t)r.cached;
        if (total_ns) total_ns[i] = r.total_ns;
    }
    *err = FP_OK;
    *applied = i;
    return -1;
}

int64_t fp_step_batch_piece(fp_engine *e, const float *raws, int64_t row_stride,
                            const int32_t *symbols, const int64_t *ts, int64_t n,
                            int64_t budget_ns, fp_batch_pos *pos, float *signal,
                            float *confidence, uint8_t *cached, int64_t *total_ns, int *err) {
    /* one clock read a piece, none where no pass could stop early (each runs its first
     * FP_BATCH_CLOCK_ROWS rows): a small batch reads no more clocks than in one piece */
    uint64_t t0 = 0;
    if (budget_ns > 0 && n - pos->applied > FP_BATCH_CLOCK_ROWS) t0 = fp_ticks();
    else budget_ns = 0;
    if (!pos->begun) {
        pos->now0 = fp_batch_check_begin(e, symbols, n);
        pos->begun = 1;
    }
    if (pos->checked < n) {
        /* pass 1: every row valid before anything is written */
        const int64_t bad = fp_batch_check_rows(e, raws, row_stride, symbols, ts, pos->checked,
                                                n, pos->now0, t0, budget_ns, err,
                                                &pos->checked);
        if (bad >= 0 || pos->checked < n) return bad;
    }
    /* pass 2, on the rest of the piece's budget (spent already: it stops after its first
     * FP_BATCH_CLOCK_ROWS rows) */
    return fp_step_rows(e, raws, row_stride, symbols, ts, pos->applied, n, t0, budget_ns,
                        signal, confidence, cached, total_ns, err, &pos->applied);
}

int64_t fp_step_batch(fp_engine *e, const float *raws, int64_t row_stride, const int32_t *symbols,
                      const int64_t *ts, int64_t n, float *signal, float *confidence,
                      uint8_t *cached, int64_t *total_ns, int *err, int64_t *applied) {
    fp_batch_pos pos = {0, 0, 0, 0};
    const int64_t bad = fp_step_batch_piece(e, raws, row_stride, symbols, ts, n, 0, &pos, signal,
                                            confidence, cached, total_ns, err);
    *applied = pos.applied;
    return bad;
}

int64_t fp_batch_check(fp_engine *e, const float *raws, int64_t row_stride,
                       const int32_t *symbols, const int64_t *ts, int64_t n, int *err) {
    int64_t checked;
    const int64_t now0 = fp_batch_check_begin(e, symbols, n);
    return fp_batch_check_rows(e, raws, row_stride, symbols, ts, 0, n, now0, 0, 0, err,
                               &checked);
}

/* the live book's entry points (fp_engine.h) */
int fp_engine_set_tick(fp_engine *e, int32_t symbol, double tick) {
    if (symbol < 0 || symbol >= e->n_symbols || !(tick > 0) || !isfinite(tick)) return FP_ERR_PARAM;
    if (e->books[symbol]) {
        e->books[symbol]->tick = tick;
        return FP_OK;
    }
    e->books[symbol] = fp_book_create(tick);
    if (!e->books[symbol]) return FP_ERR_NOMEM;
    fp_book_set_kernels(e->books[symbol], e->k, 0);
    return FP_OK;
}

fp_book *fp_engine_book(fp_engine *e, int32_t symbol) {
    return symbol < 0 || symbol >= e->n_symbols ? NULL : e->books[symbol];
}

static __typeof__(fp_step) fp_step_local __attribute__((alias("fp_step")));

int fp_step_book(fp_engine *e, int32_t symbol, const fp_book_update *u, fp_result *r,
                 int64_t *book_ns, int *why, int *where) {
    *why = FP_BOOK_OK;
    *where = 0;
    if (symbol < 0 || symbol >= e->n_symbols) return FP_ERR_SYMBOL;
    if (e->fs.raw_len != FP_BOOK_RAW || u->ts_ns < 0) return FP_ERR_PARAM;
    fp_book *b = e->books[symbol];
    if (!b) {
        *why = FP_BOOK_ERR_NOTICK;
        return FP_ERR_BOOK;
    }
    const uint64_t t0 = fp_ticks();
    const float *raw;
    const int rc = fp_book_compute(b, u, &raw, where);
    if (rc) {
        *why = rc;
        return FP_ERR_BOOK;
    }
    const uint64_t t1 = fp_ticks();
    const int rs = fp_step_local(e, raw, symbol, u->ts_ns, r);
    if (rs != FP_OK) return rs;
    fp_book_commit(b);
    const int64_t bn = fp_ticks_to_ns(t1 - t0);
    r->total_ns += bn;
    e->lat[(e->ticks - 1) & e->lat_mask].total = fp_sat32(r->total_ns);
    *book_ns = e->stage_times ? bn : -1;
    return FP_OK;
}
