"""Model.from_onnx(path, head=...) on a file holding fastpath's record: a head the caller got
wrong is named as the caller's (as the bundle reader and the plain ONNX import name it), not
as a damaged record; a record that does not build on its graph is still named as the
record's."""
import json

import numpy as np
import pytest

from fastpath import Model, ModelError
from fastpath.model import Head, Layer

onnx = pytest.importorskip("onnx")

F = np.float32
RECORD = "fastpath record"


def _model():
    rng = np.random.default_rng(31)
    layers = (Layer(rng.standard_normal((6, 8)).astype(F) / 3, np.zeros(6, F), "relu"),
              Layer(rng.standard_normal((3, 6)).astype(F) / 3, np.zeros(3, F), "identity"))
    return Model(layers, head_spec=Head("regression", 2.0, (2,)))


@pytest.fixture()
def files(tmp_path):
    m = _model()
    onnx_path, fpm_path = tmp_path / "m.onnx", tmp_path / "m.fpm"
    m.to_onnx(onnx_path)
    m.save(fpm_path)
    return m, onnx_path, fpm_path


@pytest.mark.parametrize("head,match", [
    ("regression", "head must be a fastpath.model.Head, got str"),
    (Head("regression", 1.0, (5,)), "reads output(s) [5] but the model has 3 output(s)"),
    (Head("classifier3"), "reads class probabilities"),
])
def test_a_wrong_head_given_is_the_callers_not_the_records(files, head, match):
    _, onnx_path, fpm_path = files
    with pytest.raises(ModelError) as ei:
        Model.from_onnx(onnx_path, head=head)
    msg = str(ei.value)
    assert msg.startswith(f"{onnx_path}: ") and match in msg, msg
    assert RECORD not in msg and "does not fit its graph" not in msg, msg
    # as the bundle reader says it
    with pytest.raises(ModelError, match=r"^" + str(fpm_path).replace("\\", "\\\\")) as eb:
        Model.load(fpm_path, head=head)
    assert match in str(eb.value)


def test_a_stored_head_that_does_not_fit_still_takes_the_head_given(files, tmp_path):
    # the record's head reads an output the graph lacks: refused alone, named as the record's;
    # with a head given, that head is served (as Model.load(head=) reads such a bundle)
    _, onnx_path, _ = files
    m = onnx.load(str(onnx_path))
    props = {p.key: p.value for p in m.metadata_props}
    rec = json.loads(props["fastpath.model"])
    rec["head"]["outputs"] = [7]
    del m.metadata_props[:]
    onnx.helper.set_model_props(m, {"fastpath.model": json.dumps(rec)})
    bad = tmp_path / "bad.onnx"
    onnx.save(m, str(bad))
    with pytest.raises(ModelError, match="does not fit its graph") as ei:
        Model.from_onnx(bad)
    assert RECORD in str(ei.value)
    h = Head("regression", 1.0, (1,))
    assert Model.from_onnx(bad, head=h).head_spec == h
    # and a head given that does not fit either: still the record's (its own head failed first)
    with pytest.raises(ModelError, match="does not fit its graph"):
        Model.from_onnx(bad, head=Head("regression", 1.0, (9,)))


def test_calibrate_names_the_head_option_not_the_record(files, tmp_path, capsys):
    # `fastpath calibrate --model m.onnx --head regression:5` said the file's record did not
    # fit its graph
    from fastpath.cli import main
    _, onnx_path, _ = files
    ticks = tmp_path / "ticks.npy"
    np.save(ticks, np.random.default_rng(0).standard_normal((50, 8)).astype(F))
    rc = main(["calibrate", "--model", str(onnx_path), "--ticks", str(ticks), "--head",
               "regression:5", "--out", str(tmp_path / "out.fpm")])
    err = capsys.readouterr().err
    assert rc == 2 and "reads output(s) [5] but the model has 3 output(s)" in err, err
    assert RECORD not in err, err
