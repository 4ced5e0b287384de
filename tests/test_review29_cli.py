"""Session 29: fastpath calibrate named an unreadable --ticks / --symbols / --ts file only by
errno ("[Errno 2] No such file or directory: 'x'": which of the three?), and said "fp32 hidden
layers" of a tree ensemble given --weights fp32."""
import numpy as np
import pytest

from test_review29_journey import F32, _onnx


@pytest.mark.parametrize("opt", ["--ticks", "--symbols", "--ts"])
def test_an_unreadable_input_file_names_its_option(tmp_path, capsys, opt):
    from fastpath.cli import main
    p = _onnx(tmp_path, 1, "one.onnx")
    np.save(tmp_path / "t.npy", np.ones((20, 6), F32))
    args = {"--ticks": str(tmp_path / "t.npy")}
    args[opt] = str(tmp_path / "missing.npy")
    argv = ["calibrate", "--model", str(p), "--out", str(tmp_path / "c.fpm"), "--z-fields",
            "0-5", "--window-fields", ""]
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


def test_fp32_weights_on_a_tree_say_what_a_tree_holds(tmp_path, capsys):
    pytest.importorskip("onnx")
    from fastpath.cli import main
    from test_review27_heads import _tree_onnx
    p = _tree_onnx(tmp_path)
    np.save(tmp_path / "t.npy", np.random.default_rng(3).standard_normal((40, 6)).astype(F32))
    assert main(["calibrate", "--ticks", str(tmp_path / "t.npy"), "--model", str(p), "--out",
                 str(tmp_path / "c.fpm"), "--z-fields", "0-5", "--window-fields", "",
                 "--features", "raw", "--weights", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "hidden layers" not in out
    assert "weights: fp32 (a tree ensemble's float32 thresholds and leaves" in out
