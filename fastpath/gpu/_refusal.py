"""Why the GPU stage cannot serve a model: the one place that says which models stay on the CPU.

Its kernels run fp32 dense layers only (fastpath.gpu._pack), so a tree ensemble, bf16/int8
hidden layers or a network deeper than the kernels' layer table is refused with the reason.
"""
from __future__ import annotations

from typing import Any

from fastpath.gpu._pack import MAX_LAYERS


def gpu_refusal(m: Any, cfg: Any = None) -> str | None:
    """Why the GPU stage cannot serve model `m` under config `cfg` (None: the model's own
    weights), or None when it can."""
    if m.trees is not None:
        return ("the model is a tree ensemble; the GPU stage serves fp32 MLPs only (run it with "
                "backend='cpu')")
    cw = getattr(cfg, "weights", None)
    wt = cw or m.weights
    # only hidden layers are packed reduced: a one-layer model runs fp32 whatever it says
    if wt != "fp32" and len(m.layers) > 1:
        who = "engine.weights" if cw else "the model's weights"
        return (f"{who} = {wt!r}; the GPU stage serves fp32 MLPs only (set engine.weights = "
                f"'fp32' for the GPU, or backend='cpu' for {wt})")
    if not 1 <= len(m.layers) <= MAX_LAYERS:
        return (f"the model has {len(m.layers)} layers; the GPU kernels take 1..{MAX_LAYERS} "
                f"(run it with backend='cpu')")
    return None
