"""Review 33 (onnxmeta): the record Model.to_onnx writes into metadata_props ("fastpath.model")
had no checksum of its own: the graph's weights were digested, the record was not. A record
damaged in a way that stays valid JSON of the right kinds (one digit of the cache policy's
cos_threshold, of a z-score mean) was read as that value, and the engine served other
signals (a looser cache, other features) without an error, the very failure the record was
made to prevent. to_onnx now writes the record's sha256 beside it ("fastpath.model.sha256");
from_onnx refuses a record that does not match it, and a digest without its record. A record
without a digest (a file written before it existed) reads as before."""
import hashlib
import json

import numpy as np
import pytest

from fastpath import Model, ModelError
from fastpath.model import CachePolicy
from fastpath.tuning import calibrate

onnx = pytest.importorskip("onnx")

from helpers.models import _mlp  # noqa: E402 - after the skip, as the module needs onnx

KEY = "fastpath.model"
SUM = "fastpath.model.sha256"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    m = calibrate(_mlp(), np.random.default_rng(3).standard_normal((60, 8)), [0, 1, 2, 3],
                  [4, 5], window=4)
    m = Model(m.layers, m.feature_spec, CachePolicy(True, 0.999, 0.1, 10**6, 4, 0.05),
              {"a": 1}, "none", m.head_spec, weights="fp32")
    p = tmp_path_factory.mktemp("om33") / "m.onnx"
    m.to_onnx(p)
    return p, m


def _props(path) -> dict:
    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}


def _write(src, dst, props: list):
    m = onnx.load(str(src))
    del m.metadata_props[:]
    for k, v in props:
        m.metadata_props.add(key=k, value=v)
    onnx.save(m, str(dst))
    return dst


def test_to_onnx_writes_the_records_sha256_beside_it(written):
    p, m = written
    props = _props(p)
    assert set(props) == {KEY, SUM}
    assert props[SUM] == hashlib.sha256(props[KEY].encode("utf-8")).hexdigest()
    assert Model.from_onnx(p) == m


@pytest.mark.parametrize("edit", ["cos_threshold", "mean", "head_scale"])
def test_a_value_changed_inside_a_valid_record_is_refused(written, tmp_path, edit):
    """Each edit keeps the record valid (the old code served the changed model); the digest
    written with it no longer matches."""
    p, m = written
    props = _props(p)
    text = props[KEY]
    rec = json.loads(text)
    if edit == "cos_threshold":
        old = json.dumps(rec["cache_policy"]["cos_threshold"])
        assert old == "0.999" and text.count(old) == 1
        text2 = text.replace(old, "0.9")                 # a far looser cache
    elif edit == "mean":
        # the z-score means are base64 float32 bytes: flip one bit of one mean's mantissa
        import base64
        data = bytearray(base64.b64decode(rec["data"]))
        off = next(e for e in rec["arrays"] if e["name"] == "fs.mean")["offset"]
        data[off + 1] ^= 0x04
        text2 = text.replace(rec["data"], base64.b64encode(bytes(data)).decode("ascii"))
    else:
        old = json.dumps(rec["head"]["scale"])
        text2 = text.replace(f'"scale": {old}', f'"scale": {json.loads(old) * 2!r}')
    assert text2 != text
    bad = _write(p, tmp_path / "edited.onnx", [(KEY, text2), (SUM, props[SUM])])
    # without the digest the same record is read as written (a file from before it existed)
    plain = Model.from_onnx(_write(p, tmp_path / "plain.onnx", [(KEY, text2)]))
    assert plain != m
    with pytest.raises(ModelError, match=r"edited\.onnx: fastpath's record .* does not match "
                                         r"its sha256 \('fastpath\.model\.sha256'\)"):
        Model.from_onnx(bad)


def test_a_digest_without_its_record_is_refused(written, tmp_path):
    p, _ = written
    props = _props(p)
    bad = _write(p, tmp_path / "stripped.onnx", [(SUM, props[SUM])])
    with pytest.raises(ModelError, match=r"stripped\.onnx: .*digest of fastpath's record .* "
                                         r"but not the record"):
        Model.from_onnx(bad)


def test_a_digest_given_twice_is_refused(written, tmp_path):
    p, _ = written
    props = _props(p)
    bad = _write(p, tmp_path / "twice.onnx",
                 [(KEY, props[KEY]), (SUM, props[SUM]), (SUM, props[SUM])])
    with pytest.raises(ModelError, match=r"'fastpath\.model\.sha256' 2 times"):
        Model.from_onnx(bad)


def test_a_record_without_a_digest_reads_as_before(written, tmp_path):
    p, m = written
    props = _props(p)
    assert Model.from_onnx(_write(p, tmp_path / "old.onnx", [(KEY, props[KEY])])) == m
