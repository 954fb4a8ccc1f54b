"""--model, as train.py and eval.py take it: a local Hugging Face directory, or a Hub id (org/name)
that transformers fetches where the Hub is reachable. What keeps one from loading is one line, the
same words from both (cli.model_problem): no such directory, no config.json, no weights; a Hub id
where the Hub cannot be reached says how to fetch it elsewhere. No network: the Hub is simulated.

    python -m pytest -q tests/test_model_paths.py
"""
import io
import os
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

import checkpoint
import cli
import train
from conftest import ROOT, TINY_MODEL, cpu_env

HUB_ID = "Qwen/Qwen2.5-0.5B-Instruct"
TINY = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--eval-size", "0",
        "--max-new-tokens", "4", "--save-every", "0", "--threads", "1"]


def train_error(argv: list[str], tmp_path) -> tuple[int, str]:
    """train.main's exit status and its stderr, run in process."""
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        rc = train.main([*TINY, *argv, "--out-dir", str(tmp_path / "run")])
    return rc, err.getvalue().strip()


def test_a_hub_id_is_told_from_a_mistyped_path(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert cli.is_hub_id(HUB_ID) and cli.is_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert not cli.is_hub_id("assets/tiny-arith-typo")      # assets/ is here: a local path
    assert not cli.is_hub_id("/no/such/model") and not cli.is_hub_id("runs/a/final")
    assert cli.model_problem(HUB_ID) == "" and cli.model_problem("assets/tiny-arith") == ""


def test_a_directory_says_what_it_lacks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkdir("empty")
    shutil.copy(os.path.join(TINY_MODEL, "config.json"), "empty")
    assert cli.model_problem("nothere") == (
        "--model nothere: no such directory (nor a Hub id, org/name)")
    os.mkdir("bare")
    assert "no config.json in it" in cli.model_problem("bare")
    assert cli.model_problem(str(tmp_path / "empty")) == (
        "--model empty: no weights in it (model.safetensors or pytorch_model.bin)")


def test_train_and_eval_word_a_model_path_error_alike(tmp_path, cpu_only, monkeypatch):
    """The same line from both, exit status 2, the path as the user gave it (relative to where
    they ran, not the checkout's absolute path)."""
    monkeypatch.chdir(tmp_path)
    os.mkdir("empty")
    shutil.copy(os.path.join(TINY_MODEL, "config.json"), "empty")
    want = "error: --model empty: no weights in it (model.safetensors or pytorch_model.bin)"
    rc, err = train_error(["--model", "empty"], tmp_path)
    assert rc == 2 and err == want, err
    p = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--model", "empty",
                        "--out", str(tmp_path / "eval")], cwd=tmp_path,
                       env=cpu_env(OMP_NUM_THREADS="1"), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2 and p.stderr.strip() == want, p.stderr[-2000:]


def test_a_hub_id_where_the_hub_is_unreachable_is_one_line(tmp_path, cpu_only, monkeypatch):
    """Nothing in the cache and no answer from the Hub (simulated: the session's request fails,
    or HF_HUB_OFFLINE): one line at once, how to fetch it where the Hub is reachable."""
    import huggingface_hub.utils

    class NoNetwork:
        def head(self, url, timeout):
            raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setattr(checkpoint, "hub_cached", lambda model_id: False)
    monkeypatch.setattr(huggingface_hub.utils, "get_session", lambda: NoNetwork())
    rc, err = train_error(["--model", HUB_ID], tmp_path)
    assert rc == 2 and err == f"error: {cli.hub_unreachable(HUB_ID)}", err
    assert len(err) <= 100 and "hf download ID --local-dir DIR" in err
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OSError, match="offline; hf download"):
        checkpoint.load_model(HUB_ID)


def test_a_hub_id_where_the_hub_is_reachable_is_fetched_by_transformers(monkeypatch):
    """The id goes to transformers' from_pretrained with downloads allowed (simulated: it answers
    with the tiny model); a cached id is read from the cache alone."""
    import transformers
    asked = []

    def from_pretrained(original):
        def fetch(path, **kw):
            asked.append((path, kw["local_files_only"]))
            return original(TINY_MODEL, **kw)
        return fetch

    for auto in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        monkeypatch.setattr(auto, "from_pretrained", from_pretrained(auto.from_pretrained))
    monkeypatch.setattr(checkpoint, "require_hub", lambda model_id: None)
    monkeypatch.setattr(checkpoint, "hub_cached", lambda model_id: False)
    model, tok = checkpoint.load_model(HUB_ID)
    assert asked == [(HUB_ID, False), (HUB_ID, False)] and model.config.vocab_size > 0
    asked.clear()
    monkeypatch.setattr(checkpoint, "hub_cached", lambda model_id: True)
    checkpoint.load_model(HUB_ID)
    assert asked == [(HUB_ID, True), (HUB_ID, True)]
