# Included by _kernels.pyx and gpu/_protocol.pyx: one way to pack an MLP given as Python lists
# (weights (out, in), biases, activation names) into an fp_mlp for the shims and test devices.

def _mlp_arrays(weights, biases, activations):
    """(float32 weights, biases, dims, activation codes) of an MLP given as lists; InputError
    when they do not chain. Shared with the reduced-precision shim (fastpath._kernels)."""
    cdef int L = len(weights)
    if L < 1 or L > FP_MAX_LAYERS or len(biases) != L or len(activations) != L:
        raise InputError(f"need 1..{FP_MAX_LAYERS} layers with one bias and activation each")
    ws = [np.ascontiguousarray(w, dtype=np.float32) for w in weights]
    bs = [np.ascontiguousarray(b, dtype=np.float32) for b in biases]
    for i in range(L):
        if ws[i].ndim != 2 or bs[i].shape != (ws[i].shape[0],) or (
                i and ws[i].shape[1] != ws[i - 1].shape[0]):
            raise InputError(f"layer {i}: weight {ws[i].shape} / bias {bs[i].shape} do not chain")
        # the C packer refuses these too, but only as a failed allocation would
        if not (1 <= ws[i].shape[0] <= 65536 and 1 <= ws[i].shape[1] <= 65536):
            raise InputError(f"layer {i}: weight shape {ws[i].shape} outside 1..65536")
        if activations[i] not in _ACTS:
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
