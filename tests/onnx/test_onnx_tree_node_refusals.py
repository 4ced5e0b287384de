"""ONNX tree-ensemble nodes that onnxruntime would read differently are refused: trees whose nodes
are interleaved, and a node attribute given twice."""

import numpy as np
import pytest

import fastpath
from fastpath import Engine


F32 = np.float32


def test_onnx_trees_with_interleaved_nodes_are_refused(tmp_path):
    """Two stumps whose nodes are listed interleaved (tree 1's root, tree 2's root, then their
    leaves): onnxruntime starts a new tree at every change of tree id and answered 44 where
    fastpath, grouping by id, answered 11. Such a file is refused now, naming the tree."""
    from fastpath.model import Model
    from helpers.models import _tree_graph
    rows = [(1, 0, 0, "BRANCH_LEQ", 0.0, 1, 2), (2, 0, 1, "BRANCH_LEQ", 0.0, 1, 2),
            (1, 1, 0, "LEAF", 0, 0, 0), (1, 2, 0, "LEAF", 0, 0, 0),
            (2, 1, 0, "LEAF", 0, 0, 0), (2, 2, 0, "LEAF", 0, 0, 0)]
    w = [(1, 1, 1.0), (1, 2, 1.0), (2, 1, 10.0), (2, 2, 10.0)]
    with pytest.raises(fastpath.ModelError, match="the nodes of tree id 1 are not listed together"):
        Model.from_onnx(_tree_graph(tmp_path, rows, w))
    # the same trees listed tree by tree load and answer 11
    m = Model.from_onnx(_tree_graph(tmp_path, [rows[0], rows[2], rows[3], rows[1], rows[4],
                                               rows[5]], w))
    assert float(Engine(m).predict(np.zeros(2, F32))[0]) == 11.0


def test_onnx_tree_node_with_an_attribute_twice_is_refused(tmp_path):
    """A TreeEnsembleRegressor giving nodes_values twice: onnxruntime refuses the node, the
    reader kept the last copy (the MLP path refused it already)."""
    import onnx
    from onnx import helper
    from fastpath.model import Model
    from helpers.models import _tree_graph
    rows = [(0, 0, 0, "BRANCH_LEQ", 0.0, 1, 2), (0, 1, 0, "LEAF", 0, 0, 0),
            (0, 2, 0, "LEAF", 0, 0, 0)]
    p = _tree_graph(tmp_path, rows, [(0, 1, 1.0), (0, 2, 2.0)])
    Model.from_onnx(p)
    m = onnx.load(p)
    m.graph.node[0].attribute.append(helper.make_attribute("nodes_values", [5.0, 0.0, 0.0]))
    onnx.save(m, p)
    with pytest.raises(fastpath.ModelError, match="attribute nodes_values twice"):
        Model.from_onnx(p)
