"""metrics.Metrics: each key combines as the one rule its module's COMBINE table declares (a mean
over a named count, a total, an extreme), call sites hand in values and counts alone, and a key
with no rule is an error."""
import pytest
import torch

import buffer
import engine
import eval as eval_lib
import grpo
import logged
import methods
import metrics
import train
import verify
from metrics import Metrics
from methods.headroom_drift import GroupReplay

KINDS = ("mean", "sum", "max", "min", "weight")
TABLES = {"metrics": metrics.COMBINE, "grpo": grpo.COMBINE, "train": train.COMBINE,
          "buffer": buffer.COMBINE, "logged": logged.LoggedPool.COMBINE,
          "eval": eval_lib.COMBINE, "verify": verify.COMBINE, "engine": engine.COMBINE,
          "headroom_drift": GroupReplay.COMBINE,
          **{w.__name__: w.COMBINE for w in methods.loaded() if hasattr(w, "COMBINE")}}


def test_a_key_with_no_rule_is_an_error():
    m = Metrics()
    with pytest.raises(KeyError, match="no combine rule for 'loss/new_thing'"):
        m.add({"loss/clip_frac": "mean tokens"}, {"loss/new_thing": 0.5}, tokens=3)
    with pytest.raises(KeyError, match="'loss/new_thing'"):
        m.add(grpo.COMBINE, {"loss/new_thing": 0.5}, tokens=3)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_table_declares_known_kinds(name):
    """Each rule is a kind, then at most one count it is weighted by; a total or a weight names
    none."""
    for key, rule in TABLES[name].items():
        kind, _, weight = rule.partition(" ")
        assert kind in KINDS and " " not in weight, (name, key, rule)
        assert kind not in ("sum", "weight") or not weight, (name, key, rule)


def test_each_rule_combines_over_parts_as_declared():
    """A mean over a count handed in (tokens=) or over another key (replay/sampled), an equal
    mean, a total (ints stay ints), extremes over the parts with a count, a weight not logged,
    and a prefix's rule for the keys under it; keys in the order first added."""
    rules = {"a": "mean tokens", "b": "mean n", "n": "sum", "c": "mean", "hi": "max tokens",
             "lo": "min", "w": "weight", "d": "mean w", "eval/*": "sum"}
    m = Metrics()
    m.add(rules, {"a": 1.0, "b": 2.0, "n": 3, "c": 4.0, "hi": 0.5, "lo": 7, "w": 1, "d": 1.0,
                  "eval/x": 0.25, "eval/set/mean@2": 0.5}, tokens=1)
    m.add(rules, {"a": 4.0, "b": 6.0, "n": 1, "c": 8.0, "hi": 9.0, "lo": 5, "w": 3, "d": 5.0,
                  "eval/x": 0.5}, tokens=torch.tensor(0))
    row = m.reduce(1)
    assert list(row) == ["a", "b", "n", "c", "hi", "lo", "d", "eval/x", "eval/set/mean@2"]
    assert row["a"] == 1.0                                  # the second part had no token
    assert row["b"] == (2.0 * 3 + 6.0 * 1) / 4 and row["n"] == 4 and isinstance(row["n"], int)
    assert row["c"] == 6.0 and row["lo"] == 5
    assert row["hi"] == 0.5                                 # 9.0 was over no token
    assert row["d"] == (1.0 * 1 + 5.0 * 3) / 4 and row["eval/x"] == 0.75


def test_an_extreme_over_no_token_is_no_key():
    m = Metrics()
    m.add(grpo.COMBINE, {"ratio/max": torch.tensor(float("nan"))}, tokens=torch.tensor(0))
    assert m.reduce(1) == {}
