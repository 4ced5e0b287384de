"""Resource bounds: a tree ensemble whose packed arena would pass the limit is refused with a
ModelError that states what it asks for, the limit and the fix, before anything of that size
is allocated (checked in a child process by its peak RSS); a large but real-sized ensemble
still loads and equals onnxruntime; the Python size figure is the C packer's own."""
import json
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

import fastpath  # noqa: E402
from fastpath import Engine, Model, ModelError, TreeEnsemble  # noqa: E402
from fastpath._kernels import PackedTrees, tree_isas  # noqa: E402
from fastpath.model import Head  # noqa: E402
from fastpath.model import trees as trees_mod  # noqa: E402
from helpers.builders import engine_cfg  # noqa: E402
from helpers.oracle import ort_first  # noqa: E402

# where the imported fastpath lives (site-packages, or the checkout for an editable install):
# a child started there imports the same build, not the source tree beside the tests
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(fastpath.__file__)))


# ------------------------------------------------------------------ building ensembles
def _random_tree(rng, n_leaves, n_feat, modes=("BRANCH_LEQ",)):
    """(nodes, leaves) of one random binary tree with n_leaves leaves, ONNX node ids in
    order: nodes as [mode, feature, threshold, true_id, false_id]."""
    nodes = [["LEAF", 0, 0.0, 0, 0]]
    leaves = [0]
    while len(leaves) < n_leaves:
        k = leaves.pop(int(rng.integers(len(leaves))))
        a, b = len(nodes), len(nodes) + 1
        nodes[k] = [str(rng.choice(modes)), int(rng.integers(n_feat)),
                    float(np.float32(rng.standard_normal())), a, b]
        nodes += [["LEAF", 0, 0.0, 0, 0], ["LEAF", 0, 0.0, 0, 0]]
        leaves += [a, b]
    return nodes, sorted(leaves)


def _regressor_graph(path, trees, n_feat, n_targets):
    """trees: [(nodes, [(leaf id, target, weight)])] -> a TreeEnsembleRegressor file."""
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes",
                         "nodes_values", "nodes_truenodeids", "nodes_falsenodeids",
                         "nodes_missing_value_tracks_true", "target_ids", "target_nodeids",
                         "target_treeids", "target_weights")}
    for t, (nodes, weights) in enumerate(trees):
        for i, (m, f, thr, tc, fc) in enumerate(nodes):
            a["nodes_treeids"].append(t)
            a["nodes_nodeids"].append(i)
            a["nodes_modes"].append(m)
            a["nodes_featureids"].append(f)
            a["nodes_values"].append(thr)
            a["nodes_truenodeids"].append(tc)
            a["nodes_falsenodeids"].append(fc)
            a["nodes_missing_value_tracks_true"].append(0)
        for leaf, j, w in weights:
            a["target_treeids"].append(t)
            a["target_nodeids"].append(leaf)
            a["target_ids"].append(j)
            a["target_weights"].append(w)
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml",
                            n_targets=n_targets, aggregate_function="SUM", **a)
    g = helper.make_graph([node], "trees",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, n_feat])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                         [None, n_targets])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    path.write_bytes(m.SerializeToString())
    return str(path)


def _hostile_graph(path, n_trees=200_000, n_targets=4096):
    """n_trees one-leaf trees, each leaf naming two targets: every leaf then stores a value
    per target, n_trees x n_targets floats (3.3 GB) from a file of a few MB."""
    trees = [([["LEAF", 0, 0.0, 0, 0]], [(0, 0, 0.5), (0, 1 + t % (n_targets - 1), 0.25)])
             for t in range(n_trees)]
    return _regressor_graph(path, trees, 4, n_targets)


def _run_child(code, limit_gb=3):
    """Run code in a child with its address space capped (so the old, unbounded code fails
    there instead of paging the host); returns its last stdout line as JSON."""
    src = textwrap.dedent(f"""
        import json, resource, sys
        resource.setrlimit(resource.RLIMIT_AS, ({limit_gb} << 30, {limit_gb} << 30))
        out = {{}}
        try:
    """) + textwrap.indent(textwrap.dedent(code), "    ") + textwrap.dedent("""
        except MemoryError as exc:
            out["error"] = "MemoryError"
            out["message"] = str(exc)
        except Exception as exc:
            out["error"] = type(exc).__name__
            out["message"] = str(exc)
        out["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps(out))
    """)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, env=env,
                       cwd=PKG_ROOT, timeout=600)
    assert p.stdout.strip(), p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


# -------------------------------------------------------------- refusals, and their cost
def _engine_in_child(load):
    """(a bare import's result, the result of an Engine built on `load` (a Model expression))
    from _run_child: the refusal and the memory it cost, against the import alone."""
    base = _run_child("import fastpath\n")
    res = _run_child(f"""
        from fastpath import Model, Engine
        Engine({load})
        out["error"] = None
    """)
    return base, res


