"""Checkpoints: kill -9 and resume equals a run that never stopped; a half-written checkpoint is
never resumed; a checkpoint is a plain Hugging Face model that generates what the trainer's engine
generates; non-finite steps are skipped, counted, and end the run with the last good checkpoint
intact. train.py runs under torchrun with 2 ranks (gloo) for the kill test, in-process at world size
1 for the rest."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

import checkpoint
import run_setup
import train
from conftest import cpu_env
from data import Prompt
from rollout import Sampling
from tiny import SMALL, decided_prefix, make_digit_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The CPU whatever the machine has: the torchrun subprocesses get cpu_env() (2 ranks are gloo, not
# rank 1 on a missing cuda:1), the in-process train.main runs cpu_only (their weights are compared
# bit for bit with runs and with transformers' generate on the CPU).
pytestmark = pytest.mark.usefixtures("cpu_only")


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return make_digit_task(str(tmp_path_factory.mktemp("task")))


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def args_of(task, out, *extra):
    model, data_path = task
    return ["--model", model, "--train-data", data_path, "--out-dir", str(out), *SMALL, *extra]


def torchrun(task, out, *extra):
    return TORCHRUN + [os.path.join(ROOT, "train.py"), *args_of(task, out, *extra)]


def metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def no_time(m: dict) -> dict:
    return {k: v for k, v in m.items() if not k.startswith("time/")}


def children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (from /proc/*/stat: "pid (comm) state ppid ...")."""
    out = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if entry.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry))
        except OSError:          # not a process, or gone meanwhile
            pass
    return out


def rank_states(ckpt) -> list[dict]:
    return [torch.load(str(ckpt / "trainer" / f"rank_0000{r}.pt"), weights_only=True)
            for r in (0, 1)]


@pytest.mark.paths
def test_kill_and_resume_on_two_ranks_equals_straight_run(task, tmp_path):
    """N = 8 steps on 2 ranks straight vs the same command killed (SIGKILL to every worker, then
    torchrun) once a checkpoint exists, then `--resume auto`: the same final weights, every rank's
    buffer and data position, and the same metrics, bit for bit (time/* aside). Bitwise on any CPU
    kind: both runs make the same computations in the same order on one machine, and resume
    restores every input of the next step (weights, AdamW, buffers, RNG, data position) exactly."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    args = ["--steps", "8", "--save-every", "2"]
    proc = subprocess.run(torchrun(task, straight, *args), cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=cpu_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "world size 2 | 2 prompts x 4 completions per rank" in proc.stdout

    agent = subprocess.Popen(torchrun(task, killed, *args), cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=cpu_env())
    first = killed / "checkpoints" / "step_000002" / checkpoint.MARKER
    deadline = time.time() + 250
    while not first.exists() and agent.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert agent.poll() is None, "the run finished (or failed) before it could be killed"
    workers = children(agent.pid)                  # torchrun starts each worker in its own session
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    agent.kill()
    agent.wait()
    assert len(workers) == 2 and not (killed / "checkpoints" / "step_000008").exists()
    resumed_from = checkpoint.latest(str(killed / "checkpoints"))
    k = int(resumed_from[-6:])
    assert 2 <= k < 8
    # Debris of a save cut off mid-write, newer than the real checkpoint: resume must pick neither.
    junk = killed / "checkpoints" / f"step_{k + 1:06d}"         # renamed but without the marker
    (junk / "trainer").mkdir(parents=True)
    (junk / "config.json").write_text("{")
    tmp = killed / "checkpoints" / f".tmp-step_{k + 2:06d}"     # never renamed
    tmp.mkdir(exist_ok=True)                                    # the kill may have left one already
    (tmp / checkpoint.MARKER).write_text("")

    proc = subprocess.run(torchrun(task, killed, *args, "--resume", "auto"), cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=cpu_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed from {resumed_from} at step {k}" in proc.stdout

    a, b = straight / "checkpoints" / "step_000008", killed / "checkpoints" / "step_000008"
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[n], wb[n]) for n in wa)
    start = load_file(os.path.join(task[0], "model.safetensors"))
    # training moved every tensor
    assert all(not torch.equal(start[n], wa[n]) for n in start)
    for ra, rb in zip(rank_states(a), rank_states(b)):
        # contents, RNG, last stats
        assert ra["replay"] == rb["replay"] and ra["pos"] == rb["pos"]
        assert len(ra["replay"]["rollouts"]) > 0
    ids = [{d["prompt_id"] for d in r["replay"]["rollouts"]} for r in rank_states(a)]
    assert not ids[0] & ids[1]                                    # each rank stores its own prompts
    ma, mb = metrics(straight), metrics(killed)
    # continued: no step lost or repeated
    assert [m["step"] for m in mb] == list(range(9))
    assert [no_time(m) for m in ma] == [no_time(m) for m in mb]
    # both ranks' rollouts counted
    assert all(m["batch/fresh"] == 16 for m in ma[1:])
    # the resumed steps replayed old rollouts
    assert sum(m["replay/sampled"] for m in ma[k + 1:]) > 0


@pytest.mark.paths
def test_resume_at_world_size_one(task, tmp_path):
    """Plain `python` (no process group): 4 steps straight vs step 2's checkpoint alone, resumed to
    4. Bitwise: the same computations in the same order (see the two-rank test)."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert train.main(args_of(task, a, "--steps", "4", "--save-every", "2")) == 0
    (b / "checkpoints").mkdir(parents=True)
    shutil.copytree(a / "checkpoints" / "step_000002", b / "checkpoints" / "step_000002")
    assert train.main(args_of(task, b, "--steps", "4", "--save-every", "2",
                              "--resume", str(b / "checkpoints" / "step_000002"))) == 0
    wa, wb = (load_file(str(d / "checkpoints" / "step_000004" / "model.safetensors"))
              for d in (a, b))
    assert all(torch.equal(wa[n], wb[n]) for n in wa)
    sa, sb = (torch.load(str(d / "checkpoints" / "step_000004" / "trainer" / "rank_00000.pt"),
                         weights_only=True)
              for d in (a, b))
    assert sa["replay"] == sb["replay"] and sa["pos"] == sb["pos"]
    # b logged steps 3, 4 only
    assert [no_time(m) for m in metrics(a)[3:]] == [no_time(m) for m in metrics(b)]


