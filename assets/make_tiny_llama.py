"""A random-weight tiny LlamaForCausalLM with SmolLM2's real tokenizer, for tests of the chat path.

    python assets/make_tiny_llama.py OUT              # writes the directory OUT (a few seconds,
                                                      # most of them importing transformers)

    from make_tiny_llama import make_tiny_llama
    make_tiny_llama(tmp_path / "llama", seed=0)       # the same, from a test

The architecture is SmolLM2-135M's in miniature (hidden 64, 2 layers, 4 heads, 2 kv heads,
intermediate 128, tied embeddings, RoPE theta 100000), the vocabulary its full 49,152 tokens, so the
model is 3.2M parameters, nearly all embedding. The tokenizer is the committed
assets/smollm2-tokenizer (made by assets/make_smollm2.py from the real model): byte-level BPE, the
ChatML chat template, EOS `<|im_end|>` (id 2), PAD = EOS, as checkpoint.load_model gives a tokenizer
without a PAD. Written with checkpoint.save_hf: EOS and BOS in config.json and
generation_config.json, PAD in generation_config.json only.

The weights are random (transformers' init under `torch.manual_seed(seed)`): the model's text is
gibberish and seldom ends in EOS. It tests loading, templating and generation, not answers. Seeded:
the same seed gives the same weights on the same machine.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOKENIZER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "smollm2-tokenizer")


def load_tokenizer(path: str = TOKENIZER_DIR):
    """SmolLM2's tokenizer from the committed files (no network); PAD = EOS where none is named,
    as checkpoint.load_model sets it."""
    from transformers import AutoTokenizer
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        raise FileNotFoundError(f"no tokenizer.json in {path}: remake it with "
                                f"`python assets/make_smollm2.py --tokenizer-only`")
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def tiny_llama_config(tok):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=2048, tie_word_embeddings=True,
                       rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                       rms_norm_eps=1e-5, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id)


def make_tiny_llama(out_dir, seed: int = 0) -> str:
    """Write the tiny Llama and SmolLM2's tokenizer to `out_dir`; returns its path as a str."""
    import torch
    from transformers import LlamaForCausalLM
    from checkpoint import save_hf
    tok = load_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(tok))
    out_dir = str(out_dir)
    save_hf(model, tok, out_dir)                 # EOS / PAD ids into the configs
    return out_dir


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the directory to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = ap.parse_args(argv)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        ap.error(f"{args.out} exists and is not a directory")
    import torch
    torch.set_num_threads(args.threads)
    try:
        path = make_tiny_llama(args.out, args.seed)
    except FileNotFoundError as e:
        sys.exit(f"make_tiny_llama: {e}")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