def test_hostile_onnx_is_refused_before_allocating(tmp_path):
    path = _hostile_graph(tmp_path / "hostile.onnx")
    assert os.path.getsize(path) < 16 << 20           # a few MB asking for GBs
    base, res = _engine_in_child(f"Model.from_onnx({path!r})")
    assert res["error"] == "ModelError", res
    msg = res["message"]
    assert "MB" in msg and "limit of 1024 MB" in msg, msg
    assert "4096 targets" in msg and "200000 trees" in msg, msg
    assert "leaf values" in msg and "one tree per target" in msg, msg
    # the refusal costs what reading the file costs, not the GBs it asks for
    assert res["maxrss_kb"] - base["maxrss_kb"] < 400 << 10, (res, base)


def _bundle_of(trees, path):
    """A .fpm bundle holding `trees` (any object with TreeEnsemble's fields), written
    without validating them, as a hostile or damaged file would be."""
    from fastpath.model import bundle
    small = Model.from_onnx(_regressor_graph(
        path.with_suffix(".small.onnx"), [([["LEAF", 0, 0.0, 0, 0]], [(0, 0, 1.0)])],
        trees.n_features, 1))
    fake = types.SimpleNamespace(layers=(), trees=trees, feature_spec=small.feature_spec,
                                 meta={}, cache_policy=small.cache_policy, post=small.post,
                                 head_spec=small.head_spec, weights=small.weights)
    path.write_bytes(bundle.to_bytes(fake))
    return str(path)


def test_hostile_bundle_is_refused_before_allocating(tmp_path):
    n, T = 200_000, 4096
    t = types.SimpleNamespace(
        n_features=4, n_targets=T, aggregate="SUM", post_transform="NONE", classifier=False,
        tree_offsets=np.arange(n + 1, dtype=np.int32), mode=np.full(n, 6, np.int32),
        feature=np.zeros(n, np.int32), threshold=np.zeros(n, np.float32),
        true_child=np.full(n, -1, np.int32), false_child=np.full(n, -1, np.int32),
        nan_true=np.zeros(n, np.uint8),
        weight_node=np.repeat(np.arange(n, dtype=np.int32), 2),
        weight_target=np.stack([np.zeros(n, np.int32),
                                1 + np.arange(n, dtype=np.int32) % (T - 1)], 1).ravel(),
        weight_value=np.full(2 * n, 0.5, np.float32), base_values=np.zeros(0, np.float32))
    path = _bundle_of(t, tmp_path / "hostile.fpm")
    assert os.path.getsize(path) < 16 << 20
    base, res = _engine_in_child(f"Model.load({path!r})")
    assert res["error"] == "ModelError", res
    assert "limit of 1024 MB" in res["message"] and "4096 targets" in res["message"], res
    assert res["maxrss_kb"] - base["maxrss_kb"] < 400 << 10, (res, base)


def test_padding_to_perfect_trees_is_counted(tmp_path):
    """Many shallow one-target trees beside one of depth 10 are each laid out at depth 10
    (12 KB a group lane): 100,000 three-node trees ask for ~1.2 GB and are refused, naming that."""
    # a chain of depth 10: split i (id 2i) sends false to its leaf 2i+1, true to the next
    # split (the last one to leaf 20)
    chain = []
    for i in range(10):
        chain.append(["BRANCH_LEQ", i % 4, float(i), 2 * i + 2, 2 * i + 1])
        chain.append(["LEAF", 0, 0.0, 0, 0])
    chain.append(["LEAF", 0, 0.0, 0, 0])
    shallow = [["BRANCH_LEQ", 1, 0.5, 1, 2], ["LEAF", 0, 0.0, 0, 0], ["LEAF", 0, 0.0, 0, 0]]
    n = 100_000
    trees = [(chain, [(k, 0, 0.1) for k in list(range(1, 21, 2)) + [20]])]
    trees += [(shallow, [(1, 0, 0.1), (2, 0, -0.1)])] * n
    path = _regressor_graph(tmp_path / "padded.onnx", trees, 4, 1)
    with pytest.raises(ModelError, match=r"perfect trees: .*limit of 1024 MB") as ei:
        Model.from_onnx(path)
    assert f"{n + 1} trees" in str(ei.value)


def test_c_packer_refuses_past_its_cap_too(monkeypatch):
    """The C packer's own bound (the Python check lifted): refused, not allocated."""
    n, T = 70_000, 4096          # 70,000 x 4096 floats: 1.07 GiB of leaf values
    monkeypatch.setattr(trees_mod, "MAX_PACKED_BYTES", 1 << 40)
    t = TreeEnsemble(4, T, np.arange(n + 1), np.full(n, 6), np.zeros(n), np.zeros(n),
                     np.full(n, -1), np.full(n, -1), np.zeros(n, np.uint8),
                     np.repeat(np.arange(n), 2),
                     np.stack([np.zeros(n, int), 1 + np.arange(n) % (T - 1)], 1).ravel(),
                     np.full(2 * n, 0.5, np.float32))
    need, parts = trees_mod.packed_layout(t.tree_offsets, t.mode, t.weight_node,
                                          t.weight_target, np.zeros(n, int), T, 0, "SUM")
    assert need > 1 << 30 and parts["leaf values"] > 1 << 30
    from fastpath import InputError
    with pytest.raises(InputError, match="refused"):
        PackedTrees(t, "scalar")


