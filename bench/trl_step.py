"""TRL's GRPOTrainer on the batch train.py makes, for the step-time comparison of docs/smollm2.md:
the same model, the same prompts (the built-in task's train split under the instruct template),
the same reward (the instruct template's grader), the same sizes, fp32 on the CPU.

    python -m venv --system-site-packages /tmp/trlenv && /tmp/trlenv/bin/pip install trl datasets
    /tmp/trlenv/bin/python bench/trl_step.py --model assets/smollm2-135m-instruct \\
        --prompts 8 --group 8 --max-new-tokens 16 --steps 4 --threads 2

against `python bench/step_time.py -- --model ... --prompts-per-step 8 --group-size 8
--max-new-tokens 16 --replay none --threads 2` (no replay: TRL has none, so the batch is the same
64 completions). TRL's settings: one optimizer step per generation batch (per-device batch =
prompts x group completions, steps_per_generation 1, no gradient accumulation), beta 0 (no
reference model, as train.py's default), temperature 1, AdamW at the same lr. Prints the median
seconds of a step after the first (which loads and warms up). TRL is not a dependency of this
project: install it in a separate environment.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-5)
    args = p.parse_args(argv)
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    import data
    import verify
    torch.set_num_threads(args.threads)
    examples = data.load_benchmark("builtin_train")
    rows = [{"prompt": [{"role": "user",
                         "content": data.DIRECT_INSTRUCTION.format(question=e.question)}],
             "gold": e.answer} for e in examples[:args.prompts * (args.steps + 1)]]
    grade = verify.grader("builtin", "instruct")

    def reward(completions, gold, **_):
        return [float(grade(c[0]["content"], g)) for c, g in zip(completions, gold)]

    class Clock(TrainerCallback):
        def __init__(self):
            self.seconds, self.t0 = [], 0.0

        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.seconds.append(time.perf_counter() - self.t0)

    n = args.prompts * args.group
    config = GRPOConfig(output_dir=os.path.join("/tmp", "trl-step"), use_cpu=True, bf16=False,
                        per_device_train_batch_size=n, gradient_accumulation_steps=1,
                        num_generations=args.group, steps_per_generation=1,
                        max_completion_length=args.max_new_tokens, temperature=1.0,
                        learning_rate=args.lr, beta=0.0, max_steps=args.steps, logging_steps=1,
                        save_strategy="no", report_to=[], shuffle_dataset=False, seed=0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(args.model)
    clock = Clock()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config,
                          train_dataset=Dataset.from_list(rows), processing_class=tok,
                          callbacks=[clock])
    trainer.train()
    later = clock.seconds[1:] or clock.seconds
    print(f"TRL GRPOTrainer {args.prompts} prompts x {args.group} completions, "
          f"{args.max_new_tokens} new tokens, fp32, {args.threads} threads: step seconds "
          f"{', '.join(f'{s:.1f}' for s in clock.seconds)}; median after the first "
          f"{statistics.median(later):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
