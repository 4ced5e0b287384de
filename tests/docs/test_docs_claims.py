"""What the configuration reference says a key does, the engine does."""
import pytest


def test_the_configs_backend_key_is_honoured_by_engine_with_a_config():
    """docs/configuration.md: `backend = "cpu" | "gpu" | "auto"` in [engine], used through
    `fastpath.Engine(model, config=...)`. Engine's backend defaulted to "cpu", which overrode
    the file: backend = "auto" or "gpu" there ran on the CPU, silently, and backend_reason said
    "cpu requested". An explicit backend= still wins over the config."""
    import fastpath
    from fastpath._build import DEMO_MODEL
    from fastpath.errors import BackendError
    e = fastpath.Engine(DEMO_MODEL, config={"engine": {"backend": "auto"}})
    assert e.backend_reason.startswith("auto:"), e.backend_reason
    ok, _why = fastpath.gpu_status()
    if not ok:
        with pytest.raises(BackendError, match="backend='gpu' is not available"):
            fastpath.Engine(DEMO_MODEL, config={"engine": {"backend": "gpu"}})
    e = fastpath.Engine(DEMO_MODEL, "cpu", config={"engine": {"backend": "gpu"}})
    assert (e.backend, e.backend_reason) == ("cpu", "cpu requested")
    e = fastpath.Engine(DEMO_MODEL)              # no config: the default config's "cpu"
    assert (e.backend, e.backend_reason) == ("cpu", "cpu requested")