def test_latest_ignores_partial_checkpoints(tmp_path):
    root = tmp_path / "checkpoints"
    for name, marker in [("step_000003", True), ("step_000010", True), ("step_000012", False),
                         (".tmp-step_000014", True), ("step_000011.replaced", True)]:
        (root / name / "trainer").mkdir(parents=True)
        (root / name / "trainer" / "state.json").write_text('{"world_size": 1}')
        if marker:
            (root / name / checkpoint.MARKER).write_text("")
    assert checkpoint.latest(str(root)) == str(root / "step_000010")
    assert checkpoint.resolve("auto", str(tmp_path)) == str(root / "step_000010")
    assert checkpoint.resolve("", str(tmp_path)) is None
    # nothing yet: start fresh
    assert checkpoint.resolve("auto", str(tmp_path / "elsewhere")) is None
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        checkpoint.resolve(str(root / "step_000012"), str(tmp_path))
    with pytest.raises(ValueError, match="written by 1 ranks, this run has 2"):
        checkpoint.resolve("auto", str(tmp_path), world=2)
    # a run with a slot's state (R²PO's head) resumes only from a checkpoint that kept it; one
    # written before state.json listed the kept states kept the replay buffer's alone
    found = str(root / "step_000010")
    checkpoint.check_state(found, ["replay"])
    with pytest.raises(ValueError, match="keeps no step state: it was written by a run without"):
        checkpoint.check_state(found, ["replay", "step"])
    (root / "step_000010" / "trainer" / "state.json").write_text(
        '{"world_size": 1, "state": ["step"]}')
    checkpoint.check_state(found, ["step"])
    with pytest.raises(ValueError, match="keeps no replay state"):
        checkpoint.check_state(found, ["replay"])


