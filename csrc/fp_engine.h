/* fp_engine.h: one tick from raw values to signal in one C call, no Python.
 *
 * fp_step_begin() (validate, features, cache lookup)
 *   + fp_infer_cpu() on a miss (or a GPU backend's outputs)
 *   + fp_step_finish() (head, store, commit the window).
 * fp_step() runs the same stages with one difference: it commits the window right
 * after the features, before the cache decides, and keeps an undo record (fp_features.h)
 * that it restores when the model refuses the tick. A hit, the branch the CPU rarely
 * predicts, then has less work behind its decision.
 * Decision: the stages are separate functions over a pending-tick record so a
 * GPU backend can replace fp_infer_cpu() and keep everything else; nothing in
 * here touches a Python object, so a C loop may call it without the GIL.
 * An engine is not reentrant: one thread steps it at a time (the Python layer
 * enforces that). Validation happens before any state is written and a window
 * committed early is restored, so a rejected tick leaves slots, windows and
 * counters exactly as they were.
 */
#ifndef FP_ENGINE_H
#define FP_ENGINE_H

#include "fp_simd.h"
#include "fp_features.h"
#include "fp_cache.h"
#include "fp_mlp.h"
#include "fp_trees.h"
#include "fp_clock.h"
#include "fp_book.h"

enum {
    FP_OK = 0,
    FP_ERR_SYMBOL = -1,           /* symbol outside [0, n_symbols) */
    FP_ERR_NONFINITE_INPUT = -2,  /* NaN or Inf in the raw tick */
    FP_ERR_TIME_BACKWARDS = -3,   /* ts earlier than this symbol's last tick */
    FP_ERR_NONFINITE_OUTPUT = -4, /* a hidden layer or the output was NaN/Inf (input too large) */
    FP_ERR_NOMEM = -5,
    FP_ERR_PARAM = -6,
    FP_ERR_NONFINITE_FEATURE = -7,/* finite raw, but a feature overflowed (z-score or window stats) */
    FP_ERR_NOT_PROBABILITY = -8,  /* a classifier head's inputs were not probabilities (in [0, 1]) */
    FP_ERR_BOOK = -9,             /* fp_step_book: the update refused (an FP_BOOK_ERR_* says why) */
};

typedef struct {
    /* features */
    int raw_len, n_z, n_w, window;
    const int32_t *z_idx, *w_idx;
    const float *mean, *inv_std;      /* n_z + 2 n_w */
    /* the model's input scaler after the spec, feat = (feat - in_offset) * in_scale in float32
     * (an imported pipeline's Scaler: onnxruntime's two ops), n_z + 2 n_w each; both NULL
     * for none (fp_features.h) */
    const float *in_offset, *in_scale;
    /* model: dims[0] == n_z + 2 n_w, dims[n_layers] = the last layer's width (1..) */
    int n_layers;
    const int *dims, *acts;
    const float *const *weights;      /* row-major dims[l+1] x dims[l] */
    const float *const *biases;
    int post;                         /* FP_POST_*: applied to the last layer's output */
    int head;                         /* FP_HEAD_*: outputs -> signal, confidence */
    float head_scale;                 /* FP_HEAD_REGRESSION: signal = tanh(out / scale), > 0 */
    int head_idx[3];                  /* output indices the head reads (see FP_HEAD_*) */
    int weight_type;                  /* FP_WEIGHTS_* (fp_lowp.h) of the hidden layers; 0: fp32 */
    void *arena_mem;                  /* optional weights arena, 64-byte aligned, see fp_engine_sizes */
    void *state_mem;                  /* optional cache slots + windows, 64-byte aligned */
    /* cache */
    int n_symbols;
    fp_cache_policy policy;
    fp_isa isa;
    int lat_capacity;                 /* per-tick latency records kept for stats, power of 2 */
    /* FP_MODEL_TREES: the model is `trees` (the MLP fields are ignored, post must be NONE:
     * the ensemble's own post transform is in the description) */
    int model_kind;
    const fp_trees_desc *trees;
} fp_engine_params;

enum { FP_MODEL_MLP = 0, FP_MODEL_TREES = 1 };

/* What follows the last dense layer, as the exporters write it: nothing, a softmax over the
 * outputs (classifier probabilities), or one logit z -> [1 - sigmoid(z), sigmoid(z)] (a
 * binary classifier's two probabilities). */
enum { FP_POST_NONE = 0, FP_POST_SOFTMAX = 1, FP_POST_LOGISTIC2 = 2 };

