"""Builders shared by the tests: the kernel sets this CPU runs, random models, engine configs."""
import os

import numpy as np

from fastpath._engine import all_isas, supported_isas
from fastpath.model import CachePolicy, FeatureSpec, Layer, Model

ISAS = supported_isas()          # the sets this CPU runs (loops inside a test)
ALL_ISAS = all_isas()            # every set the build has: the fixture's parameters
ACTS = ("identity", "relu", "tanh", "sigmoid")
BENCH = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
DATA_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data",
                        "binance-btcusdt-2024-08-08")


def random_model(rng, dims, acts=None, fs=None, policy=None, scale=1.0):
    acts = acts or ["relu"] * (len(dims) - 2) + ["identity"]
    layers = []
    for i in range(len(dims) - 1):
        w = rng.standard_normal((dims[i + 1], dims[i])).astype(np.float32) * scale / np.sqrt(dims[i])
        b = rng.standard_normal(dims[i + 1]).astype(np.float32) * 0.1
        layers.append(Layer(w, b, acts[i]))
    # test models cache explicitly (a model without a fitted policy runs with the cache off)
    return Model(tuple(layers), fs, policy or CachePolicy(enabled=True))


def windowed_model(rng, raw_len=40, n_z=20, w_fields=(1, 5, 9), window=5, hidden=(16,)):
    z = rng.choice(raw_len, n_z, replace=False)
    nf = n_z + 2 * len(w_fields)
    fs = FeatureSpec(raw_len, z, np.array(w_fields), window,
                     rng.standard_normal(nf).astype(np.float32) * 0.1,
                     (0.5 + rng.random(nf)).astype(np.float32))
    return random_model(rng, [nf, *hidden, 2], fs=fs)


def engine_cfg(isa, **cache):
    cfg = {"engine": {"simd": isa, "n_symbols": 16}}
    if cache:
        cfg["cache"] = cache
    return cfg


def strip_fastpath_record(path):
    """The .onnx at path as another exporter writes it: Model.to_onnx's fastpath record
    (metadata_props, which carries the head, weights, cache policy and meta) taken out, so
    Model.from_onnx reads the graph alone."""
    import onnx
    g = onnx.load(str(path))
    del g.metadata_props[:]
    onnx.save(g, str(path))
    return path