# ------------------------------------------------ real sizes: accepted, exact, same size
def _forest(rng, n_trees, leaves, n_feat, n_targets, per_tree_target, modes=("BRANCH_LEQ",)):
    out = []
    for t in range(n_trees):
        nodes, lv = _random_tree(rng, int(rng.integers(2, leaves + 1)), n_feat, modes)
        if per_tree_target:
            j = t % n_targets
            w = [(leaf, j, float(np.float32(rng.normal(0, 0.1)))) for leaf in lv]
        else:
            w = [(leaf, j, float(np.float32(rng.normal(0, 0.1))))
                 for leaf in lv for j in range(n_targets)]
        out.append((nodes, w))
    return out


@pytest.mark.parametrize("case", ["boosted_3class", "multi_target_leaves"])
def test_large_real_sized_ensemble_is_accepted_and_exact(tmp_path, case):
    rng = np.random.default_rng(7)
    n_feat = 16
    if case == "boosted_3class":
        # LightGBM / XGBoost multiclass style: one target per tree, up to 64 leaves
        n_targets, forest = 3, _forest(rng, 900, 64, n_feat, 3, True)
    else:
        # a random forest regressor over 8 targets: every leaf names every target
        n_targets, forest = 8, _forest(rng, 200, 64, n_feat, 8, False)
    path = _regressor_graph(tmp_path / f"{case}.onnx", forest, n_feat, n_targets)
    m = Model.from_onnx(path, head=Head("regression", outputs=(0,)))
    need, _ = trees_mod.packed_layout(m.trees.tree_offsets, m.trees.mode, m.trees.weight_node,
                                      m.trees.weight_target, m.trees.depths(), n_targets,
                                      m.trees.base_values.size, m.trees.aggregate)
    assert need < trees_mod.MAX_PACKED_BYTES
    X = rng.standard_normal((64, n_feat)).astype(np.float32)
    ref = ort_first(path, X)
    tol = 1e-5 * max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(m.forward(X), ref, rtol=1e-5, atol=tol)
    for k in tree_isas():
        pt = PackedTrees(m.trees, k)
        assert pt.layout["arena_bytes"] == need
        np.testing.assert_allclose(pt.eval(X), ref, rtol=1e-5, atol=tol)
    eng = Engine(m, config=engine_cfg("scalar"))
    for x, r in zip(X[:8], ref[:8]):
        np.testing.assert_allclose(eng.predict(x), r, rtol=1e-5, atol=tol)


@pytest.mark.parametrize("seed", range(12))
def test_python_size_is_the_packers(seed):
    """packed_layout equals the C arena size over mixed ensembles: depths past the perfect
    limit, EQ splits, one- and many-target trees, every aggregate, base values."""
    rng = np.random.default_rng(seed)
    T = int(rng.integers(1, 6))
    agg = ["SUM", "AVERAGE", "MIN", "MAX"][seed % 4]
    off, mode, feat, thr, tc, fc, wn, wt, wv = [0], [], [], [], [], [], [], [], []
    for t in range(int(rng.integers(1, 40))):
        modes = ("BRANCH_LEQ", "BRANCH_EQ") if rng.random() < 0.2 else ("BRANCH_LT",)
        nodes, lv = _random_tree(rng, int(rng.integers(1, 40)), 5, modes)
        lo = off[-1]
        for m_, f, th, a, b in nodes:
            mode.append(trees_mod.MODES.index(m_))
            feat.append(f)
            thr.append(th)
            tc.append(a if m_ != "LEAF" else -1)
            fc.append(b if m_ != "LEAF" else -1)
        off.append(lo + len(nodes))
        one = rng.random() < 0.6
        j0 = int(rng.integers(T))
        for leaf in lv:
            for j in ([j0] if one else range(T)):
                wn.append(lo + leaf)
                wt.append(j)
                wv.append(float(rng.normal()))
    te = TreeEnsemble(5, T, off, mode, feat, thr, tc, fc, np.zeros(len(mode), np.uint8),
                      wn, wt, np.asarray(wv, np.float32), aggregate=agg)
    need, _ = trees_mod.packed_layout(te.tree_offsets, te.mode, te.weight_node,
                                      te.weight_target, te.depths(), T, 0, agg)
    assert PackedTrees(te, "scalar").layout["arena_bytes"] == need


def test_validation_does_not_build_a_dense_table():
    """Building an accepted ensemble of 4096 targets and 100,000 leaves (each tree one
    target, so it packs small) allocates O(nodes + weights), not nodes x targets (the old
    bool table alone was 400 MB)."""
    import tracemalloc
    n, T = 100_000, 4096
    args = (4, T, np.arange(n + 1), np.full(n, 6), np.zeros(n), np.zeros(n), np.full(n, -1),
            np.full(n, -1), np.zeros(n, np.uint8), np.arange(n), np.arange(n) % T,
            np.full(n, 0.5, np.float32))
    tracemalloc.start()
    try:
        te = TreeEnsemble(*args)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert te.n_nodes == n
    assert peak < 64 << 20, peak
