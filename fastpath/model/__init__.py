"""fastpath.model: what a model is (types), how it is stored (bundle: .fpm) and how it comes
from and goes to ONNX (onnx_import, onnx_export). Fitting a cache policy to data lives in
fastpath.tuning, since it replays ticks through the engine. A Model is either dense layers
or a tree ensemble (trees: TreeEnsemble).

    from fastpath.model import Model, Layer, FeatureSpec, CachePolicy, Head, TreeEnsemble
"""
from fastpath.model.types import (ACTIVATIONS, CACHE_KEYS, HEAD_KINDS, MAX_LAYERS, MAX_WIDTH,
                                  POSTS, CachePolicy, FeatureSpec, Head, InputScaler, Layer, Model,
                                  validate_cache_policy,
                                  window_pre_features)
from fastpath.model.trees import TreeEnsemble

__all__ = ["Model", "Layer", "TreeEnsemble", "FeatureSpec", "InputScaler", "CachePolicy", "Head",
           "HEAD_KINDS", "POSTS",
           "CACHE_KEYS", "ACTIVATIONS",
           "MAX_LAYERS", "MAX_WIDTH", "validate_cache_policy", "window_pre_features"]
