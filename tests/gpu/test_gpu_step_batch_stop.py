"""GpuEngine.step_batch on the stand-in driver: a row behind the engine's last tick applies
no row, and a batch stopped mid way keeps the applied rows' answers."""
import numpy as np
import pytest

from helpers.paths import F, cfg, make_model, make_stream

pytest.importorskip("onnx")


def test_gpu_engine_batch_behind_the_engines_last_tick_applies_no_row(fake_gpu):
    # GpuEngine.step_batch checked time order within the batch only: a row behind the
    # engine's last tick of its symbol was refused after the rows before it were applied
    # ("rows 0..0 were applied", ticks 2), where Engine.step_batch applies none
    from fastpath import InputError
    from fastpath.gpu import GpuEngine
    raws, _, _, _ = make_stream(21, n=4, nan_every=0)
    with GpuEngine(make_model("acts"), cfg(), mode="launch") as ge:
        ge.step(raws[0], 0, 10_000)
        with pytest.raises(InputError, match=r"row 1: .*no row was applied"):
            ge.step_batch(raws[1:3], np.array([1, 0]), np.array([20_000, 500]))
        assert ge.engine.ticks == 1


def test_gpu_engine_batch_stopped_mid_way_keeps_the_applied_rows_answers(fake_gpu):
    # a row the model stage refuses after others were applied: the refusal said how many
    # went in but dropped their answers (Engine.step_batch's carries .applied and .result)
    from fastpath import Engine, InputError
    from fastpath.gpu import GpuEngine
    m = make_model("acts")
    raws, syms, ts, _ = make_stream(22, n=8, nan_every=0)
    bad = raws.copy()
    bad[5] = F(3.4e38)
    want = [Engine(m, config=cfg()).step(r, int(s), int(t)).signal
            for r, s, t in zip(raws[:5], syms[:5], ts[:5])]
    with GpuEngine(m, cfg(), mode="launch", max_batch=2) as ge:
        with pytest.raises(InputError, match=r"rows 0\.\.\d were applied") as ei:
            ge.step_batch(bad, syms, ts)
        # the rows before row 5's launch went in (its launch's features are computed before
        # any of its rows is applied)
        k = ei.value.applied
        assert 1 <= k <= 5 and ge.engine.ticks == k and f"rows 0..{k - 1} were" in str(ei.value)
        got = [r.signal for r in ei.value.result]
        np.testing.assert_allclose(got, want[:k], atol=1e-5)
