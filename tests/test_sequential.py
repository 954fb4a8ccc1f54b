"""bench/sequential.py and a group-sequential setting's runs (bench/protocol.py, Setting.looks):
the O'Brien-Fleming boundaries against the published constants, the runs stopping at the first
look where the primary claim crosses and not before, nothing read before the first look, and a
seed's arms made on one CPU kind (one_machine)."""
import json
import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(Path(ROOT) / "bench"))
import protocol  # noqa: E402  (where run_setting reads load and stream: patched there)
import sequential  # noqa: E402
from design import Arm, Claim, Setting  # noqa: E402
from protocol import Plan, Stopped, run_dir, run_setting  # noqa: E402


def test_obrien_fleming_boundaries_are_the_published_constants():
    """Jennison & Turnbull (2000), Table 2.3, two-sided alpha 0.05 at equal looks: C_B(2) =
    1.977, C_B(5) = 2.040; the boundary at look k is C_B sqrt(K / k). Two looks at 10 and 20
    seeds: nominal p 0.0052 and 0.0480 (the issue's "about 0.005 and 0.048")."""
    two = sequential.obrien_fleming((10, 20))
    assert two[1] == pytest.approx(1.977, abs=1e-3)
    assert two[0] == pytest.approx(1.977 * 2 ** 0.5, abs=2e-3)
    assert sequential.obrien_fleming((1, 2, 3, 4, 5))[-1] == pytest.approx(2.040, abs=1e-3)
    p10, p20 = sequential.thresholds((10, 20))
    assert p10 == pytest.approx(0.0052, abs=1e-4) and p20 == pytest.approx(0.0480, abs=1e-4)
    # one look is the plain two-sided test
    assert sequential.thresholds((20,))[0] == pytest.approx(0.05, abs=1e-4)
    assert sequential.crosses(0.004, 0, (10, 20)) and not sequential.crosses(0.006, 0, (10, 20))
    assert sequential.crosses(0.04, 1, (10, 20)) and not sequential.crosses(None, 1, (10, 20))


ARMS = (Arm("a", ("--replay", "prioritized")), Arm("b", ()))


def _setting(seeds=(1, 2, 3, 4), looks=(2, 4)):
    return Setting("x", ("--steps", "2"), ARMS, "b", seeds=seeds,
                               claims=(Claim("a", 1),), shared_lr=1e-4, looks=looks,
                               one_machine=True)


def _fake(monkeypatch, finals, kind="this cpu", train=True):
    """Plan.run_all that makes each run's folder (done, cpu.txt, argv.json) unless there, and
    records which ran; load gives `finals[arm](seed)` as the run's final accuracy."""
    made = []

    def run_all(self, runs, split="report"):
        for _, d in runs:
            if (d / "done").exists():
                continue
            if not self.train:
                self.missing.add(d)
                continue
            d.mkdir(parents=True, exist_ok=True)
            for name, text in (("done", "1.0 s\n"), ("cpu.txt", kind + "\n"), ("argv.json", "[]")):
                (d / name).write_text(text)
            made.append(d)
        self.ran += [d for _, d in runs if d not in self.missing]

    def load(d, metric, *a):
        acc = finals[d.parent.parent.name](int(d.name[5:]))
        curve = [(0, 0, 0, 0.0, 0.1), (1, 8, 1, 1.0, acc), (2, 16, 2, 2.0, acc)]
        return {"final": acc, "curve": curve, "means": {}, "maxima": {}, "minima": {},
                "last": {}, "start": 0.1}
    monkeypatch.setattr(Plan, "run_all", run_all)
    monkeypatch.setattr(protocol, "load", load)
    monkeypatch.setattr(protocol, "stream", lambda argv: None)
    monkeypatch.setattr(protocol, "cpu_kind", lambda: kind)
    return made


def test_the_runs_stop_at_the_first_look_where_the_primary_crosses(monkeypatch, tmp_path):
    """A primary far beyond its boundary at 2 seeds (Δ 0.4, SE 0.0005): seeds 3 and 4 never
    run, and the summary reads the look's two seeds; a primary that does not cross runs all four."""
    made = _fake(monkeypatch, {"a": lambda sd: 0.5 + 0.001 * sd, "b": lambda sd: 0.1})
    out = run_setting(_setting(), Plan(tmp_path / "one", 1, 1, False))
    assert sorted(d.name for d in made) == ["seed-1", "seed-1", "seed-2", "seed-2"]
    assert [r["seed"] for r in out["runs"]["a"]] == [1, 2]
    made = _fake(monkeypatch, {"a": lambda sd: 0.3 + 0.05 * (-1) ** sd, "b": lambda sd: 0.3})
    out = run_setting(_setting(), Plan(tmp_path / "two", 1, 1, False))
    assert len(made) == 8 and [r["seed"] for r in out["runs"]["b"]] == [1, 2, 3, 4]


def test_nothing_is_read_before_the_first_look(monkeypatch, tmp_path):
    """Analyse only, one seed of the first look's two complete: Stopped, with the count; with the
    first look complete and the second not, the read is the first look's seeds."""
    plan = Plan(tmp_path, 1, 1, False)
    _fake(monkeypatch, {"a": lambda sd: 0.3 + 0.05 * (-1) ** sd, "b": lambda sd: 0.3})
    run_setting(_setting(seeds=(1,), looks=()), plan)
    plan = Plan(tmp_path, 1, 1, False, train=False)
    with pytest.raises(Stopped, match="1 of 2 seeds complete before its first look"):
        run_setting(_setting(), plan)
    run_setting(_setting(seeds=(1, 2, 3), looks=()),
                            Plan(tmp_path, 1, 1, False))
    out = run_setting(_setting(), Plan(tmp_path, 1, 1, False, train=False))
    assert [r["seed"] for r in out["runs"]["a"]] == [1, 2]


def test_a_seed_s_arms_are_made_on_one_cpu_kind(monkeypatch, tmp_path):
    """one_machine: a seed whose arms finished on another kind is kept whole; a seed with one arm
    finished on another kind and one not yet made has that run made again here."""
    def made_on(arm, seed, kind):
        d = run_dir(tmp_path / "x", "report", arm, 1e-4, seed)
        d.mkdir(parents=True)
        for name, text in (("done", "1.0 s\n"), ("cpu.txt", kind + "\n"), ("argv.json", "[]")):
            (d / name).write_text(text)
        return d
    kept = [made_on("a", 1, "other"), made_on("b", 1, "other")]
    half = made_on("a", 2, "other")
    made = _fake(monkeypatch, {"a": lambda sd: 0.3 + 0.05 * (-1) ** sd, "b": lambda sd: 0.3})
    run_setting(_setting(seeds=(1, 2), looks=(2,)),
                            Plan(tmp_path, 1, 1, False))
    assert sorted((d.parent.parent.name, d.name) for d in made) == [("a", "seed-2"),
                                                                    ("b", "seed-2")]
    assert all((d / "cpu.txt").read_text() == "other\n" for d in kept)
    assert (half / "cpu.txt").read_text() == "this cpu\n"
    assert json.loads((half / "argv.json").read_text()) == []
