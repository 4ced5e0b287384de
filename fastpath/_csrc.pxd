# Declarations of the C hot path (csrc/); nothing but cdef extern blocks.
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uint8_t

cdef extern from "fp_simd.h" nogil:
    ctypedef enum fp_isa:
        FP_ISA_SCALAR
        FP_ISA_AVX2
        FP_ISA_AVX512
    ctypedef struct fp_dense_layer:
        int in_ "in"
        int out, nb, act
        const float *w
        const float *bias
    ctypedef struct fp_zstep:
        pass
    ctypedef struct fp_kernels:
        const char *name
        void (*zscore_gather)(const float *raw, const int32_t *idx, const float *mean,
                              const float *inv_std, float *out, int n)
        void (*zscore_runs)(const float *raw, const int32_t *runs, int n_runs, const float *mean,
                            const float *inv_std, float *out)
        void (*window_stats)(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                             const double *sum, const double *sumsq, const float *old,
                             double inv_n, float *pm, float *ps)
        void (*zscore)(const float *x, const float *mean, const float *inv_std, float *out, int n)
        void (*dot_norm2)(const float *a, const float *b, int n, double *dot, double *na2)
        int (*dense)(const fp_dense_layer *L, const float *x, float *y, int reverse)
        int (*allfinite)(const float *x, int n)
        void (*head)(const float *out, float *signal, float *confidence)
        void (*dot_norms_f32)(const float *a, const float *b, int n, float *dot, float *na2,
                              float *nb2)
        int (*window_zscore)(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                             const double *sum, const double *sumsq, const float *old,
                             double inv_n, const float *mean, const float *inv_std, float *feat,
                             const double *thr)
        void (*dot_norms_f64)(const float *a, const float *b, int n, double *dot, double *na2,
                              double *nb2)
        int (*zscore_perm)(const float *raw, const fp_zstep *steps, int n, const float *mean,
                           const float *inv_std, float *out)
        int (*window_commit)(const float *raw, const int32_t *w_idx, int n_w, const float *ref,
                             double *sum, double *sumsq, float *row, int full,
                             const double *thr, double *undo, double *fresh)
        void (*window_sums)(const float *ring, int rows, int stride, int n, const float *ref,
                            double *sum, double *sumsq)
        void (*log1p)(const double *x, double *y, int n) noexcept nogil
        int (*book_ok)(const double *bid_px, const double *bid_sz, const double *ask_px,
                       const double *ask_sz)
        uint64_t (*book_diff)(const double *x0, const double *x1, const double *x2,
                              const double *x3, const double *old)
        void (*book_prices)(const double *bid_px, const double *ask_px, double mid,
                            double tick, double *o)
        void (*book_imbalance)(const double *b, const double *a, double *out)
        void (*diff_norms_f32)(const float *a, const float *b, int n, float *dd, float *de,
                               float *na2, float *nb2)
    int fp_cpu_has_avx2()
    int fp_cpu_has_fma()
    int fp_cpu_has_avx512()
    int fp_cpu_has_avx512_bf16()
    int fp_cpu_has_avx512_vnni()
    int fp_cpu_has_avx_vnni()
    fp_isa fp_isa_best()
    int fp_isa_supported(fp_isa isa)
    const fp_kernels *fp_kernels_for(fp_isa isa)
    int fp_log1p_libm_fused()
    void *fp_aligned_alloc(size_t nbytes)
    void fp_aligned_free(void *p)

cdef extern from "fp_math.h" nogil:
    float fp_actf(float x, int act)

cdef extern from "fp_clock.h" nogil:
    ctypedef struct fp_clock_t:
        int use_tsc
        double ns_per_tick
        double read_cost_ns
        int cal_samples
        double cal_bracket_ns
        uint64_t reanchors
        uint64_t steps
        uint64_t tsc_backs
    fp_clock_t fp_clock
    void fp_clock_init()
    const char *fp_clock_source()
    int fp_clock_reanchor(int force)
    int64_t fp_mono_ns()
    uint64_t fp_ticks()
    int64_t fp_ticks_to_ns(uint64_t dt)
    int64_t fp_ticks_to_mono_ns(uint64_t t)

