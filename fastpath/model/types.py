"""The model types under their former module path: Model (model.py), Layer (layer.py),
FeatureSpec and InputScaler (features.py), CachePolicy (policy.py), Head (head.py) and the
limits they check. New code imports them from fastpath.model."""
from fastpath.model._arrays import MAX_WIDTH, _feature_rows
from fastpath.model.features import FeatureSpec, InputScaler, window_pre_features
from fastpath.model.head import HEAD_KINDS, PROB_TOL, Head
from fastpath.model.layer import ACTIVATIONS, Layer
from fastpath.model.model import MAX_LAYERS, POSTS, WEIGHT_TYPES, Model
from fastpath.model.policy import CACHE_KEYS, CachePolicy, validate_cache_policy

__all__ = ["Model", "Layer", "FeatureSpec", "InputScaler", "CachePolicy", "Head",
           "ACTIVATIONS", "CACHE_KEYS", "HEAD_KINDS", "MAX_LAYERS", "MAX_WIDTH", "POSTS",
           "PROB_TOL", "WEIGHT_TYPES", "validate_cache_policy", "window_pre_features",
           "_feature_rows"]
