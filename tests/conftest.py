"""Fixtures for every test: the kernel-set parameter, the bench loaded as a module, the stand-in
GPU. Plain helpers live in tests/helpers/."""
import os

# one OpenMP thread for the libraries that train reference models (LightGBM, XGBoost,
# scikit-learn): their spinning team waits on a core another process holds, and a
# 2-core host running anything beside the suite turned seconds of training into minutes
os.environ.setdefault("OMP_NUM_THREADS", "1")

import signal  # noqa: E402

import pytest  # noqa: E402

# A runner started under nohup, or as a background job of a script, ignores SIGHUP or SIGINT,
# and every process a test starts inherits that: a server or command the test stops with one
# of them never stops. Caught here instead: a caught signal is back at its default after exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, lambda *_: None)

from helpers.builders import ALL_ISAS, BENCH, ISAS  # noqa: E402
from helpers.fake_cuda import fake_fatbin, fake_gpu  # noqa: F401,E402  (fixtures)


@pytest.fixture(autouse=True)
def _gpu_probe_forgets_stand_ins():
    """gpu_status() caches its answer: one taken while a test's stand-in pycuda was installed
    said "usable GPU" to every later test in the process. Set up before monkeypatch, this
    clears the cache after monkeypatch has taken the stand-in away."""
    yield
    from fastpath.gpu import gpu_status
    gpu_status.cache_clear()


@pytest.fixture(scope="session")
def bench():
    """(run, _report): bench/run.py loaded as a module, with the bench/_report.py it imports
    (bench/ is on sys.path only while it loads), for tests of the bench's own logic."""
    import importlib.util
    import sys
    sys.path.insert(0, BENCH)
    try:
        spec = importlib.util.spec_from_file_location("fastpath_bench_run",
                                                      os.path.join(BENCH, "run.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        import _report
    finally:
        sys.path.remove(BENCH)
    return mod, _report


@pytest.fixture(params=ALL_ISAS)
def isa(request):
    """Each kernel set of the build; a set this CPU (or its OS) cannot run is reported as
    skipped, with the reason, rather than silently left out of the run."""
    if request.param not in ISAS:
        pytest.skip(f"kernel set {request.param} is not supported by this CPU (runs {ISAS})")
    return request.param
