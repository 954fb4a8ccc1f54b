"""bench/same_metrics.py: two runs' metrics.jsonl compared key by key (time/* aside), with the
keys a change dropped or added on purpose counted and not compared."""
import json
import sys
from pathlib import Path

from conftest import ROOT

sys.path.insert(0, str(Path(ROOT) / "bench"))
import same_metrics  # noqa: E402


def _run(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_added_and_dropped_keys_are_counted_and_any_other_difference_fails(tmp_path, capsys):
    a = _run(tmp_path / "a", [{"step": 1, "loss": 0.5, "old": 1, "time/step": 3.0}])
    b = _run(tmp_path / "b", [{"step": 1, "loss": 0.5, "new": 2, "time/step": 9.0}])
    assert same_metrics.main([str(a), str(b), "--single"]) == 1
    assert same_metrics.main([str(a), str(b), "--single", "--dropped", "old"]) == 1
    assert same_metrics.main([str(a), str(b), "--single", "--dropped", "old",
                              "--added", "new"]) == 0
    assert "(B no longer logs old) (B also logs new)" in capsys.readouterr().out
    c = _run(tmp_path / "c", [{"step": 1, "loss": 0.25, "new": 2}])
    assert same_metrics.main([str(a), str(c), "--single", "--dropped", "old",
                              "--added", "new"]) == 1


def test_resummed_keys_pass_within_float_rounding_and_fail_past_it(tmp_path, capsys):
    """--resummed: a key summed in another order may move by float32 rounding (RESUMMED), not more;
    every other key is still compared exactly."""
    a = _run(tmp_path / "a", [{"step": 1, "ratio/mean": 1.0231412728899159, "loss": 0.5}])
    b = _run(tmp_path / "b", [{"step": 1, "ratio/mean": 1.0231412245775573, "loss": 0.5}])
    c = _run(tmp_path / "c", [{"step": 1, "ratio/mean": 1.0231512245775573, "loss": 0.5}])
    d = _run(tmp_path / "d", [{"step": 1, "ratio/mean": 1.0231412245775573, "loss": 0.25}])
    assert same_metrics.main([str(a), str(b), "--single"]) == 1
    assert same_metrics.main([str(a), str(b), "--single", "--resummed", "ratio/mean"]) == 0
    assert "(resummed: at most 4.8e-08 apart)" in capsys.readouterr().out
    assert same_metrics.main([str(a), str(c), "--single", "--resummed", "ratio/mean"]) == 1
    assert same_metrics.main([str(a), str(d), "--single", "--resummed", "ratio/mean"]) == 1
