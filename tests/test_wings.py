"""The method files (methods/) plug into the spine's slots and can each be taken away: with one
made unimportable, train.py's flags and presets lose that method's alone, and the default and
another method's preset still train. Also the registry's rules: two methods may not fill one
slot, and a method's make() reads the run, never changes it."""
import json
import os
import subprocess
import sys
import types

import pytest

from conftest import ROOT, Beside, beside, cpu_env

import methods

WINGS = methods.WINGS
TINY = ["--steps", "1", "--prompts-per-step", "4", "--group-size", "4", "--eval-size", "0",
        "--save-every", "0", "--threads", "1"]
# each method file's presets, as the registry has them
PRESETS_OF = {mod.__name__.split(".")[1]: set(getattr(mod, "PRESETS", {}))
              for mod in methods.loaded()}

SCRIPT = """
import json, sys
result = {}
for wing in json.loads(sys.argv[1]):
    for name in [m for m in sys.modules
                 if m.startswith("methods") or m in ("flags", "run_setup", "train")]:
        del sys.modules[name]                         # flags, the door and train composed afresh
    sys.modules["methods." + wing] = None             # the method file cannot be imported
    import flags, methods, train
    # another method's preset: the first of the methods still there
    other = next(iter(methods.presets()))
    out = {"presets": sorted(flags.PRESETS), "fields": list(flags.Args.__dataclass_fields__),
           "choices": {k: list(v) for k, v in flags.Args.more_choices.items()}}
    for name, argv in (("default", []), ("other", ["--preset", other])):
        out[name] = train.main(argv + json.loads(sys.argv[2]) + ["--out-dir",
                                                                 sys.argv[3] + wing + name])
    result[wing] = out
print(json.dumps(result))
"""


def test_every_wing_is_registered_and_has_a_preset():
    assert sorted(WINGS) == sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "methods"))
                                   if f.endswith(".py") and f != "__init__.py")
    assert methods.unregistered() == []
    import flags
    assert all(PRESETS_OF.values()), PRESETS_OF
    assert set(flags.SPINE_PRESETS).union(*PRESETS_OF.values()) == set(flags.PRESETS)


def test_a_method_file_not_registered_is_an_error_at_start(tmp_path, cpu_only, monkeypatch,
                                                           capsys):
    """A file of methods/ that WINGS does not name (here: the last, taken out of WINGS) stops the
    run at start, in one line that says where to register it, exit status 2."""
    import train
    monkeypatch.setattr(methods, "WINGS", WINGS[:-1])
    rc = train.main([*TINY, "--out-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and len(err) <= 100, err
    assert f"methods/{WINGS[-1]}.py is not a method yet" in err and "__init__.py's WINGS" in err


def each_removed(tmp_path) -> subprocess.CompletedProcess:
    """SCRIPT over every wing, its runs under tmp_path. The suite runs it beside its other tests
    (conftest.Beside)."""
    return Beside.run([sys.executable, "-c", SCRIPT, json.dumps(WINGS), json.dumps(TINY),
                       str(tmp_path / "run-")], cwd=ROOT, env=cpu_env(OMP_NUM_THREADS="1"),
                      timeout=900)


BESIDE = {"removed": each_removed}


@pytest.fixture(scope="module")
def removed(request, tmp_path_factory):
    return beside(request, "removed", tmp_path_factory)


def test_each_method_file_removed_leaves_the_rest_working(removed):
    """Each wing in turn made unimportable (in one process, flags.py, run_setup.py and train.py
    imported anew each time): its preset, flags and choices are gone, and the default and another
    method's preset (the first left) each train a step (exit status 0)."""
    proc = removed
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for mod in methods.loaded():
        wing = mod.__name__.split(".")[1]
        out = result[wing]
        assert out["default"] == 0 and out["other"] == 0, (wing, proc.stderr[-3000:])
        assert not PRESETS_OF[wing] & set(out["presets"]), wing
        own = getattr(mod, "Flags", None)
        assert own is None or not set(own.__dataclass_fields__) & set(out["fields"]), wing
        for flag, values in getattr(mod, "CHOICES", {}).items():
            assert not set(values) & set(out["choices"][flag]), wing
        assert own is not None or getattr(mod, "CHOICES", None), wing


def test_two_methods_may_not_fill_one_slot(tiny_model, tmp_path, cpu_only):
    """VIGOR and DAPO's refill both allocate a step's completions: the run says so at set-up."""
    import train
    rc = train.main(["--allocation", "vigor", "--dynamic-sampling", *TINY,
                     "--out-dir", str(tmp_path)])
    assert rc == 2


def test_two_methods_may_share_a_list_slot(tiny_model, tmp_path, cpu_only):
    """DAPO's overlong term is a reward term (a list slot): VIGOR's allocation takes it too."""
    import train
    rc = train.main(["--allocation", "vigor", "--overlong-buffer", "2", "--max-new-tokens", "4",
                     *TINY, "--out-dir", str(tmp_path)])
    assert rc == 0


def test_the_default_fills_no_slot(tmp_path, cpu_only):
    """With no method flag, no method file fills a slot: the step is the spine's alone, and the
    checkpoints keep the replay buffer's state alone."""
    import flags
    from tiny import setup
    run = setup(flags.parse([*TINY, "--out-dir", str(tmp_path)]))
    assert run.slots == {"reward": [], "loss": []}
    assert run.hooks == methods.LossHooks([], [], [], [], None, [])
    assert run.state == {"replay": run.replay}


def test_a_method_reads_the_run_and_may_not_change_it(monkeypatch):
    """make() gets the run read-only (methods.ReadOnly): every field reads as the run's, and
    setting one is an error that says what to do instead; the run is left as it was."""
    seen = {}

    def make(flags, run, steps):
        seen["per_rank"] = run.per_rank
        run.per_rank = 0
    meddler = types.SimpleNamespace(__name__="methods.meddler", make=make)
    monkeypatch.setattr(methods, "loaded", lambda: [meddler])
    run = types.SimpleNamespace(per_rank=4)
    with pytest.raises(AttributeError, match=r"run\.per_rank: a method's make\(\) may read the "
                                             r"run, not change it; return what it makes as a slot"):
        methods.build({}, run, steps=None)
    assert seen == {"per_rank": 4} and run.per_rank == 4
