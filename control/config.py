"""Engine configuration, seen from the control plane: the schema and its parsing live in
fastpath.config (the engine receives a resolved configuration and does not import the control
plane); every name is re-exported here.
"""
from fastpath.config import (BACKENDS, GPU_AUTO, GPU_MODES, POLICIES, SIMD_CHOICES, WEIGHTS,
                             CacheConfig, EngineConfig, GpuConfig, MemoryConfig, PlacementConfig,
                             ServeConfig, check_priority, load_config, read_toml)

__all__ = ["BACKENDS", "GPU_AUTO", "GPU_MODES", "POLICIES", "SIMD_CHOICES", "WEIGHTS",
           "CacheConfig", "EngineConfig", "GpuConfig", "MemoryConfig", "PlacementConfig",
           "ServeConfig", "check_priority", "load_config", "read_toml"]
