"""Model -> ONNX: the MLP and its post transform (not the feature stage or the head), so
onnxruntime and other runtimes can check fastpath's outputs (Model.forward) one for one.
Needs the optional `onnx` package."""
from __future__ import annotations

import os

import numpy as np

from fastpath.errors import ModelError


def to_onnx(model, path: str | os.PathLike, opset: int = 17) -> None:
    """Gemm (transB=1) + activation per layer, then the post transform as the importer reads
    it back (softmax: Softmax over axis 1; logistic2: Sigmoid, 1 - p, Concat [1 - p, p]);
    input "features" [N, n_feat], output "out" [N, n_outputs]."""
    try:
        import onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        raise ModelError("writing ONNX needs the onnx package: pip install 'fastpath[onnx]'") from None
    top = onnx.defs.onnx_opset_version()
    # below 7 Gemm wants a broadcast attribute (onnxruntime has no kernel for it); above what
    # the installed onnx knows, the file would carry a number no runtime has defined
    if isinstance(opset, bool) or not isinstance(opset, int) or not 7 <= opset <= top:
        raise ModelError(f"opset must be an int in 7..{top} (this onnx package's newest), got "
                         f"{opset!r}")
    ops = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid"}
    nodes, inits, cur = [], [], "features"
    for i, l in enumerate(model.layers):
        inits += [numpy_helper.from_array(l.weight, f"W{i}"),
                  numpy_helper.from_array(l.bias, f"B{i}")]
        nodes.append(helper.make_node("Gemm", [cur, f"W{i}", f"B{i}"], [f"gemm{i}"], transB=1))
        cur = f"gemm{i}"
        if l.activation in ops:
            nodes.append(helper.make_node(ops[l.activation], [cur], [f"act{i}"]))
            cur = f"act{i}"
    # without the post transform the file would return logits where Model.forward returns
    # probabilities
    if model.post == "softmax":
        nodes.append(helper.make_node("Softmax", [cur], ["probs"], axis=1))
        cur = "probs"
    elif model.post == "logistic2":
        inits.append(numpy_helper.from_array(np.ones(1, np.float32), "one"))
        nodes += [helper.make_node("Sigmoid", [cur], ["p1"]),
                  helper.make_node("Sub", ["one", "p1"], ["p0"]),
                  helper.make_node("Concat", ["p0", "p1"], ["probs"], axis=1)]
        cur = "probs"
    nodes.append(helper.make_node("Identity", [cur], ["out"]))
    g = helper.make_graph(
        nodes, "fastpath_mlp",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", model.dims[0]])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", model.n_outputs])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                          producer_name="fastpath")
    m.ir_version = 8
    onnx.checker.check_model(m)
    dest = os.fspath(path)
    if os.path.isdir(dest):
        raise ModelError(f"Model.to_onnx: {dest!r} is a directory; give the file's name (e.g. "
                         f"{os.path.join(dest, 'model.onnx')!r})")
    # a temp file renamed over `path`, as Model.save writes: a failed write (disk full) must
    # not leave a truncated file that a later Engine(path) reads as a damaged model
    tmp = f"{dest}.tmp{os.getpid()}"
    try:
        onnx.save(m, tmp)
        os.replace(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
