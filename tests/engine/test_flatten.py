"""ckptio's quick flattening yields exactly the keys and values DCP's planner builds."""

from __future__ import annotations

import pytest
import torch

from ckptio.engine.trainer.rank_plan import flatten_like_dcp, make_planner, quick_fingerprint

CASES = {
    "nested": {"model": {"w": torch.ones(2), "b": torch.zeros(1)}, "optim": {"state": {0: {"m": torch.ones(2)}}}},
    "lists": {"a": [1, 2, 3], "b": [torch.ones(1), 5], "c": [[1], [torch.ones(1)]], "d": [{"x": 1}], "e": [[], [1]]},
    "leaves": {"t": (torch.ones(1),), "s": "str", "n": None, "f": 1.5, "empty": {}, "el": [], 3: "int key"},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_keys_and_values_as_dcp(name):
    state = CASES[name]
    ours = flatten_like_dcp(state)
    theirs = make_planner(state, is_coordinator=True).state_dict
    assert list(ours) == list(theirs)
    assert all(ours[k] is theirs[k] for k in ours)


def test_fingerprint_changes_with_shape_dtype_and_keys_only():
    base = {"w": torch.ones(2, 3), "step": 1}
    fp = quick_fingerprint(flatten_like_dcp(base))
    assert quick_fingerprint(flatten_like_dcp({"w": torch.zeros(2, 3), "step": 99})) == fp  # values do not count
    assert quick_fingerprint(flatten_like_dcp({"w": torch.ones(3, 2), "step": 1})) != fp
    assert quick_fingerprint(flatten_like_dcp({"w": torch.ones(2, 3).double(), "step": 1})) != fp
    assert quick_fingerprint(flatten_like_dcp({"w": torch.ones(2, 3), "other": 1})) != fp
