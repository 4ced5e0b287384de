"""The peers fastpath is compared with: the same MLP, one tick at a time, from Python: the
model's layers and its post transform, on the first layer's inputs (features precomputed).

Each peer is (name, fn(features float32[n_feat]) -> outputs, version or reason). A missing
package gives fn None and the reason, and the bench prints a line saying it was skipped.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import replace

import numpy as np


def numpy_peer(model):
    """The MLP alone, as the other peers run it: its layers and the model's post transform
    (softmax, logistic2), what fastpath's inference stage computes, where onnxruntime's graph
    (Model.to_onnx writes the post transform) and the torch module end too. The head is left
    out: it is not part of the "MLP only" figure."""
    layers = [(l.weight.T.copy(), l.bias, l.activation) for l in model.layers]
    post = model.post

    def fn(x):
        h = x[None, :]
        for w, b, act in layers:
            h = h @ w + b
            if act == "relu":
                h = np.maximum(h, 0)
            elif act == "tanh":
                h = np.tanh(h)
            elif act == "sigmoid":
                h = 0.5 * (1 + np.tanh(0.5 * h))       # the logistic, without exp overflow
        h = h[0]
        if post == "softmax":
            e = np.exp(h - h.max())
            h = e / e.sum()
        elif post == "logistic2":
            p = 0.5 * (1 + np.tanh(0.5 * h))
            h = np.concatenate([1 - p, p])
        return h
    return fn


def onnxruntime_peer(model):
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return None, f"onnxruntime not installed ({exc}); pip install 'fastpath[bench]'"
    if importlib.util.find_spec("onnx") is None:     # Model.to_onnx writes with it
        return None, "onnx not installed; pip install 'fastpath[bench]'"
    # the peers run the layers on the first layer's inputs (the feature stage's output, an
    # imported model's input scaler already applied): exported with its scaler, onnxruntime
    # would apply it a second time
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # onnxruntime holds the model once built, so the exported files are removed at once
    tmp = tempfile.mkdtemp(prefix="fastpath-bench-")
    try:
        path = os.path.join(tmp, "model.onnx")
        (model if model.input_scaler is None else replace(model, input_scaler=None)).to_onnx(path)
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    run = sess.run

    def fn(x):
        return run(None, {"features": x[None, :]})[0][0]
    return fn, ort.__version__


def _Logistic2(torch):
    """The logistic2 post transform as a torch module: [1 - sigmoid(x), sigmoid(x)]."""
    class Logistic2(torch.nn.Module):
        def forward(self, x):
            p = torch.sigmoid(x)
            return torch.cat([1 - p, p], dim=-1)
    return Logistic2()


def torch_peer(model):
    try:
        import torch
    except ImportError as exc:
        return None, f"torch not installed ({exc})"
    torch.set_num_threads(1)
    mods = []
    for l in model.layers:
        lin = torch.nn.Linear(l.weight.shape[1], l.weight.shape[0])
        with torch.no_grad():
            # torch.tensor copies: a model's arrays are read-only, and torch warns on (and
            # cannot guarantee) a tensor over a buffer it may not write
            lin.weight.copy_(torch.tensor(l.weight))
            lin.bias.copy_(torch.tensor(l.bias))
        mods.append(lin)
        act = {"relu": torch.nn.ReLU(), "tanh": torch.nn.Tanh(), "sigmoid": torch.nn.Sigmoid()}
        if l.activation in act:
            mods.append(act[l.activation])
    if model.post == "softmax":
        mods.append(torch.nn.Softmax(dim=-1))
    elif model.post == "logistic2":
        mods.append(_Logistic2(torch))
    net = torch.nn.Sequential(*mods).eval()

    def fn(x):
        with torch.inference_mode():
            return net(torch.from_numpy(x)[None, :])[0].numpy()
    return fn, torch.__version__


def make_peers(model):
    yield "numpy", numpy_peer(model), np.__version__
    for name, make in (("onnxruntime", onnxruntime_peer), ("torch", torch_peer)):
        fn, info = make(model)
        yield name, fn, info
