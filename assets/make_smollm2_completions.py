"""The real completions tests/test_instruct.py grades: SmolLM2-135M-Instruct (its Q4_1 GGUF
dequantized: assets/make_smollm2.py) on built-in prompts under the instruct template, 32 new
tokens: 40 greedy on builtin_mixed's test split, 16 greedy on builtin's, 24 sampled at temperature
1 (seed 1) on builtin_mixed's.

    python assets/make_smollm2_completions.py tests/data/smollm2_completions.jsonl

Writes one JSON object a line: set, question, gold, temperature, completion, truncated. The
committed file adds two fields by hand, from reading each completion: label (the answer it states
is the gold number) and echo (it only restates the question). One thread, about a minute.
"""
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import data  # noqa: E402
from checkpoint import load_model  # noqa: E402
from engine import TorchEngine  # noqa: E402
from rollout import Sampling  # noqa: E402

MODEL = os.path.join(ROOT, "assets", "smollm2-135m-instruct")
DRAWS = (("builtin_mixed", 40, 0.0, 0), ("builtin", 16, 0.0, 0), ("builtin_mixed", 24, 1.0, 1))


def main(out: str) -> None:
    torch.set_num_threads(1)
    model, tok = load_model(MODEL, "cpu")
    engine = TorchEngine(model, tok)
    rows = []
    for name, n, temperature, seed in DRAWS:
        examples = data.load_benchmark(name)[:n]
        prompts = data.make_prompts(examples, "instruct", tok)
        sampling = Sampling(temperature=temperature, max_new_tokens=32, seed=seed)
        for ex, r in zip(examples, engine.generate(prompts, 1, sampling)):
            rows.append({"set": name, "question": ex.question, "gold": ex.answer,
                         "temperature": temperature, "completion": r.text,
                         "truncated": r.truncated})
    with open(out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(rows)} completions -> {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isdir(MODEL):
        sys.exit(f"usage: python {sys.argv[0]} OUT.jsonl (needs {MODEL}: "
                 "python assets/make_smollm2.py)")
    main(sys.argv[1])
