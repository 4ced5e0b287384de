"""fastpath.model: what a model is and how it is stored.

The types are at the bottom, one module each: Model (model), Layer (layer), FeatureSpec and
InputScaler (features), CachePolicy (policy), Head (head), TreeEnsemble (trees). Above them
the file formats, each installing its readers and writers behind the Model methods
(register_format): the native bundle (bundle: .fpm), the ONNX reader (onnx_import, and
onnx_load for Model.from_onnx) and the ONNX writer (onnx_export), with fastpath's record in an
ONNX file (onnx_meta); the native tree loaders (native_lightgbm, native_xgboost,
native_catboost, native_sklearn over native_trees) behind Model.from_lightgbm / from_xgboost /
from_catboost / from_sklearn, and parity() (native_parity) against the library's own
predict. Fitting a cache policy to data lives in fastpath.tuning, since it
replays ticks through the engine.

    from fastpath.model import Model, Layer, FeatureSpec, CachePolicy, Head, TreeEnsemble
"""
from fastpath.model._arrays import MAX_WIDTH
from fastpath.model.features import FeatureSpec, InputScaler, window_pre_features
from fastpath.model.head import HEAD_KINDS, Head
from fastpath.model.layer import ACTIVATIONS, Layer
from fastpath.model.model import MAX_LAYERS, POSTS, Model
from fastpath.model.policy import CACHE_KEYS, CachePolicy, validate_cache_policy
from fastpath.model.trees import TreeEnsemble
# the formats: importing each installs it behind Model.save / load / to_onnx / from_onnx
from fastpath.model import bundle, onnx_export, onnx_load  # noqa: E402,F401  (isort: skip)
from fastpath.model import native_catboost, native_lightgbm, native_sklearn, native_xgboost  # noqa: E402,F401  (isort: skip)
from fastpath.model.native_parity import ParityReport, parity  # noqa: E402  (isort: skip)

__all__ = ["Model", "Layer", "TreeEnsemble", "FeatureSpec", "InputScaler", "CachePolicy", "Head",
           "HEAD_KINDS", "POSTS",
           "CACHE_KEYS", "ACTIVATIONS",
           "MAX_LAYERS", "MAX_WIDTH", "validate_cache_policy", "window_pre_features",
           "parity", "ParityReport"]
