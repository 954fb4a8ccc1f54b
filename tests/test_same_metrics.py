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
