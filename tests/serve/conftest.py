"""Fixtures of the serving tests."""
import numpy as np
import pytest

from helpers.builders import windowed_model


@pytest.fixture
def model():
    """A small MLP over a sliding window (seeded), for tests that compare with a local engine."""
    return windowed_model(np.random.default_rng(7))
