"""onnxruntime as the oracle: what a model file means is what onnxruntime computes from it.

A new onnxruntime inference run per call, CPU provider only, float32 in; every model test
compares fastpath with these functions rather than building its own."""
import numpy as np


def ort_runner(path):
    """onnxruntime's InferenceSession for the file, on the CPU provider with one thread (its
    default pool spins on every core, and waits on a core another process holds)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def ort_run(path, x, output=None, fallback=0):
    """All rows in one call, as float32 rows: the chosen output (a name: only that one is
    computed; or an index), or by
    default the classifier's "probabilities" where the graph has one, else output number
    fallback (0: the first; -1: the last, a classifier's scores after its label), or
    "last_float": the last float32 output. A graph whose input has rank 1 takes the one row."""
    s = ort_runner(path)
    x = np.asarray(x, np.float32)
    inp = s.get_inputs()[0]
    feed = {inp.name: x[0] if len(inp.shape) == 1 and len(x) == 1 else x}
    if isinstance(output, str) and output != "last_float":
        # that output alone: another (a classifier's label) may be one onnxruntime cannot make
        return np.asarray(s.run([output], feed)[0], np.float32).reshape(len(x), -1)
    outs = s.run(None, feed)
    names = [o.name for o in s.get_outputs()]
    if output == "last_float":
        return [o for o in outs if o.dtype == np.float32][-1].reshape(len(x), -1)
    if output is None:
        i = names.index("probabilities") if "probabilities" in names else fallback
    else:
        i = names.index(output) if isinstance(output, str) else output
    return np.asarray(outs[i], np.float32).reshape(len(x), -1)


def ort_first(path, x, or_none=False):
    """The first output as onnxruntime returns it (its own shape and type) for x fed whole
    to the first input. or_none: None when onnxruntime cannot load or run the graph (a graph
    it refuses is one fastpath must refuse too), instead of its exception."""
    try:
        s = ort_runner(path)
        return s.run(None, {s.get_inputs()[0].name: x})[0]
    except Exception:  # noqa: BLE001 - any refusal by onnxruntime
        if or_none:
            return None
        raise


def ort_rows(path, x):
    """Row by row (a batch-1 call per row, as the engine serves), flattened; None when
    onnxruntime cannot load or run the graph."""
    try:
        s = ort_runner(path)
        rank = len(s.get_inputs()[0].shape)
        name = s.get_inputs()[0].name
        return np.stack([s.run(None, {name: r if rank == 1 else r[None]})[0].reshape(-1)
                         for r in np.asarray(x, np.float32)])
    except Exception:  # noqa: BLE001 - any refusal by onnxruntime
        return None


def assert_close(got, ref, rtol=1e-5):
    """Within rtol of the output's scale: the dense sums (and the tree leaves) are added in
    another order than onnxruntime's, about one ulp per term."""
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * scale)
