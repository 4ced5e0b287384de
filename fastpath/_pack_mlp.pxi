# Included by _kernels.pyx and gpu/_protocol.pyx: one way to pack an MLP given as Python lists
# (weights (out, in), biases, activation names) into an fp_mlp for the shims and test devices.

def _mlp_arrays(weights, biases, activations):
    """(float32 weights, biases, dims, activation codes) of an MLP given as lists; InputError
    when they do not chain. Shared with the reduced-precision shim (fastpath._kernels)."""
    try:
        n = (len(weights), len(biases), len(activations))
    except TypeError:
        raise InputError(f"weights, biases and activations must be lists (one entry a layer), "
                         f"got {type(weights).__name__}, {type(biases).__name__}, "
                         f"{type(activations).__name__}") from None
    cdef int L = n[0]
    if L < 1 or L > FP_MAX_LAYERS or n[1] != L or n[2] != L:
        raise InputError(f"need 1..{FP_MAX_LAYERS} layers with one bias and activation each")
    try:
        ws = [np.ascontiguousarray(w, dtype=np.float32) for w in weights]
        bs = [np.ascontiguousarray(b, dtype=np.float32) for b in biases]
    except (TypeError, ValueError) as exc:
        raise InputError(f"weights and biases must be numeric arrays: {exc}") from None
    for i in range(L):
        if ws[i].ndim != 2 or bs[i].shape != (ws[i].shape[0],) or (
                i and ws[i].shape[1] != ws[i - 1].shape[0]):
            raise InputError(f"layer {i}: weight {ws[i].shape} / bias {bs[i].shape} do not chain")
        # the C packer refuses these too, but only as a failed allocation would
        if not (1 <= ws[i].shape[0] <= 65536 and 1 <= ws[i].shape[1] <= 65536):
            raise InputError(f"layer {i}: weight shape {ws[i].shape} outside 1..65536")
        # a NaN/Inf weight is no weight: the int8 packer's max|row| skips a NaN, which then
        # rounds to -127 (a silent -max|row|), and bf16 makes every output NaN
        for what, a in (("weight", ws[i]), ("bias", bs[i])):
            if not np.all(np.isfinite(a)):
                at = tuple(int(j) for j in np.argwhere(~np.isfinite(a))[0])
                raise InputError(f"layer {i}: {what} holds {float(a[at])!r} at index {at}; "
                                 f"weights and biases must be finite")
        if not isinstance(activations[i], str) or activations[i] not in _ACTS:
            raise InputError(f"layer {i}: unknown activation {activations[i]!r}; expected one of "
                             f"{sorted(_ACTS)}")
    dims = np.ascontiguousarray([ws[0].shape[1]] + [w.shape[0] for w in ws], dtype=np.intc)
    acts = np.ascontiguousarray([_ACTS[a] for a in activations], dtype=np.intc)
    return ws, bs, dims, acts


cdef int _pack_mlp(fp_mlp *m, weights, biases, activations) except -1:
    """fp_mlp_init over float32 copies of the layers; InputError when they do not chain."""
    ws, bs, dims, acts = _mlp_arrays(weights, biases, activations)
    cdef int L = len(ws)
    cdef const float **wp = <const float **>PyMem_Malloc(sizeof(float *) * L)
    cdef const float **bp = <const float **>PyMem_Malloc(sizeof(float *) * L)
    cdef cnp.ndarray t
    cdef int rc
    if wp == NULL or bp == NULL:
        PyMem_Free(wp)
        PyMem_Free(bp)
        raise MemoryError()
    try:
        for i in range(L):
            t = ws[i]
            wp[i] = <const float *>cnp.PyArray_DATA(t)
            t = bs[i]
            bp[i] = <const float *>cnp.PyArray_DATA(t)
        rc = fp_mlp_init(m, L, <const int *>cnp.PyArray_DATA(dims),
                         <const int *>cnp.PyArray_DATA(acts), wp, bp, NULL)
    finally:
        PyMem_Free(wp)
        PyMem_Free(bp)
    if rc != 0:
        raise MemoryError("cannot pack MLP")
    return 0
