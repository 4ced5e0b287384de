# Included by _engine.pyx and _serve.pyx: one place turns a validated Model and resolved
# config into an fp_engine, so an in-process Engine and a serving worker built from the same
# model answer tick for tick alike. (Each extension links its own copy of the C core.)

_WEIGHT_TYPES = {"fp32": FP_WEIGHTS_FP32, "bf16": FP_WEIGHTS_BF16, "int8": FP_WEIGHTS_INT8}
include "_trees.pxi"


cdef fp_engine *_make_engine(object model, object cfg, list keep) except NULL:
    """fp_engine_create from a fastpath.Model and a fastpath._build.ResolvedConfig. The
    control plane's memory region (weights arena + per-symbol state), when the config asks
    for one, is appended to `keep`: it must outlive the engine."""
    cdef fp_engine *e = NULL
    m = model
    fs = m.feature_spec     # the input scaler (when the model has one) runs after it, in C
    pol = cfg.cache
    layers = m.layers
    cdef int L = len(layers)
    cdef fp_engine_params p
    cdef fp_trees_desc td
    cdef int err = 0
    cdef size_t wbytes = 0, sbytes = 0
    z_idx = np.ascontiguousarray(fs.z_idx, dtype=np.int32)
    w_idx = np.ascontiguousarray(fs.w_idx, dtype=np.int32)
    mean = np.ascontiguousarray(fs.mean, dtype=np.float32)
    inv_std = np.ascontiguousarray(fs.inv_std, dtype=np.float32)
    sc = m.input_scaler
    in_off = None if sc is None else np.ascontiguousarray(sc.offset, dtype=np.float32)
    in_scale = None if sc is None else np.ascontiguousarray(sc.scale, dtype=np.float32)
    tree_keep = []
    if m.trees is not None:
        # the C core packs its own copy; these arrays only live through fp_engine_create
        _trees_desc(m.trees, &td, tree_keep)
        dims = np.ones(2, dtype=np.intc)
    else:
        dims = np.ascontiguousarray([layers[0].weight.shape[1]] + [l.weight.shape[0] for l in layers],
                                    dtype=np.intc)
    acts = np.ascontiguousarray([_ACTS[l.activation] for l in layers], dtype=np.intc)
    ws = [np.ascontiguousarray(l.weight, dtype=np.float32) for l in layers]
    bs = [np.ascontiguousarray(l.bias, dtype=np.float32) for l in layers]
    cdef const float **wp = <const float **>PyMem_Malloc(sizeof(float *) * max(L, 1))
    cdef const float **bp = <const float **>PyMem_Malloc(sizeof(float *) * max(L, 1))
    cdef cnp.ndarray a
    memset(&p, 0, sizeof(p))
    head = m.head_spec
    p.post = _POSTS[m.post]
    p.head_scale = head.scale
    if head.kind == "tanh_sigmoid":
        p.head = FP_HEAD_TANH_SIGMOID
        p.head_idx[0], p.head_idx[1] = head.outputs
    elif head.kind == "regression":
        p.head = FP_HEAD_REGRESSION
        p.head_idx[0] = head.outputs[0]
    else:
        p.head = FP_HEAD_CLASSIFIER
        p.head_idx[0] = head.outputs[0]
        p.head_idx[1] = head.outputs[1] if head.kind == "classifier3" else -1
        p.head_idx[2] = head.outputs[len(head.outputs) - 1]
    if wp == NULL or bp == NULL:
        PyMem_Free(wp)
        PyMem_Free(bp)
        raise MemoryError()
    try:
        for i in range(L):
            a = ws[i]
            wp[i] = <const float *>cnp.PyArray_DATA(a)
            a = bs[i]
            bp[i] = <const float *>cnp.PyArray_DATA(a)
        p.raw_len = fs.raw_len
        p.n_z = len(z_idx)
        p.n_w = len(w_idx)
        p.window = fs.window
        p.z_idx = <const int32_t *>cnp.PyArray_DATA(z_idx)
        p.w_idx = <const int32_t *>cnp.PyArray_DATA(w_idx)
        p.mean = <const float *>cnp.PyArray_DATA(mean)
        p.inv_std = <const float *>cnp.PyArray_DATA(inv_std)
        if sc is not None:
            a = in_off
            p.in_offset = <const float *>cnp.PyArray_DATA(a)
            a = in_scale
            p.in_scale = <const float *>cnp.PyArray_DATA(a)
        if m.trees is not None:
            p.model_kind = FP_MODEL_TREES
            p.trees = &td
        p.n_layers = L
        p.dims = <const int *>cnp.PyArray_DATA(dims)
        p.acts = <const int *>cnp.PyArray_DATA(acts)
        p.weights = wp
        p.biases = bp
        p.arena_mem = NULL
        p.state_mem = NULL
        p.n_symbols = cfg.n_symbols
        p.policy.enabled = 1 if pol.enabled else 0
        p.policy.cos_threshold = pol.cos_threshold   # the plan slackens it (fp_cache_cos_bound)
        p.policy.norm_tol = pol.norm_tol
        p.policy.max_age_ns = pol.max_age_ns
        p.policy.max_run = pol.max_run
        p.isa = _ISA_BY_NAME[cfg.simd_resolved]
        # [engine] weights, when set, overrides the model's own choice (fp32 unless set)
        wt = getattr(cfg.source, "weights", None) or m.weights
        if m.trees is not None and wt != "fp32":
            from fastpath.errors import ConfigError
            raise ConfigError(f"engine.weights = {wt!r} applies to an MLP's layers; this model is a "
                              f"tree ensemble, which runs its float32 thresholds (leave "
                              f"engine.weights unset or 'fp32')")
        p.weight_type = _WEIGHT_TYPES[wt]
        p.lat_capacity = cfg.latency_records
        mem_cfg = cfg.memory
        if mem_cfg is not None:
            # weights arena + per-symbol state in one mapping from the control plane
            from fastpath.control.memory import allocate
            fp_engine_sizes(&p, &wbytes, &sbytes)
            region = allocate(wbytes + sbytes, mem_cfg.huge_pages, mem_cfg.mlock)
            keep.append(region)
            p.arena_mem = <void *><size_t>region.addr
            p.state_mem = <void *>(<size_t>region.addr + wbytes)
        e = fp_engine_create(&p, &err)
    finally:
        PyMem_Free(wp)
        PyMem_Free(bp)
    if e == NULL:
        if err == FP_ERR_NOMEM:
            raise MemoryError(f"cannot allocate an engine for {cfg.n_symbols} symbols")
        raise FastpathError("engine parameters rejected by the C core (a bug: the Model and "
                            "config were validated in Python)")
    return e
