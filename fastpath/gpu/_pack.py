"""The model as the CUDA kernels read it (csrc/cuda/fp_mlp.cu): a network table and one float
buffer of weights, row-major per layer. Pure numpy, no pycuda: tested on every machine.

Decision: each layer's rows start on a 32-float (128-byte) boundary of the buffer, so a
warp's first load of a row is one aligned transaction; rows within a layer are contiguous
(in floats each), which the warp reads with stride-1 lanes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastpath.errors import ModelError

MAX_LAYERS = 16
ACT_CODES = {"identity": 0, "relu": 1, "tanh": 2, "sigmoid": 3}
_ALIGN_FLOATS = 32

# struct fp_gpu_layer / fp_gpu_net in fp_mlp.cu (natural alignment gives these offsets)
LAYER_DTYPE = np.dtype([("in", "<i4"), ("out", "<i4"), ("act", "<i4"), ("_pad", "<i4"),
                        ("w_off", "<i8"), ("b_off", "<i8")])
NET_DTYPE = np.dtype([("n_layers", "<i4"), ("n_in", "<i4"), ("n_out", "<i4"),
                      ("max_width", "<i4"), ("layers", LAYER_DTYPE, (MAX_LAYERS,))])
assert LAYER_DTYPE.itemsize == 32 and NET_DTYPE.itemsize == 16 + 32 * MAX_LAYERS


def _up(n: int) -> int:
    return (n + _ALIGN_FLOATS - 1) // _ALIGN_FLOATS * _ALIGN_FLOATS


@dataclass(frozen=True)
class PackedNet:
    net: np.ndarray        # NET_DTYPE, shape (1,): the bytes uploaded as the kernel's table
    weights: np.ndarray    # float32, every layer's weights and bias
    dims: tuple
    acts: tuple
    macs: int

    @property
    def n_in(self) -> int:
        return self.dims[0]

    @property
    def n_out(self) -> int:
        return self.dims[-1]

    @property
    def max_width(self) -> int:
        return int(self.net["max_width"][0])


def pack(layers) -> PackedNet:
    """Pack a sequence of fastpath.model.Layer (weight (out, in), bias, activation)."""
    layers = tuple(layers)
    if not 1 <= len(layers) <= MAX_LAYERS:
        raise ModelError(f"the GPU kernels take 1..{MAX_LAYERS} layers, got {len(layers)}")
    dims = [int(layers[0].weight.shape[1])]
    for i, L in enumerate(layers):
        if L.weight.shape[1] != dims[-1]:
            raise ModelError(f"layer {i} takes {L.weight.shape[1]} inputs, the previous layer "
                             f"gives {dims[-1]}")
        dims.append(int(L.weight.shape[0]))
    net = np.zeros(1, NET_DTYPE)
    net["n_layers"] = len(layers)
    net["n_in"] = dims[0]
    net["n_out"] = dims[-1]
    net["max_width"] = max(dims)
    off = 0
    spans = []
    for i, L in enumerate(layers):
        w_off = off
        b_off = _up(w_off + L.weight.size)
        off = _up(b_off + L.bias.size)
        spans.append((w_off, b_off))
        rec = net["layers"][0, i]
        rec["in"], rec["out"] = dims[i], dims[i + 1]
        rec["act"] = ACT_CODES[L.activation]
        rec["w_off"], rec["b_off"] = w_off, b_off
    w = np.zeros(max(off, 1), np.float32)
    for L, (w_off, b_off) in zip(layers, spans):
        w[w_off:w_off + L.weight.size] = np.ascontiguousarray(L.weight, np.float32).ravel()
        w[b_off:b_off + L.bias.size] = L.bias
    macs = sum(dims[i] * dims[i + 1] for i in range(len(layers)))
    return PackedNet(net, w, tuple(dims), tuple(L.activation for L in layers), macs)


def packed_forward(p: PackedNet, x: np.ndarray) -> tuple:
    """What the kernel computes, read from the packed table and buffer the way the kernel
    indexes them (float32, fma order aside): (outputs (batch, n_out), nonfinite (batch,))."""
    x = np.atleast_2d(np.asarray(x, np.float32))
    bad = np.zeros(x.shape[0], bool)
    h = x
    acts = {0: lambda v: v, 1: lambda v: np.maximum(v, np.float32(0)), 2: np.tanh,
            3: lambda v: (np.float32(1) / (np.float32(1) + np.exp(-v))).astype(np.float32)}
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(int(p.net["n_layers"][0])):
            rec = p.net["layers"][0, i]
            n_in, n_out = int(rec["in"]), int(rec["out"])
            W = p.weights[int(rec["w_off"]):int(rec["w_off"]) + n_in * n_out].reshape(n_out, n_in)
            b = p.weights[int(rec["b_off"]):int(rec["b_off"]) + n_out]
            v = (h @ W.T + b).astype(np.float32)
            bad |= ~np.all(np.isfinite(v), axis=1)
            h = acts[int(rec["act"])](v).astype(np.float32)
    return h, bad
