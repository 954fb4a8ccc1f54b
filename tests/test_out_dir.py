"""Nothing silently lost: a fresh run into an --out-dir that holds a run (its logs, a checkpoint,
final) is refused with one line that names both ways on; `--resume auto` continues it, `--overwrite`
deletes what it left (only once the run's inputs are checked) and starts over; files of other
programs there (a bench script's run.log, argv.json) are not a run."""
import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest
import torch

import checkpoint
import cli
import train

pytestmark = pytest.mark.usefixtures("cpu_only")
torch.set_num_threads(1)
TINY = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4",
        "--eval-size", "0", "--eval-every", "0", "--threads", "1"]


def main(out, *argv) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        rc = train.main([*TINY, "--out-dir", str(out), *argv])
    return rc, err.getvalue()


def steps(out) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_what_counts_as_a_run(tmp_path):
    assert checkpoint.previous_run(str(tmp_path / "none")) == []
    (tmp_path / "argv.json").write_text("[]")              # bench/experiments.py's, before a run
    (tmp_path / "run.log").write_text("")
    (tmp_path / "checkpoints").mkdir()                      # empty: nothing to lose
    assert checkpoint.previous_run(str(tmp_path)) == []
    (tmp_path / "checkpoints" / ".tmp-step_000001").mkdir()
    (tmp_path / "metrics.jsonl").write_text("")
    assert checkpoint.previous_run(str(tmp_path)) == ["metrics.jsonl", "checkpoints/"]


def test_a_second_run_is_refused_then_resumed_or_started_over(tmp_path):
    out = tmp_path / "run"
    assert main(out, "--save-every", "1")[0] == 0
    before = (out / "metrics.jsonl").read_bytes()
    rc, err = main(out)
    assert rc == 2 and "Traceback" not in err and len(err.splitlines()) == 1
    assert err.startswith(f"error: {cli.shown_path(str(out))} already holds a run "
                          "(metrics.jsonl, checkpoints/, ...)")
    assert "--resume auto" in err and "--overwrite" in err
    assert (out / "metrics.jsonl").read_bytes() == before   # untouched
    # --resume auto continues it
    assert main(out, "--steps", "2", "--save-every", "1", "--resume", "auto")[0] == 0
    assert steps(out) == [0, 1, 2]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001",
                                                                       "step_000002"]
    # a bad flag beside --overwrite deletes nothing
    rc, err = main(out, "--overwrite", "--group-size", "1")
    assert rc == 2 and "--group-size" in err and steps(out) == [0, 1, 2]
    rc, err = main(out, "--overwrite", "--resume", "auto")
    assert rc == 2 and "choose one" in err
    # --overwrite starts over: the old checkpoints, logs and final are gone
    rc, _ = main(out, "--overwrite", "--save-every", "0")
    assert rc == 0 and steps(out) == [0, 1]
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_000001"]
    assert (out / "final").resolve().name == "step_000001"


def test_a_bench_scripts_own_files_are_not_a_run(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "argv.json").write_text("[]")
    (out / "run.log").write_text("")
    assert main(out)[0] == 0 and (out / "argv.json").exists()


def test_only_rank_0_says_it_and_every_rank_refuses(tmp_path, monkeypatch):
    """Under torchrun the check runs before the process group, on every rank alike (the same
    files): a rank other than 0 ends with status 2 without a word."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    for rank, said in (("1", False), ("0", True)):
        monkeypatch.setenv("RANK", rank)
        rc, err = main(out)
        assert rc == 2 and bool(err) == said