cdef extern from "fp_cache.h" nogil:
    ctypedef struct fp_cache_policy:
        double cos_threshold
        double norm_tol
        int64_t max_age_ns
        uint32_t max_run
        int enabled
    enum:
        FP_HIT
        FP_MISS_COLD
        FP_MISS_AGE
        FP_MISS_RUN
        FP_MISS_COSINE
        FP_MISS_NORM
        FP_MISS_DISABLED
        FP_MISS_NREASONS
    ctypedef struct fp_slot:
        double norm
        float signal, confidence
        uint32_t run, valid
        int64_t computed_ns, last_ns
    size_t fp_slot_stride(int n_feat)
    float *fp_slot_features(fp_slot *s)
    int fp_cache_lookup(const fp_kernels *k, const fp_cache_policy *p, const fp_slot *s,
                        const float *f, int n, int64_t now, double *norm)
    enum:
        FP_CACHE_UNDECIDED
    ctypedef struct fp_cache_plan:
        int f32, f32_hit
    void fp_cache_plan_init(fp_cache_plan *pl, const fp_cache_policy *p, int n)
    int fp_cache_look_f32(const fp_kernels *k, const fp_cache_plan *pl, const float *f,
                          const float *c, int n)

cdef extern from "fp_lowp.h" nogil:
    enum:
        FP_WEIGHTS_FP32
        FP_WEIGHTS_BF16
        FP_WEIGHTS_INT8
    ctypedef struct fp_lowp_layer:
        int wtype
        int in_ "in"
        int out, nb, ng, act
    ctypedef int (*fp_lowp_dense_fn)(const fp_lowp_layer *L, const float *x, float *y,
                                     void *scratch) noexcept nogil
    ctypedef struct fp_lowp_kernels:
        const char *bf16_name
        const char *int8_name
    const fp_lowp_kernels *fp_lowp_for(fp_isa isa)
    fp_lowp_dense_fn fp_lowp_variant(int wtype, const char *name)
    size_t fp_lowp_scratch_floats(int n_in)
    size_t fp_lowp_layer_bytes(int wtype, int n_in, int out)
    void fp_lowp_pack(fp_lowp_layer *L, int wtype, int n_in, int out, int act, const float *w,
                      const float *bias, void *mem)

cdef extern from "fp_mlp.h" nogil:
    enum:
        FP_MAX_LAYERS
    ctypedef struct fp_mlp:
        int n_layers
        fp_dense_layer layers[16]
        fp_lowp_layer lowp[16]
        int lowp_on[16]
        int weights
        const fp_lowp_kernels *lk
        float *arena
        size_t arena_bytes
        int act_width
        int max_width
        long long macs
    size_t fp_mlp_arena_bytes(int n_layers, const int *dims)
    size_t fp_mlp_arena_bytes_ex(int n_layers, const int *dims, int weights)
    int fp_mlp_init(fp_mlp *m, int n_layers, const int *dims, const int *acts,
                    const float *const *weights, const float *const *biases, void *mem)
    int fp_mlp_init_ex(fp_mlp *m, int n_layers, const int *dims, const int *acts,
                       const float *const *weights, const float *const *biases, void *mem,
                       int wtype, fp_isa isa)
    void fp_mlp_free(fp_mlp *m)
    const float *fp_mlp_forward(const fp_kernels *k, const fp_mlp *m, const float *x,
                                float *a, float *b, int reverse)

cdef extern from "fp_features.h" nogil:
    ctypedef struct fp_feature_spec:
        int raw_len, n_z, n_w, window, n_feat, n_runs, n_zsteps
    int fp_feature_runs(const int32_t *z_idx, int n_z, int32_t *runs)
    int fp_zperm_build(const int32_t *z_idx, int n_z, int raw_len, fp_zstep *steps)

cdef extern from "fp_trees.h" nogil:
    enum:
        FP_TREES_PERFECT_DEPTH
        FP_TREES_MAX_TARGETS
    ctypedef struct fp_trees_desc:
        int n_feat, n_targets, n_trees, n_nodes, n_weights, n_base
        int aggregate, post, classifier
        const int32_t *tree_off
        const int32_t *feat
        const int32_t *mode
        const int32_t *true_child
        const int32_t *false_child
        const uint8_t *nan_true
        const float *thr
        const int32_t *w_node
        const int32_t *w_target
        const float *w_value
        const float *base
    enum:
        FP_TREES_CHOOSE_CANDS
    ctypedef struct fp_trees:
        int n_feat, n_targets, n_trees, n_out
        int depth, n_groups, n_rest
        int walk_ok, mode, gather, pgather
        int64_t choose_ns[FP_TREES_CHOOSE_CANDS]
        size_t arena_bytes
    ctypedef void (*fp_trees_eval_fn)(const fp_trees *t, const float *x, float *out)
    size_t fp_trees_arena_bytes(const fp_trees_desc *d)
    int fp_trees_init(fp_trees *t, const fp_trees_desc *d, void *mem)
    void fp_trees_free(fp_trees *t)
    fp_trees_eval_fn fp_trees_eval_for(fp_isa isa)
    void fp_trees_choose(fp_trees *t, fp_trees_eval_fn ev)

