"""Bundles (.fpm) to edit by hand: a small MLP and a two-target tree regressor, their bytes,
and the header split / join that leave only the reader's own checks standing."""
import json
import struct
import zlib

import numpy as np

from fastpath import TreeEnsemble
from fastpath.model import CachePolicy, FeatureSpec, Head, Layer, Model
from fastpath.model import bundle as B


def bundle_mlp(rng=None):
    """24 raw fields (two windowed), 24 -> 9 (tanh) -> 2, a set cache policy."""
    rng = rng or np.random.default_rng(0)
    fs = FeatureSpec(24, np.arange(0, 20), np.array([3, 7]), 4,
                     rng.standard_normal(24).astype(np.float32), np.ones(24, np.float32))
    layers = (Layer(rng.standard_normal((9, 24)) * 0.3, rng.standard_normal(9), "tanh"),
              Layer(rng.standard_normal((2, 9)), np.zeros(2), "identity"))
    return Model(layers, fs, CachePolicy(enabled=True, max_age_ns=1000, max_run=3))


def bundle_tree_model():
    """A two-target regressor over 6 features: one split, two leaves."""
    t = TreeEnsemble(6, 2, [0, 3], [0, 6, 6], [1, 0, 0], [0.1, 0.0, 0.0], [1, -1, -1],
                     [2, -1, -1], [0, 0, 0], [1, 1, 2, 2], [0, 1, 0, 1], [1.0, 2.0, 3.0, 4.0],
                     [0.5, 0.25])
    return Model((), trees=t, head_spec=Head("tanh_sigmoid"))


def split_bundle(blob):
    """(header dict, array payload) of a bundle."""
    hlen = struct.unpack("<I", blob[12:16])[0]
    start = 16 + hlen + ((-(16 + hlen)) % 64)
    return json.loads(blob[16:16 + hlen]), blob[start:-len(B.END) - 4]


def join_bundle(header, payload):
    """A bundle with this header and payload and a CRC that matches: what a hand edit (or a
    tool that rewrites the header) leaves, so only the reader's own checks stand."""
    hb = json.dumps(header).encode()
    body = B.MAGIC + struct.pack("<II", B.VERSION, len(hb)) + hb
    body += b"\0" * ((-len(body)) % 64) + payload
    return body + struct.pack("<I", zlib.crc32(body)) + B.END


def edit_bundle(blob, path, value):
    """The bundle with the header entry at path (keys and indices) set to value."""
    h, payload = split_bundle(blob)
    x = h
    for p in path[:-1]:
        x = x[p]
    x[path[-1]] = value
    return join_bundle(h, payload)


BLOB = bundle_mlp().to_bytes()
TREE_BLOB = bundle_tree_model().to_bytes()
