"""Logged rollouts (logged.py): a run's saved rollouts read back bitwise, trained on beside fresh
ones and alone (offline, and it learns), split over ranks without loss or duplication, cut on
resume; every bad input one line and exit status 2, naming the file and the row; the example that
turns an OpenAI-compatible server's answer into the record."""
import io
import json
import math
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest
from transformers import AutoTokenizer

import logged
import train
from conftest import Beside, beside, cpu_env
from rollout import Rollout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "assets", "tiny-arith")
SMALL = ["--prompts-per-step", "8", "--group-size", "4", "--eval-size", "16", "--eval-every", "0",
         "--threads", "1"]


def run_train(args, out, timeout=300, run=None):
    """train.py in a subprocess (run: subprocess.run's stand-in, e.g. Beside.run)."""
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--out-dir", str(out), *args]
    if run is not None:
        return run(cmd, cwd=ROOT, timeout=timeout, env=cpu_env())
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=cpu_env())


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(MODEL)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A 3-step run's rollouts.jsonl (and its metrics)."""
    out = tmp_path_factory.mktemp("logged") / "a"
    proc = run_train(["--steps", "3", "--save-rollouts", *SMALL], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def check(tok):
    return dict(vocab=len(tok), tokenizer=logged.fingerprint(tok), temperature=1.0)


# ---- the record ----------------------------------------------------------------------------------

def test_saved_rollouts_read_back_bitwise(saved, tok):
    """Every saved row comes back as the same record, bit for bit: ids, log-probs, reward, and the
    advantage recomputed from the file's rewards in its own group is the one the run set."""
    path = saved / "rollouts.jsonl"
    rows = read_jsonl(path)
    assert len(rows) == 3 * 8 * 4 and {r["version"] for r in rows} == {0, 1, 2}
    f = logged.read(str(path), **check(tok))
    logged.advantages(f, score=None)                 # every row has a reward: no verifier needed
    meta = {k: rows[0][k] for k in (*logged.SAMPLING, "model", "tokenizer")}
    again = [logged.record(r, meta) for r in f.rollouts]
    assert json.dumps(again) == json.dumps(rows)
    assert [r.advantage for r in f.rollouts] == [row["advantage"] for row in rows]


def test_a_rollout_round_trips():
    r = Rollout(prompt_id=3, prompt_ids=[1, 2], completion_ids=[4, 5], logprobs=[-0.1, -2.5],
                text="45", answer="45", correct=1.0, formatted=True, reward=1.0, advantage=0.5,
                version=7, truncated=True)
    row = json.loads(json.dumps(logged.record(r, {"tokenizer": "x"})))
    assert logged.rollout_of(row) == r


def test_no_new_metrics_without_the_flags(saved):
    """--save-rollouts adds no key to metrics.jsonl; only --rollouts-from adds logged/*."""
    keys = {k for row in read_jsonl(saved / "metrics.jsonl") for k in row}
    assert not [k for k in keys if k.startswith("logged/")]


# ---- training on them ----------------------------------------------------------------------------

def test_a_second_run_trains_on_them_beside_fresh_ones(saved, tmp_path):
    proc = run_train(["--steps", "2", "--rollouts-from", str(saved / "rollouts.jsonl"),
                      "--logged-per-step", "16", *SMALL], tmp_path / "b")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "advantages from the file's rewards" in proc.stdout
    assert "logprob_diff" in proc.stdout and "logged" in proc.stdout
    rows = read_jsonl(tmp_path / "b" / "metrics.jsonl")[1:]
    assert all(0 < r["logged/count"] <= 16 for r in rows)
    assert all(0 < r["logged/share"] < 1 for r in rows)
    nonzero = sum(r["advantage"] != 0 for r in read_jsonl(saved / "rollouts.jsonl"))
    assert rows[-1]["logged/pool"] == nonzero - sum(r["logged/count"] + r["logged/dropped"]
                                                    for r in rows)


def offline_runs(tmp_path) -> tuple:
    """20 steps of one run saving its rollouts, then 20 steps from the same step-0 weights that
    generate nothing and train on them alone: (first process, second process, second's folder).
    The suite runs it beside its other tests (conftest.Beside)."""
    a, b = tmp_path / "a", tmp_path / "b"
    common = ["--group-size", "8", "--eval-size", "200", "--threads", "1", "--eval-every", "0"]
    first = run_train(["--steps", "20", "--prompts-per-step", "32", "--save-rollouts", *common], a,
                      run=Beside.run)
    if first.returncode != 0:
        return first, None, b
    return first, run_train(["--steps", "20", "--prompts-per-step", "0", "--rollouts-from",
                             str(a / "rollouts.jsonl"), "--logged-per-step", "256",
                             "--logged-uses", "2", "--logged-max-gap", "0", *common], b,
                            run=Beside.run), b


BESIDE = {"offline": offline_runs}


@pytest.fixture(scope="module")
def offline(request, tmp_path_factory):
    return beside(request, "offline", tmp_path_factory)


def test_offline_on_an_earlier_runs_rollouts_learns(offline):
    """20 steps of one run's rollouts, then a run from the same step-0 weights that generates
    nothing and trains on them alone (offline_runs): its held-out greedy accuracy rises."""
    first, proc, b = offline
    assert first.returncode == 0, first.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_jsonl(b / "metrics.jsonl")
    assert all(r["logged/share"] == 1.0 and r["logged/count"] == 256 for r in rows[1:])
    assert not [k for k in rows[-1] if k.startswith("reward/")]               # nothing generated
    before, after = rows[0]["eval/accuracy"], rows[-1]["eval/accuracy"]
    assert after > before + 0.05, (before, after)


def test_split_keeps_whole_groups_without_loss_or_duplication():
    rows = [Rollout(prompt_id=p, prompt_ids=[1], completion_ids=[2], logprobs=[-1.0], version=v,
                    text=str(i)) for v in range(3) for p in range(5) for i in range(4)]
    for world in (1, 2, 3):
        shares = [logged.split(rows, rank, world) for rank in range(world)]
        got = sorted(id(r) for share in shares for r in share)
        assert got == sorted(id(r) for r in rows)                    # each row once
        for rank, share in enumerate(shares):
            for other in shares[rank + 1:]:
                assert not {(r.version, r.prompt_id) for r in share} & {
                    (r.version, r.prompt_id) for r in other}        # a group on one rank


def test_two_ranks_train_on_a_file(saved, tmp_path):
    """torchrun, 2 ranks (gloo): offline on the saved file, each rank drawing 8 rows a step of
    its 12 groups."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(ROOT, "train.py"), "--out-dir", str(tmp_path / "d"), "--steps", "2",
           "--prompts-per-step", "0", "--rollouts-from", str(saved / "rollouts.jsonl"),
           "--logged-per-step", "16", "--logged-max-gap", "0", "--logged-draw", "uniform",
           "--group-size", "4", "--eval-size", "16", "--threads", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=cpu_env(OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-5000:]
    rows = read_jsonl(tmp_path / "d" / "metrics.jsonl")[1:]
    assert [r["logged/count"] for r in rows] == [16, 16]             # 8 a rank, summed
    assert rows[-1]["logged/pool"] == 96 - 32          # the ranks' pools (48 rows each), summed


def test_resume_cuts_the_file_to_the_checkpoint(tmp_path):
    """A resumed run first keeps the rows of the steps before its checkpoint: no row twice."""
    out = tmp_path / "r"
    proc = run_train(["--steps", "2", "--save-rollouts", "--save-every", "1", *SMALL], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "rollouts.jsonl", "a") as f:      # a step cut off after its rows were written
        f.write(json.dumps({"version": 2}) + "\n")
    proc = run_train(["--steps", "3", "--save-rollouts", "--save-every", "1", "--resume", "auto",
                      *SMALL], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    versions = [r["version"] for r in read_jsonl(out / "rollouts.jsonl")]
    assert versions == [0] * 32 + [1] * 32 + [2] * 32


def test_a_resumed_offline_run_draws_as_the_uninterrupted_one(saved, tmp_path):
    """The pool's uses, members and draw come back from the checkpoint: steps 3 and 4 of a run
    resumed at step 2 are those of the run never stopped (the load canary, against weights that
    have moved since, is not asked again)."""
    args = ["--rollouts-from", str(saved / "rollouts.jsonl"), "--prompts-per-step", "0",
            "--logged-per-step", "16", "--logged-draw", "uniform", "--group-size", "4",
            "--eval-size", "16", "--eval-every", "0", "--threads", "1", "--save-every", "1",
            "--lr", "1e-3"]
    assert run_train([*args, "--steps", "4"], tmp_path / "whole").returncode == 0
    assert run_train([*args, "--steps", "2"], tmp_path / "cut").returncode == 0
    proc = run_train([*args, "--steps", "4", "--resume", "auto"], tmp_path / "cut")
    assert proc.returncode == 0, proc.stderr[-3000:]
    keys = ("logged/count", "logged/pool", "logged/gap", "loss/policy")
    whole, cut = read_jsonl(tmp_path / "whole" / "metrics.jsonl"), read_jsonl(
        tmp_path / "cut" / "metrics.jsonl")
    assert [[r[k] for k in keys] for r in whole[3:]] == [[r[k] for k in keys] for r in cut[3:]]


# ---- bad input: one line, exit status 2, the file and the row named ------------------------------

def good_rows(tok, n_groups=2, size=2):
    prompt = tok.encode("1+2=")
    return [{"format": logged.FORMAT, "prompt_id": g, "version": 0, "prompt_ids": prompt,
             "completion_ids": tok.encode("3") + [tok.eos_token_id], "logprobs": [-0.5, -0.1],
             "text": "3", "answer": "3", "reward": float(i % 2), "temperature": 1.0,
             "top_p": 1.0, "max_new_tokens": 8, "model": MODEL,
             "tokenizer": logged.fingerprint(tok)} for g in range(n_groups) for i in range(size)]


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def main_error(tmp_path, *files, extra=()):
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        rc = train.main(["--steps", "1", "--out-dir", str(tmp_path / "run"), "--eval-size", "16",
                         "--threads", "1", "--rollouts-from", *map(str, files), *extra])
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    return rc, lines


def set_row(i, **changes):
    def change(rows):
        rows[i].update(changes)
        return rows
    return change


def drop(key):
    def change(rows):
        del rows[1][key]
        return rows
    return change


BAD = {
    "no logprobs": (drop("logprobs"), "row 2: no per-token logprobs"),
    "lengths differ": (set_row(1, logprobs=[-0.5]), "row 2: 2 completion ids but 1 logprobs"),
    "positive log-prob": (set_row(2, logprobs=[-0.5, 0.25]), "row 3: a log-prob must be finite"),
    "nan log-prob": (set_row(0, logprobs=[-0.5, math.nan]), "row 1: a log-prob must be finite"),
    "id outside the vocabulary": (set_row(3, completion_ids=[5, 10_000]), "row 4: token id 10000"),
    "another tokenizer": (set_row(1, tokenizer="0123456789abcdef"), "row 2: tokenizer"),
    "group of one": (lambda rows: rows[:3], "row 3: a group of one"),
    "no format": (drop("format"), "row 2: format"),
    "another temperature": (set_row(0, temperature=0.7), "row 1: temperature"),
}


@pytest.mark.parametrize("name", BAD)
@pytest.mark.usefixtures("cpu_only")
def test_a_bad_row_is_one_line_naming_file_and_row(tmp_path, tok, name):
    change, message = BAD[name]
    good = write(tmp_path / "good.jsonl", good_rows(tok))
    before = good.read_bytes()
    bad = write(tmp_path / "bad.jsonl", change(good_rows(tok)))
    rc, lines = main_error(tmp_path, good, bad)
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: ") and "bad.jsonl" in lines[0] and message in lines[0]
    assert good.read_bytes() == before and not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("text, message", [("", "no rows (an empty file)"),
                                           ('{"format": 1\n', ":1: malformed JSON")])
@pytest.mark.usefixtures("cpu_only")
def test_an_empty_or_unreadable_file(tmp_path, text, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(text)
    rc, lines = main_error(tmp_path, bad)
    assert rc == 2 and len(lines) == 1 and "bad.jsonl" in lines[0] and message in lines[0], lines


@pytest.mark.usefixtures("cpu_only")
def test_parquet_without_pyarrow_says_so(tmp_path):
    try:
        import pyarrow  # noqa: F401
        pytest.skip("pyarrow is installed: the error cannot happen here")
    except ImportError:
        pass
    bad = tmp_path / "x.parquet"
    bad.write_bytes(b"PAR1")
    rc, lines = main_error(tmp_path, bad)
    assert rc == 2 and len(lines) == 1 and "pyarrow" in lines[0], lines


@pytest.mark.usefixtures("cpu_only")
def test_the_load_canary_refuses_log_probs_this_model_does_not_give(tmp_path, tok):
    """Hand-made log-probs (-0.5, -0.1) are not the tiny model's: refused by --max-logprob-diff."""
    rc, lines = main_error(tmp_path, write(tmp_path / "made.jsonl", good_rows(tok)))
    assert rc == 2 and len(lines) == 1 and "--max-logprob-diff" in lines[0], lines
    assert "made.jsonl" in lines[0]


def test_the_answers_are_graded_by_the_run_without_rewards(saved, tmp_path):
    """A file without rewards: the run's verifier and reward from text and answer, said so."""
    rows = read_jsonl(saved / "rollouts.jsonl")
    for r in rows:
        del r["reward"]
    write(tmp_path / "plain.jsonl", rows)
    proc = run_train(["--steps", "1", "--rollouts-from", str(tmp_path / "plain.jsonl"),
                      "--prompts-per-step", "0", "--group-size", "4", "--eval-size", "16",
                      "--threads", "1"], tmp_path / "g")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "advantages from this run's verifier and reward" in proc.stdout


# ---- the example: an OpenAI-compatible server's answer -------------------------------------------

def test_openai_response_becomes_records(tok):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import openai_to_rollouts as ex
    eos = tok.convert_ids_to_tokens(tok.eos_token_id)
    response = {"choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "3"},
         "logprobs": {"content": [{"token": f"token_id:{tok.encode('3')[0]}", "logprob": -0.2},
                                  {"token": f"token_id:{tok.eos_token_id}", "logprob": -0.01}]}},
        {"index": 1, "finish_reason": "length", "message": {"role": "assistant", "content": "4"},
         "logprobs": {"content": [{"token": "4", "logprob": -1.5},
                                  {"token": eos, "logprob": -0.3}]}}]}
    meta = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 8, "model": MODEL,
            "tokenizer": logged.fingerprint(tok)}
    rows = ex.records(response, prompt_id=7, prompt_ids=tok.encode("1+2="), answer="3",
                      meta=meta, tok=tok)
    assert [r["completion_ids"] for r in rows] == [tok.encode("3") + [tok.eos_token_id],
                                                   tok.encode("4") + [tok.eos_token_id]]
    assert [r["logprobs"] for r in rows] == [[-0.2, -0.01], [-1.5, -0.3]]
    assert [r["truncated"] for r in rows] == [False, True] and rows[0]["text"] == "3"
    assert all(logged.problem(r, **check(tok)) == "" for r in rows)
    with pytest.raises(ValueError, match="not in the tokenizer's vocabulary"):
        ex.token_id("no such token", tok)