cdef extern from "fp_book.h" nogil:
    # why fp_step_book refused an update (fastpath._core._book_refusal words it)
    enum:
        FP_BOOK_ERR_PRICE
        FP_BOOK_ERR_SIZE
        FP_BOOK_ERR_ORDER
        FP_BOOK_ERR_CROSSED
        FP_BOOK_ERR_TRADE
        FP_BOOK_ERR_RANGE
        FP_BOOK_ERR_NOTICK
    # one book update as fp_step_book takes it (level 1 first, FP_BOOK_LEVELS levels a side)
    ctypedef struct fp_book_update:
        const double *bid_px
        const double *bid_sz
        const double *ask_px
        const double *ask_sz
        int64_t ts_ns
        double trade_vol, trade_cnt, last_trade_sz


cdef extern from "fp_engine.h" nogil:
    enum:
        FP_OK
        FP_ERR_SYMBOL
        FP_ERR_NONFINITE_INPUT
        FP_ERR_TIME_BACKWARDS
        FP_ERR_NONFINITE_OUTPUT
        FP_ERR_NOMEM
        FP_ERR_PARAM
        FP_ERR_NONFINITE_FEATURE
        FP_ERR_NOT_PROBABILITY
    enum:
        FP_POST_NONE
        FP_POST_SOFTMAX
        FP_POST_LOGISTIC2
    enum:
        FP_HEAD_TANH_SIGMOID
        FP_HEAD_REGRESSION
        FP_HEAD_CLASSIFIER
    ctypedef struct fp_engine_params:
        int raw_len, n_z, n_w, window
        const int32_t *z_idx
        const int32_t *w_idx
        const float *mean
        const float *inv_std
        const float *in_offset
        const float *in_scale
        int n_layers
        const int *dims
        const int *acts
        const float *const *weights
        const float *const *biases
        int post
        int head
        float head_scale
        int head_idx[3]
        int weight_type
        void *arena_mem
        void *state_mem
        int n_symbols
        fp_cache_policy policy
        fp_isa isa
        int lat_capacity
        int model_kind
        const fp_trees_desc *trees
    enum:
        FP_MODEL_MLP
        FP_MODEL_TREES
    ctypedef struct fp_result:
        float signal, confidence
        int cached, reason
        int64_t feature_ns, cache_ns, infer_ns, total_ns
    ctypedef struct fp_lat:
        uint32_t feature, cache, infer, total
    ctypedef struct fp_pending:
        int32_t symbol
        int64_t now
        int reason
    ctypedef struct fp_engine:
        const fp_kernels *k
        fp_feature_spec fs
        fp_mlp mlp
        int n_out
        fp_cache_policy policy
        int n_symbols
        float *pre
        float *feat
        float *out
        uint64_t ticks, hits, misses
        uint64_t miss_reason[7]
        fp_lat *lat
        uint64_t lat_mask
        int model_kind
        fp_trees trees
    void fp_engine_sizes(const fp_engine_params *p, size_t *weights, size_t *state)
    fp_engine *fp_engine_create(const fp_engine_params *p, int *err)
    void fp_engine_free(fp_engine *e)
    void fp_engine_reset(fp_engine *e)
    void fp_engine_reset_symbol(fp_engine *e, int32_t symbol)
    int fp_step_begin(fp_engine *e, const float *raw, int32_t symbol, int64_t ts_ns, fp_pending *p)
    const float *fp_infer_cpu(fp_engine *e)
    int fp_predict(fp_engine *e, const float *x, float *out)
    int fp_step_finish(fp_engine *e, fp_pending *p, const float *out2, int64_t extern_infer_ns,
                       fp_result *r)
    int fp_step(fp_engine *e, const float *raw, int32_t symbol, int64_t ts_ns, fp_result *r)
    int64_t fp_step_batch(fp_engine *e, const float *raws, int64_t row_stride,
                          const int32_t *symbols, const int64_t *ts, int64_t n, float *signal,
                          float *confidence, uint8_t *cached, int64_t *total_ns, int *err,
                          int64_t *applied)

cdef extern from "fp_bench.h" nogil:
    double fp_fma_ns_per_instr(long iters)
    double fp_fma512_ns_per_instr(long iters)
    double fp_op_latency_ns(int op, long iters)
    double fp_read_gbps(size_t nbytes, int passes)
    long long fp_jitter_probe(long long duration_ns, long long threshold_ns, long long *hist,
                              long long *max_gap_ns, long long *reads)