/* Heads (fp_math.h has the formulas):
 *   TANH_SIGMOID  signal = tanh(out[i0]), confidence = sigmoid(out[i1])
 *   REGRESSION    signal = tanh(out[i0] / scale), confidence = |signal|
 *   CLASSIFIER    signal = p[up = i2] - p[down = i0], confidence = max over all outputs
 *                 (i1: the flat class, or -1 for a two-class model); a tick whose outputs
 *                 are not all in [0, 1] (FP_PROB_TOL, fp_math.h) is refused with
 *                 FP_ERR_NOT_PROBABILITY, its outputs left in e->out for the message */
enum { FP_HEAD_TANH_SIGMOID = 0, FP_HEAD_REGRESSION = 1, FP_HEAD_CLASSIFIER = 2 };

typedef struct {
    float signal, confidence;
    int cached, reason;
    int64_t feature_ns, cache_ns, infer_ns, total_ns;
} fp_result;

typedef struct { uint32_t feature, cache, infer, total; } fp_lat;

typedef struct {
    const float *raw;
    int32_t symbol;
    int64_t now;
    double norm;
    int reason;
    uint64_t t0, t1, t2;
} fp_pending;

typedef struct fp_engine {
    const fp_kernels *k;
    fp_isa isa;
    fp_feature_spec fs;
    fp_mlp mlp;
    int n_out;                        /* model outputs after the post transform */
    int post, head, head_idx[3];
    float head_scale;
    float *out, *xin;                 /* post-transform outputs; predict()'s input copy */
    fp_cache_policy policy;
    fp_cache_plan cache_plan;         /* the policy's float32-look constants (fp_cache.h) */
    int n_symbols;
    unsigned char *slots; size_t slot_stride;
    unsigned char *wins; size_t win_stride;
    int state_external;               /* slots/wins live in caller memory: do not free */
    float *pre, *feat, *buf_a, *buf_b;
    uint32_t mlp_parity;              /* row-group order of the next forward pass (fp_mlp_forward) */
    int64_t *ts_scratch;              /* n_symbols, for batch validation */
    unsigned char *undo;              /* fp_step's window undo record (fp_window_commit) */
    /* counters */
    uint64_t ticks, hits, misses, miss_reason[FP_MISS_NREASONS];
    fp_lat *lat; uint64_t lat_mask;
    int model_kind;
    fp_trees trees;
    fp_trees_eval_fn trees_eval;
    int stage_times;                  /* 1 (default): time each stage; 0: only the total */
    fp_book **books;                  /* n_symbols; NULL until the symbol's tick size is set */
} fp_engine;

/* Bytes the weights arena and the per-symbol state (slots, windows) need for these
 * params, so the caller can provide them (huge pages, mlock) through arena_mem/state_mem. */
void fp_engine_sizes(const fp_engine_params *p, size_t *weights, size_t *state);
fp_engine *fp_engine_create(const fp_engine_params *p, int *err);
void fp_engine_free(fp_engine *e);
/* Per-stage times on (the default) or off. A stage boundary costs a TSC read (~9 ns),
 * up to five a miss; off, a tick reads the clock twice (its start and end): total_ns is
 * measured as before, fp_result's feature_ns, cache_ns and infer_ns are -1 (not measured)
 * and the latency records' stage columns 0. */
void fp_engine_set_stage_times(fp_engine *e, int on);
int fp_engine_stage_times(const fp_engine *e);
void fp_engine_reset(fp_engine *e);          /* empty every slot, window and counter */
/* empty one symbol's cache slot and window (a halt, a feed gap); counters untouched.
 * The symbol's last-tick time goes too, so its next tick may carry any timestamp. */
void fp_engine_reset_symbol(fp_engine *e, int32_t symbol);

/* ts_ns < 0: use the engine clock (CLOCK_MONOTONIC ns). Refuses NaN/Inf in the raw tick
 * before anything is written; NaN/Inf features (from a finite raw) make the lookup miss
 * and the tick is refused by the model stage (FP_ERR_NONFINITE_FEATURE). */
int fp_step_begin(fp_engine *e, const float *raw, int32_t symbol, int64_t ts_ns, fp_pending *p);
/* out[n_out] = model(e->feat) (post transform included); returns the outputs, or NULL when
 * a layer's pre-activations were NaN/Inf (fp_step_finish then refuses the tick) */
const float *fp_infer_cpu(fp_engine *e);
/* out[n_out] = model(x) for one feature vector (n_feat floats), no features, no cache, no
 * state touched. FP_OK, or FP_ERR_NONFINITE_OUTPUT when the model overflowed (out is written
 * either way, so the caller can show what came out). */
int fp_predict(fp_engine *e, const float *x, float *out);
/* out2: the model output (n_out floats) for a miss (NULL on a hit, or from a failed fp_infer_cpu: the tick
 * is refused and nothing is written, as for a NaN/Inf out2: FP_ERR_NONFINITE_FEATURE when
 * the features were NaN/Inf, else FP_ERR_NONFINITE_OUTPUT; FP_ERR_NOT_PROBABILITY when a
 * classifier head's outputs are not probabilities, the outputs then copied to e->out);
 * extern_infer_ns: time an external backend spent, or -1 to measure since fp_step_begin
 * returned. infer_ns includes the head, cache_ns only lookup, store and the window commit
 * (on fp_step the commit, done early, is timed with the features). */
