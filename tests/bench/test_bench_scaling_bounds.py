"""bench/scaling.py: the latency bound of an MLP from the measured op latencies, the read/compute
bounds, its argument checks and a partial run."""

import pytest

from helpers.builders import ISAS


# ---------------------------------------------------------------- the bench's latency bound
def _scaling():
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "scaling.py")
    spec = importlib.util.spec_from_file_location("scaling_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LAT = {"fma": 4.0, "mul": 3.0, "add": 2.0, "max": 1.5}


def test_latency_bound_sums_each_layers_critical_path():
    """Per layer: the cheaper product op, ceil(log2 n_in) adds, the activation's op."""
    S = _scaling()
    # 32 inputs: 3 + 5 * 2 + 1.5 (relu); 16 inputs: 3 + 4 * 2 (identity)
    assert S.latency_bound_ns([(32, "relu"), (16, "identity")], LAT) == 3 + 10 + 1.5 + 3 + 8
    assert S.latency_bound_ns([(1, "identity")], LAT) == 3                # one FMA with the bias
    assert S.latency_bound_ns([(17, "identity")], LAT) == 3 + 5 * 2       # 17 needs 5 levels
    # tanh/sigmoid: at least the cheapest op
    assert S.latency_bound_ns([(2, "tanh")], LAT) == 3 + 2 + 1.5
    # an FMA faster than an add joins the sums instead: each level costs the cheaper one
    fast_fma = {"fma": 1.0, "mul": 3.0, "add": 2.0, "max": 1.5}
    assert S.latency_bound_ns([(16, "identity")], fast_fma) == 1 + 4 * 1
    m = S.build_model((32, 16, 2))
    assert S.model_latency_bound(m, LAT) == 3 + 10 + 1.5 + 3 + 8
    assert S.latency_bound_ns([(32, "relu")], {"skipped": "no probe"}) != \
        S.latency_bound_ns([(32, "relu")], {"skipped": "no probe"})       # NaN


def test_bounds_x_max_takes_the_larger_bound():
    S = _scaling()
    b = S.bounds(20.0, fma_ns=4.0, read_ns=5.0, wbytes=1000, l2=1 << 20, lat_ns=8.0)
    assert b["bound"] == "read" and b["x_bound"] == 4.0
    assert b["max_bound"] == "latency" and b["x_max"] == 2.5 and b["x_latency"] == 2.5
    b = S.bounds(20.0, fma_ns=4.0, read_ns=10.0, wbytes=1000, l2=1 << 20, lat_ns=8.0)
    assert b["max_bound"] == "read" and b["x_max"] == 2.0
    b = S.bounds(20.0, fma_ns=4.0, read_ns=10.0, wbytes=1000, l2=1 << 20)
    assert b["max_bound"] is None and b["x_max"] != b["x_max"]


@pytest.mark.parametrize("argv", [["--models", "32x"], ["--models", "16"], ["--models", "0x2"],
                                  ["--sets", "sse9"], ["--weights", "fp64"]])
def test_scaling_cli_refuses_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as e:
        _scaling().main(argv)
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


def test_scaling_partial_run(tmp_path):
    """A run of one model and one set, without peers: every figure is there, the latency bound
    measured or skipped with its reason, and the full table's JSON is left alone."""
    import json
    S = _scaling()
    assert S.main(["--models", "8x4x2", "--sets", ISAS[-1], "--no-peers", "--calls", "100",
                   "--out", str(tmp_path)]) == 0
    assert not (tmp_path / "scaling-latest.json").exists()
    res = json.loads((tmp_path / "scaling-partial.json").read_text())
    assert res["kernel_sets"] == [ISAS[-1]]
    (row,) = res["rows"]
    assert row["dims"] == [8, 4, 2]
    lat = res["machine"]["op_latency_ns"]
    if "skipped" in lat:
        assert "probe" in lat["skipped"]
    else:
        assert set(lat) == {"fma", "mul", "add", "max"} and min(lat.values()) > 0
        assert row["latency_bound_ns"] == pytest.approx(S.latency_bound_ns(
            [(8, "relu"), (4, "identity")], lat))
    if ISAS[-1] != "scalar":
        m = row["fastpath"][ISAS[-1]]["mlp"]
        assert m["ns"] > 0 and m["x_bound"] > 0
