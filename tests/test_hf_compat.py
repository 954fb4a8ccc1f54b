"""The shipped model and every checkpoint behave in plain `transformers` as they do in the trainer:
AutoTokenizer gives back the tokenizer class the trainer uses, which keeps spaces and newlines (a
string round-trips, one token per character), and `model.generate` with nothing but the directory's
own configs stops at EOS.

Checked on assets/tiny-arith and on a checkpoint written by checkpoint.save (world size 1) from the
shipped model whose configs had their ids taken out first, as in a model made before they were
written: save puts them back."""
import dataclasses
import json
import os

import pytest
import torch

import checkpoint
import data
import flags
import parallel
from tiny import decided_prefix

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "assets", "tiny-arith")
EOS, PAD = 96, 97
MAX_NEW = 20
TEXTS = ["1 + 2 = 3", " 7 * 6 = 42 ", "a  b\nc", "x = \\frac{1}{2}, y = 3.5"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model, tok = checkpoint.load_model(SHIPPED)
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id = cfg.pad_token_id = cfg.bos_token_id = None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    root = tmp_path_factory.mktemp("ckpt")
    return checkpoint.save(str(root), 1, model, opt, tok,
                           dataclasses.asdict(flags.Args(model=SHIPPED)),
                           guard=parallel.StepGuard(3), state={}, pos=0, rank=0, world=1)


@pytest.fixture(params=["shipped", "checkpoint"])
def model_dir(request):
    return SHIPPED if request.param == "shipped" else request.getfixturevalue("saved")


def read(path, name):
    with open(os.path.join(path, name)) as f:
        return json.load(f)


def test_autotokenizer_gives_the_trainers_class_and_keeps_spaces(model_dir):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    assert type(tok).__name__ == "Qwen2Tokenizer"
    assert read(model_dir, "tokenizer_config.json")["tokenizer_class"] == "Qwen2Tokenizer"
    _, trainers = checkpoint.load_model(model_dir)
    assert type(trainers) is type(tok)
    assert (tok.eos_token_id, tok.pad_token_id) == (EOS, PAD)
    for text in TEXTS:
        ids = tok.encode(text)
        assert len(ids) == len(text), text                   # one token per character, none dropped
        assert tok.decode(ids) == text
        assert trainers.encode(text) == ids
    assert tok.encode("1 + 2 = 3") == [17, 0, 11, 0, 18, 0, 29, 0, 19]   # ' ' is id 0: chr(32 + id)
    # the built-in prompts' ids as trained
    assert tok.encode("7*6*9=") == [23, 10, 22, 10, 25, 29]


def test_configs_name_eos_and_pad(model_dir):
    config, gen = read(model_dir, "config.json"), read(model_dir, "generation_config.json")
    assert config["eos_token_id"] == EOS
    assert (gen["eos_token_id"], gen["pad_token_id"]) == (EOS, PAD)


@pytest.mark.paths
def test_generate_stops_at_eos(model_dir):
    """Greedy `generate` on built-in test prompts, with no EOS or PAD passed: each completion ends
    with its first EOS, well before MAX_NEW tokens; a batch (left padded with PAD) gives the same
    completions."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    prompts = [data.builtin_prompt(e.question) for e in data.arithmetic_examples("test", 8)]
    singles = []
    for p in prompts:
        ids = torch.tensor([tok.encode(p)])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=MAX_NEW)
        new = out[0, ids.shape[1]:].tolist()
        assert len(new) < MAX_NEW, (p, tok.decode(new))
        # stopped at the first EOS, nothing after
        assert EOS in new and new.index(EOS) == len(new) - 1, (p, new)
        assert tok.decode(new[:-1]).lstrip("-").isdigit(), (p, tok.decode(new))
        singles.append(new)
    tok.padding_side = "left"
    batch = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, do_sample=False, max_new_tokens=MAX_NEW)
    assert out.shape[1] - batch["input_ids"].shape[1] < MAX_NEW
    # a batch and single rows are two paths: they agree on the tokens decided by more than
    # rounding (tiny.decided_prefix), and a row wholly decided is padded after its EOS
    decided = 0
    for p, row, new in zip(prompts, out[:, batch["input_ids"].shape[1]:].tolist(), singles):
        n = decided_prefix(model, tok.encode(p), new)
        assert row[:n] == new[:n], p
        assert n < len(new) or all(t == PAD for t in row[len(new):]), p
        decided += n
    assert decided >= sum(map(len, singles)) // 2                            # not vacuous