int fp_step_finish(fp_engine *e, fp_pending *p, const float *out2, int64_t extern_infer_ns,
                   fp_result *r);
int fp_step(fp_engine *e, const float *raw, int32_t symbol, int64_t ts_ns, fp_result *r);

/* Validate a whole batch first (nothing is written when any row is bad), then
 * step each row. Returns -1 on success, else the index of the bad row with
 * *err set and *applied the rows applied before it (0 unless the model itself
 * failed on a row, or another thread changed the input meanwhile). ts may be
 * NULL (engine clock). Outputs may be NULL. */
int64_t fp_step_batch(fp_engine *e, const float *raws, int64_t row_stride, const int32_t *symbols,
                      const int64_t *ts, int64_t n, float *signal, float *confidence,
                      uint8_t *cached, int64_t *total_ns, int *err, int64_t *applied);

/* fp_step_batch in pieces, for a caller that must look at something else between two (the
 * Python Engine releases the GIL around each piece and checks for Ctrl-C between them). A
 * zeroed fp_batch_pos before the first piece; each piece goes on where the last stopped,
 * first checking every row (pass 1, as fp_batch_check), then applying them (pass 2), and
 * stops once budget_ns have passed (the clock is read every 256 rows; each pass of a piece
 * runs at least that many or to its end; budget_ns <= 0: no limit, the whole batch in one
 * piece). Returns
 * -1 when the piece stopped with no row refused (the batch is done when pos->applied == n),
 * else the refused row with *err: pass 1's (pos->applied 0) or the model stage's
 * (pos->applied that row), as fp_step_batch. The rows, outputs and pos must not change
 * between pieces, nor may anything else use the engine (pass 1 carries the batch's time order
 * from piece to piece in e->ts_scratch, which another batch's check rewrites; pass 2 carries
 * it in the symbols' state as fp_step_batch's one loop does). Answers and refusals are
 * fp_step_batch's, whatever the pieces. */
typedef struct fp_batch_pos {
    int64_t checked;                  /* rows through pass 1 */
    int64_t applied;                  /* rows through pass 2 */
    int64_t now0;                     /* the time rows without ts are checked at */
    int begun;                        /* the scratch was loaded (the first piece ran) */
} fp_batch_pos;
int64_t fp_step_batch_piece(fp_engine *e, const float *raws, int64_t row_stride,
                            const int32_t *symbols, const int64_t *ts, int64_t n,
                            int64_t budget_ns, fp_batch_pos *pos, float *signal,
                            float *confidence, uint8_t *cached, int64_t *total_ns, int *err);

/* An external backend's seam (the GPU stage, fastpath.gpu). y: the last dense layer's outputs
 * (its width, activations applied, no post transform: what the GPU kernel writes) -> the
 * model's outputs (n_out floats) as fp_infer_cpu gives them: y itself when the model has no
 * post transform, else e->out (softmax / logistic2 on the CPU). Only for an MLP model. */
const float *fp_post_apply(fp_engine *e, const float *y);
/* fp_step_batch's first pass alone: every row valid (symbol, finite raw, time order) before
 * a caller that steps rows itself applies any. -1 when all are, else the bad row with *err. */
int64_t fp_batch_check(fp_engine *e, const float *raws, int64_t row_stride,
                       const int32_t *symbols, const int64_t *ts, int64_t n, int *err);

/* The live book (fp_book.h). fp_engine_set_tick: the symbol's book with this tick size
 * (created empty the first time; FP_ERR_PARAM for a tick size not finite and > 0 or a symbol
 * out of range, FP_ERR_NOMEM). fp_engine_book: the symbol's book, NULL when none. */
int fp_engine_set_tick(fp_engine *e, int32_t symbol, double tick);
fp_book *fp_engine_book(fp_engine *e, int32_t symbol);
/* One book update -> signal: the book stage (its raw vector into the book's own buffer),
 * then fp_step on it, in one call. The book's state moves only when fp_step accepts the
 * tick, so any refusal leaves book, window, slot and counters as they were. Returns
 * fp_step's codes, FP_ERR_PARAM (the model's raw_len is not the book's 256, or ts_ns < 0)
 * or FP_ERR_BOOK with *why an FP_BOOK_ERR_* and *where its field. *book_ns: the book
 * stage's time (-1 with stage times off); r->total_ns includes it. */
int fp_step_book(fp_engine *e, int32_t symbol, const fp_book_update *u, fp_result *r,
                 int64_t *book_ns, int *why, int *where);

#endif
