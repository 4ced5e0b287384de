"""onnxruntime as the oracle: what a model file means is what onnxruntime computes from it.

One session per call, CPU provider only, float32 in; every model test compares fastpath with
these functions rather than opening its own session."""
import numpy as np


def ort_session(path):
    import onnxruntime as ort
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def ort_run(path, x, output=None):
    """All rows in one call: the chosen output (a name, an index, or by default the
    classifier's "probabilities" where the graph has one, else the first), as float32 rows."""
    s = ort_session(path)
    x = np.asarray(x, np.float32)
    outs = s.run(None, {s.get_inputs()[0].name: x})
    names = [o.name for o in s.get_outputs()]
    if output is None:
        i = names.index("probabilities") if "probabilities" in names else 0
    else:
        i = names.index(output) if isinstance(output, str) else output
    return np.asarray(outs[i], np.float32).reshape(len(x), -1)


def ort_rows(path, x):
    """Row by row (a batch-1 call per row, as the engine serves), flattened; None when
    onnxruntime cannot load or run the graph."""
    try:
        s = ort_session(path)
        rank = len(s.get_inputs()[0].shape)
        name = s.get_inputs()[0].name
        return np.stack([s.run(None, {name: r if rank == 1 else r[None]})[0].reshape(-1)
                         for r in np.asarray(x, np.float32)])
    except Exception:  # noqa: BLE001 - any refusal by onnxruntime
        return None


def assert_close(got, ref, rtol=1e-5):
    """Within rtol of the output's scale: the dense sums run in another order than
    onnxruntime's, about one ulp per term."""
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * scale)
