# Included by _make_engine.pxi and _kernels.pyx: a fastpath.model.TreeEnsemble as the C
# description (fp_trees_desc) the packer in csrc/fp_trees.c reads; one place for the
# mapping of its names (aggregate, post transform) to the C enums.

_TREE_AGG = {"SUM": 0, "AVERAGE": 1, "MIN": 2, "MAX": 3}
_TREE_POST = {"NONE": 0, "LOGISTIC": 1, "SOFTMAX": 2, "SOFTMAX_ZERO": 3, "PROBIT": 4}


cdef int _trees_desc(object t, fp_trees_desc *d, list keep) except -1:
    """Fill d from a fastpath.model.TreeEnsemble; the arrays it points into go to `keep`."""
    cdef cnp.ndarray a
    arrs = [np.ascontiguousarray(t.tree_offsets, dtype=np.int32),
            np.ascontiguousarray(t.feature, dtype=np.int32),
            np.ascontiguousarray(t.mode, dtype=np.int32),
            np.ascontiguousarray(t.true_child, dtype=np.int32),
            np.ascontiguousarray(t.false_child, dtype=np.int32),
            np.ascontiguousarray(t.nan_true, dtype=np.uint8),
            np.ascontiguousarray(t.threshold, dtype=np.float32),
            np.ascontiguousarray(t.weight_node, dtype=np.int32),
            np.ascontiguousarray(t.weight_target, dtype=np.int32),
            np.ascontiguousarray(t.weight_value, dtype=np.float32),
            np.ascontiguousarray(t.base_values, dtype=np.float32)]
    keep.extend(arrs)
    memset(d, 0, sizeof(fp_trees_desc))
    d.n_feat = t.n_features
    d.n_targets = t.n_targets
    d.n_trees = t.n_trees
    d.n_nodes = t.n_nodes
    d.n_weights = len(arrs[7])
    d.n_base = len(arrs[10])
    d.aggregate = _TREE_AGG[t.aggregate]
    d.post = _TREE_POST[t.post_transform]
    d.classifier = 1 if t.classifier else 0
    a = arrs[0]; d.tree_off = <const int32_t *>cnp.PyArray_DATA(a)
    a = arrs[1]; d.feat = <const int32_t *>cnp.PyArray_DATA(a)
    a = arrs[2]; d.mode = <const int32_t *>cnp.PyArray_DATA(a)
    a = arrs[3]; d.true_child = <const int32_t *>cnp.PyArray_DATA(a)
    a = arrs[4]; d.false_child = <const int32_t *>cnp.PyArray_DATA(a)
    a = arrs[5]; d.nan_true = <const uint8_t *>cnp.PyArray_DATA(a)
    a = arrs[6]; d.thr = <const float *>cnp.PyArray_DATA(a)
    a = arrs[7]; d.w_node = <const int32_t *>cnp.PyArray_DATA(a)
    a = arrs[8]; d.w_target = <const int32_t *>cnp.PyArray_DATA(a)
    a = arrs[9]; d.w_value = <const float *>cnp.PyArray_DATA(a)
    a = arrs[10]; d.base = <const float *>cnp.PyArray_DATA(a)
    return 0
