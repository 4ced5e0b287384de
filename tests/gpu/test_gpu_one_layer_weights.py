"""The GPU stage takes a one-layer model whatever its weights setting (it has no hidden layer for
bf16/int8 to change)."""

import numpy as np

from helpers.builders import random_model


def test_gpu_stage_takes_a_one_layer_model_whatever_its_weights_say():
    """A one-layer model has no hidden layer: bf16/int8 change nothing it runs (the output
    layer stays fp32), yet the GPU check refused it as 'bf16/int8 weights'. A deeper one is
    still refused."""
    from fastpath._build import gpu_refusal
    from fastpath.control.config import load_config
    rng = np.random.default_rng(8)
    one, two = random_model(rng, [8, 2]), random_model(rng, [8, 4, 2])
    for wt in ("bf16", "int8"):
        cfg = load_config({"engine": {"weights": wt}})
        assert gpu_refusal(one, cfg) is None
        assert gpu_refusal(one.with_weights(wt), load_config(None)) is None
        assert "fp32 MLPs only" in gpu_refusal(two, cfg)
