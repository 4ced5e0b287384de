"""Models with an input scaler (Model.input_scaler) and price-level inputs for them."""
import numpy as np

from fastpath.model import CachePolicy, Layer, Model
from fastpath.model.types import InputScaler

F = np.float32


def scaler_mlp(offset=65000.0, scale=2.0, n=6, seed=0):
    rng = np.random.default_rng(seed)
    layers = (Layer(rng.standard_normal((8, n)).astype(F), np.zeros(8, F), "relu"),
              Layer(rng.standard_normal((2, 8)).astype(F), np.zeros(2, F), "identity"))
    sc = InputScaler(np.full(n, offset, F), np.full(n, scale, F))
    return Model(layers, None, CachePolicy(enabled=False), input_scaler=sc)


def prices(n, width=6, seed=1):
    return (65000 + np.random.default_rng(seed).uniform(-0.5, 0.5, (n, width))).astype(F)
