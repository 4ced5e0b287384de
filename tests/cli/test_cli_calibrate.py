"""`fastpath calibrate`'s inputs: unreadable, empty or cut files named by their option, empty
field lists, bad timestamps named as the option typed, symbols no engine holds, reduced weights
or a refit scale it refuses, and what it says of a tree's weights.
"""

import numpy as np
import pytest

from fastpath.cli import main

from helpers.models import F32, _onnx


def _npy_cuts():
    import io

    import numpy as np
    a = np.zeros((3, 256), np.float32)
    npy, npz = io.BytesIO(), io.BytesIO()
    np.save(npy, a)
    np.savez(npz, a=a)
    return {"empty": b"", "text": b"abc\n", "npy-cut-3": npy.getvalue()[:3],
            "npz-cut-100": npz.getvalue()[:100], "npz-cut-30": npz.getvalue()[:30]}


@pytest.mark.parametrize("name", sorted(_npy_cuts()))
@pytest.mark.parametrize("option", ["--ticks", "--symbols"])
def test_calibrate_empty_or_cut_npy_is_exit_2_naming_the_file(name, option, tmp_path, capsys):
    """An empty, cut or text .npy file gave a traceback (EOFError, BadZipFile, allow_pickle), not
    exit 2 naming it."""
    import numpy as np
    from fastpath._build import DEMO_MODEL
    bad = tmp_path / f"{name}.npy"
    bad.write_bytes(_npy_cuts()[name])
    good = tmp_path / "ticks.npy"
    np.save(good, np.zeros((3, 256), np.float32))
    files = {"--ticks": str(good), "--symbols": None, option: str(bad)}
    argv = ["calibrate", "--model", DEMO_MODEL, "--out", str(tmp_path / "o.fpm")]
    for k, v in files.items():
        if v is not None:
            argv += [k, v]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{bad} is not a numpy .npy file" in err and "pickle" not in err, err
    assert not (tmp_path / "o.fpm").exists()


