"""fastpath.control: the control plane. Pure Python; it runs before the first tick and beside
the hot path, never on it, and reports what it asked for, what the host granted and why.

    from fastpath import control
    rep = control.place("fastpath.toml")     # pin this thread, ask for SCHED_FIFO; a report
    print("\n".join(rep.lines()))
    control.doctor.run_checks()              # host readiness, as `fastpath doctor --json`
"""
from fastpath.control import doctor
from fastpath.control.config import (CacheConfig, EngineConfig, MemoryConfig, PlacementConfig,
                                     load_config)
from fastpath.control.host import Host, read_topology
from fastpath.control.memory import allocate
from fastpath.control.placement import choose_core, place

__all__ = ["CacheConfig", "EngineConfig", "MemoryConfig", "PlacementConfig", "load_config",
           "Host", "read_topology", "allocate", "choose_core", "place", "doctor"]
