"""fp_trees_choose (csrc/fp_trees_lanes.c): at load each walk this model and kernel set have is
timed, the fastest runs, and what was measured is reported (PackedTrees.choice); whichever walk
is chosen, the outputs are the compact walk's bits."""
import numpy as np

from fastpath._kernels import PackedTrees
from helpers.native_trees import chain_ensemble, with_eq_root

F = np.float32
LANE_WALKS = {("lanes-rest", "gather"), ("gather-rest", "gather"), ("lanes-all", "gather"),
              ("gather-all", "gather")}


def _mixed():
    """Shallow chains (perfect groups) and deep ones (the rest), one target: every walk."""
    depths = [3 if i % 3 == 0 else 14 + i % 5 for i in range(40)]
    return chain_ensemble([(d, np.arange(d + 1.0) * (i + 1)) for i, d in enumerate(depths)])


def _rows():
    return np.array([[x, 0.5] for x in np.arange(-1.0, 20.0, 0.5)], F)


def test_the_walk_in_use_is_the_fastest_candidate_timed(isa):
    pk = PackedTrees(_mixed(), isa)
    ch = pk.choice
    assert ch and all(ns > 0 for ns in ch.values())
    assert (pk.walk, pk.perfect_walk) == min(ch, key=ch.get)
    got = pk.eval(_rows())
    pk.walk = "compact"
    assert np.array_equal(got, pk.eval(_rows()))


def test_candidates_are_the_walks_this_model_and_kernel_set_have(isa):
    steps = isa != "scalar"   # the scalar set walks perfect groups by steps either way
    pk = PackedTrees(_mixed(), isa)
    assert pk.layout["groups"] > 0 and pk.layout["compact"] > 0 and pk.layout["lane_walk"]
    want = {("compact", "gather")} | LANE_WALKS
    if steps:
        want |= {("compact", "steps"), ("lanes-rest", "steps"), ("gather-rest", "steps")}
    assert set(pk.choice) == want
    # every tree deep: no perfect groups, so no rest-only walk and no perfect-walk choice
    deep = PackedTrees(chain_ensemble([(14 + i % 5, np.arange(15.0 + i % 5)) for i in range(20)]), isa)
    assert set(deep.choice) == {("compact", "gather"), ("lanes-all", "gather"),
                                ("gather-all", "gather")}
    # no lane layout: the perfect groups' two walks where the set has both
    eq = PackedTrees(with_eq_root(_mixed()), isa)
    assert not eq.layout["lane_walk"]
    assert set(eq.choice) == ({("compact", "gather"), ("compact", "steps")} if steps
                              else {("compact", "gather")})


def test_nothing_to_choose_is_timed_nothing():
    """A deep tree with an EQ split has neither groups nor a lane layout: no candidate is
    timed and the compact walk runs."""
    pk = PackedTrees(with_eq_root(chain_ensemble([(14, np.arange(15.0))])), "scalar")
    assert pk.choice == {} and pk.walk == "compact"