@pytest.mark.parametrize("opt", ["--ticks", "--symbols", "--ts"])
def test_an_unreadable_input_file_names_its_option(tmp_path, capsys, opt):
    from fastpath.cli import main
    p = _onnx(tmp_path, 1, "one.onnx")
    np.save(tmp_path / "t.npy", np.ones((20, 6), F32))
    args = {"--ticks": str(tmp_path / "t.npy")}
    args[opt] = str(tmp_path / "missing.npy")
    argv = ["calibrate", "--model", str(p), "--out", str(tmp_path / "c.fpm"), "--z-fields",
            "0-5", "--window-fields", "none"]
    for k, v in args.items():
        argv += [k, v]
    if opt == "--ts":
        argv += ["--max-error", "0.01"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"fastpath calibrate: {opt} '{tmp_path / 'missing.npy'}': cannot read it (No such " \
           f"file or directory)" in err
    (tmp_path / "adir.npy").mkdir()
    args[opt] = str(tmp_path / "adir.npy")
    argv[argv.index(opt) + 1] = args[opt]
    assert main(argv) == 2
    assert f"{opt} '{tmp_path / 'adir.npy'}': cannot read it (Is a directory)" in \
        capsys.readouterr().err
    assert not (tmp_path / "c.fpm").exists()


@pytest.mark.parametrize("weights", ["fp32", "int8"])
def test_weights_option_on_a_tree(tmp_path, capsys, weights):
    """--weights fp32 on a tree ensemble spoke of "fp32 hidden layers"; a reduced set (int8) is
    refused before the fit, naming what it packs."""
    pytest.importorskip("onnx")
    from fastpath.cli import main
    from helpers.models import _tree_onnx
    p = _tree_onnx(tmp_path)
    ticks = (np.random.default_rng(3).standard_normal((40, 6)).astype(F32) if weights == "fp32"
             else np.ones((20, 6), F32))
    np.save(tmp_path / "t.npy", ticks)
    rc = main(["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(p), "--out",
               str(tmp_path / "c.fpm"), "--z-fields", "0-5", "--window-fields", "none",
               "--features", "raw", "--weights", weights])
    cap = capsys.readouterr()
    if weights == "fp32":
        assert rc == 0
        assert "hidden layers" not in cap.out
        assert "weights: fp32 (a tree ensemble's float32 thresholds and leaves" in cap.out
    else:
        assert rc == 2
        assert "--weights int8 packs an MLP's hidden layers" in cap.err
        assert "feature spec:" not in cap.out            # said before the fit, not after it


def _calibrate_files(tmp_path, n_in=128):
    """256-wide ticks (whose default --window-fields is lob.WINDOW_FIELDS) and an MLP taking
    n_in features."""
    from helpers.builders import random_model
    from fastpath import lob
    raws = np.ascontiguousarray(lob.raw_from_book(lob.generate_stream(300, 2, seed=3)))
    np.save(tmp_path / "t.npy", raws)
    random_model(np.random.default_rng(3), [n_in, 8, 2]).save(tmp_path / "m.fpm")
    return ["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(tmp_path / "m.fpm"),
            "--out", str(tmp_path / "o.fpm")]


@pytest.mark.parametrize("option,value", [("--window-fields", ""), ("--window-fields", "  "),
                                          ("--window-fields", ","), ("--z-fields", ""),
                                          ("--z-fields", " , ")])
def test_an_empty_field_list_is_a_usage_error(tmp_path, capsys, option, value):
    """An empty --window-fields or --z-fields (an unset shell variable) was taken silently as no
    fields."""
    base = _calibrate_files(tmp_path)
    assert main(base + [option, value]) == 2
    err = capsys.readouterr().err
    assert f"{option} {value!r} names no field" in err and "'none'" in err, err
    assert not (tmp_path / "o.fpm").exists()


def test_none_says_no_fields(tmp_path, capsys):
    from fastpath.model import Model
    base = _calibrate_files(tmp_path)
    assert main(base + ["--window-fields", "none"]) == 0, capsys.readouterr().err
    fs = Model.load(tmp_path / "o.fpm").feature_spec
    assert len(fs.w_idx) == 0 and len(fs.z_idx) == 128
    # a model over window features only: --z-fields none
    base = _calibrate_files(tmp_path, n_in=6)
    assert main(base + ["--z-fields", "NONE", "--window-fields", "40,60,61"]) == 0, \
        capsys.readouterr().err
    fs = Model.load(tmp_path / "o.fpm").feature_spec
    assert len(fs.z_idx) == 0 and list(fs.w_idx) == [40, 60, 61]


def _ts_files(tmp_path, ts, policy=None):
    """Small ticks (20 fields, no default window fields), an MLP over 14 of them, and the
    stamps `ts` (None: no file)."""
    from helpers.builders import random_model
    rng = np.random.default_rng(5)
    raws = (rng.standard_normal((60, 20)) * 4 + 3).astype(np.float32)
    np.save(tmp_path / "t.npy", raws)
    random_model(rng, [14, 8, 2], policy=policy).save(tmp_path / "m.fpm")
    args = ["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(tmp_path / "m.fpm"),
            "--out", str(tmp_path / "o.fpm"), "--z-fields", "0-13", "--max-error", "0.05",
            "--holdout", "0"]
    if ts is not None:
        np.save(tmp_path / "ts.npy", ts)
        args += ["--ts", str(tmp_path / "ts.npy")]
    return args


def _stamps(kind):
    ts = np.arange(60, dtype=np.int64) * 1000
    if kind == "negative":
        ts[7] = -1
    elif kind == "backwards":
        ts[9] = ts[3]
    elif kind == "past int64":
        ts = ts.astype(np.uint64)
        ts[11] = np.uint64(2 ** 63 + 5)
    return ts


@pytest.mark.parametrize("kind,says", [("negative", "row 7 is -1"),
                                       ("backwards", "row 9 (3000) is earlier than row 8"),
                                       ("past int64", "row 11 is 9223372036854775813")])
def test_bad_ts_is_named_as_the_option_typed(tmp_path, capsys, kind, says):
    """A bad --ts file was reported as ts_ns, the Python argument, not the option the user typed."""
    assert main(_ts_files(tmp_path, _stamps(kind))) == 2
    err = capsys.readouterr().err
    assert "ts_ns" not in err and "--ts" in err and says in err, err
    assert not (tmp_path / "o.fpm").exists()


def test_the_python_api_still_says_ts_ns(tmp_path):
    from fastpath.errors import InputError
    from fastpath.model import Model
    _ts_files(tmp_path, None)
    m = Model.load(tmp_path / "m.fpm")
    raws = np.ascontiguousarray(np.load(tmp_path / "t.npy")[:, :14])
    for kind, says in [("negative", "ts_ns must be >= 0, row 7 is -1"),
                       ("backwards", "ts_ns row 9 (3000) is earlier than row 8")]:
        with pytest.raises(InputError, match=r"^" + says.replace("(", r"\(").replace(")", r"\)")):
            m.fit_cache_policy(raws, None, max_error=0.05, ts_ns=_stamps(kind))


def test_the_age_guard_note_names_ts(tmp_path, capsys):
    """The note for an age guard no tick passes told a command user to give ts_ns instead of
    --ts."""
    from fastpath.model import CachePolicy
    args = _ts_files(tmp_path, None, policy=CachePolicy(True, 0.999, 0.02, 1000, 16))
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "max_age_ns 1000" in out and "--ts" in out and "ts_ns" not in out, out


def test_calibrate_refuses_any_scale_it_would_refit(tmp_path, capsys):
    from fastpath.cli import main
    p = _onnx(tmp_path, 1, "one.onnx")
    np.save(tmp_path / "t.npy", np.ones((50, 6), F32))
    # @1 is refused as any other scale would be: calibrate would refit it
    assert main(["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(p), "--out",
                 str(tmp_path / "c.fpm"), "--z-fields", "0-5", "--window-fields", "none",
                 "--head", "regression@1"]) == 2
    assert "calibrate fits the regression head's scale" in capsys.readouterr().err


@pytest.mark.parametrize("bad,hint", [(1 << 22, False), (1_700_000_000_000_082_944, True)])
def test_calibrate_refuses_symbols_no_engine_holds(tmp_path, capsys, bad, hint):
    """The --ts file given as --symbols was taken: each tick its own symbol, every rolling
    window fitted on one tick, exit 0."""
    from fastpath.cli import main
    p = _onnx(tmp_path, 1, "one.onnx")
    np.save(tmp_path / "t.npy", (np.random.default_rng(1).standard_normal((40, 6)) + 5).astype(F32))
    syms = np.zeros(40, np.int64)
    syms[7] = bad
    np.save(tmp_path / "s.npy", syms)
    assert main(["calibrate", "--ticks", str(tmp_path / "t.npy"), "--symbols",
                 str(tmp_path / "s.npy"), "--model", str(p), "--out", str(tmp_path / "c.fpm"),
                 "--z-fields", "0-3", "--window-fields", "4,5"]) == 2
    err = capsys.readouterr().err
    assert f"holds symbol {bad}; symbols are ids 0..{(1 << 22) - 1}" in err
    assert ("they go to --ts" in err) == hint
    assert not (tmp_path / "c.fpm").exists()
