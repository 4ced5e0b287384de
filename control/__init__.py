"""fastpath.control: the control plane (configuration now; placement, memory and host checks next).

Pure Python. It runs before the first tick and beside the hot path, never on it.
"""
from fastpath.control.config import CacheConfig, EngineConfig, load_config

__all__ = ["CacheConfig", "EngineConfig", "load_config"]