@pytest.mark.paths
def test_checkpoint_is_a_transformers_model_that_generates_like_the_engine(task, tmp_path,
                                                                           monkeypatch):
    engines = []

    class Recorded(run_setup.TorchEngine):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            engines.append(self)

    monkeypatch.setattr(run_setup, "TorchEngine", Recorded)
    out = tmp_path / "run"
    assert train.main(args_of(task, out, "--steps", "2", "--lr", "1e-2")) == 0
    from transformers import AutoModelForCausalLM, AutoTokenizer
    ckpt = out / "checkpoints" / "step_000002"
    assert os.path.realpath(out / "final") == str(ckpt)
    hf = AutoModelForCausalLM.from_pretrained(str(ckpt)).eval()
    tok = AutoTokenizer.from_pretrained(str(ckpt))
    engine = engines[0]
    ours = dict(engine.model.named_parameters())
    assert all(torch.equal(p, ours[n]) for n, p in hf.named_parameters())
    start = AutoModelForCausalLM.from_pretrained(task[0])
    # the engine was synced
    assert not all(torch.equal(p, ours[n]) for n, p in start.named_parameters())
    texts = ["3=", "7=", "12+5=", "9*9="]
    rs = engine.generate([Prompt(i, tok.encode(t)) for i, t in enumerate(texts)], 1,
                         Sampling(temperature=0, max_new_tokens=6))
    # two greedy decoders (a left-padded batch with a KV cache, one row in transformers): they must
    # agree on every token that is decided by more than rounding (tiny.decided_prefix)
    decided = 0
    for t, r in zip(texts, rs):
        ids = torch.tensor([tok.encode(t)])
        with torch.no_grad():
            g = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                            do_sample=False, eos_token_id=tok.eos_token_id,
                            pad_token_id=tok.pad_token_id)
        n = decided_prefix(hf, ids[0].tolist(), r.completion_ids)
        assert g[0, ids.shape[1]:].tolist()[:n] == r.completion_ids[:n], t
        decided += n
    assert decided >= sum(len(r.completion_ids) for r in rs) // 2       # not vacuous


def test_non_finite_steps_are_skipped_then_end_the_run(task, tmp_path, monkeypatch, capsys):
    """From the third update on the loss is NaN: step 3 is skipped (weights unchanged, counted,
    still saved, since its weights are the good ones), step 4 is the second in a row and ends the
    run; no later checkpoint exists."""
    calls = []
    real = train.micro_batch_loss

    def poisoned(*args, **kw):
        loss, numbers = real(*args, **kw)
        calls.append(1)
        return (loss * float("nan") if len(calls) >= 3 else loss), numbers

    monkeypatch.setattr(train, "micro_batch_loss", poisoned)
    out = tmp_path / "run"
    rc = train.main(args_of(task, out, "--steps", "6", "--save-every", "1", "--max-bad-steps", "2"))
    err = capsys.readouterr().err
    assert rc == 1 and "error: 2 optimizer steps in a row had a non-finite loss" in err
    assert checkpoint.latest(str(out / "checkpoints")).endswith("step_000003")
    assert not (out / "checkpoints" / "step_000004").exists()
    w2, w3 = (load_file(str(out / "checkpoints" / f"step_00000{s}" / "model.safetensors"))
              for s in (2, 3))
    assert all(torch.equal(w2[n], w3[n]) and torch.isfinite(w3[n]).all() for n in w2)
    m = metrics(out)
    assert [x["step"] for x in m] == [0, 1, 2, 3]
    assert [x["train/skipped_steps"] for x in m[1:]] == [0, 0, 1]


def test_a_checkpoints_files_are_readable_by_the_group(tmp_path):
    """model.safetensors came out 0600 (transformers writes it through a temporary file): every
    file of the Hugging Face directory now gets 0666 less the umask, 0644 under 022."""
    model, tok = checkpoint.load_model(os.path.join(os.path.dirname(checkpoint.__file__),
                                                    "assets", "tiny-arith"))
    old = os.umask(0o022)
    try:
        checkpoint.save_hf(model, tok, str(tmp_path / "ckpt"))
    finally:
        os.umask(old)
    modes = {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / "ckpt").iterdir()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes
