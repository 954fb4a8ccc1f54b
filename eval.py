"""Evaluation: sample k completions per problem, grade them, and report the numbers
RLVR papers report.

    python eval.py          # built-in tiny model, built-in test split, greedy (mean@1)
    python eval.py --model DIR --benchmarks aime24,amc23,math500,minerva,olympiadbench \\
        --k 32 --temperature 0.6 --max-new-tokens 3072 --prompt-template plain \\
        --out runs/eval-DIR [--baseline runs/eval-BASE/summary.json]

`evaluate(engine, tokenizer, examples, template=, k=, sampling=)` is the one function behind this
CLI and behind train.py's periodic eval (`eval/accuracy` = mean@k with k = 1 and greedy sampling on
the built-in test split, and `eval/<bench>/mean@k`), so a checkpoint evaluated either way with the
same settings and seed gets the same numbers. `eval/dev_accuracy` is the same on the built-in dev
split (here `--benchmarks builtin_dev`, or builtin_steps_dev).

Metrics of one benchmark: n problems, k samples each, c_i of problem i graded correct by its set's
rule (verify.grader(name): verify.grade; on builtin_steps only a plain integer after the last "=").
    mean@k  = (1/n) sum_i c_i / k
              (the papers' Avg@k = Mean@k; with k = 1 greedy, accuracy)
    pass@j  = (1/n) sum_i [1 - C(k - c_i, j) / C(k, j)]
              for every j <= k, the unbiased estimator of Chen et al. 2021 (arXiv 2107.03374),
              computed in their stable product form 1 - prod_{m=k-c+1}^{k} (1 - j/m)
    maj@k   = (1/n) sum_i [the most frequent extracted answer among the k samples is correct];
              answers vote as strings (verify.extract_answer, whitespace removed), a sample
              without an answer does not vote, a tie goes to the answer seen first. String votes
              can split equivalent forms ("1/2", "0.5"); grading does not.
    length/mean    = mean completion length in tokens over all n*k samples
                     (EOS counted when generated)
    truncated/frac = share of samples that hit --max-new-tokens before EOS
The macro row is the unweighted mean over benchmarks of each column (the papers' "Avg." over the
five benchmarks).

AES, the accuracy-efficiency score of O1-Pruner (arXiv 2501.12570, Sec. 4.1), against a
baseline summary.json:
    dL = (L_base - L) / L_base,  dA = (A - A_base) / A_base,
    AES = alpha*dL + beta*dA if dA >= 0 else alpha*dL - gamma*|dA|,  alpha = 1, beta = 3, gamma = 5
with A = mean@k and L = length/mean of the same benchmark.

Outputs in --out: `<bench>.jsonl` (one line per problem: question, gold, prompt, responses,
extracted answers, correct flags, lengths, truncated flags), `summary.json` (every metric and the
flags), `summary.md` (the table, also printed).
"""
import dataclasses
import json
import math
import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tqdm import tqdm

import data
import cli

# torch, transformers and the verifier's sympy are imported inside the functions that use
# them (rollout, verify), so that --help and bad input answer at once instead of after
# seconds of imports.

# O1-Pruner's weights: a lost point of accuracy costs more
AES_ALPHA, AES_BETA, AES_GAMMA = 1.0, 3.0, 5.0


# ---- metrics (pure) ------------------------------------------------------------------------------

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct:
    1 - C(n-c, k)/C(n, k) = 1 - prod_{m=n-c+1}^{n} (1 - k/m)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:                       # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / m for m in range(n - c + 1, n + 1))


def maj_at_k(answers: list, correct: list[bool], k: int) -> float:
    """1.0 if the most frequent answer among the first k samples is a correct one, else 0.0 (ties:
    seen first)."""
    votes = [("".join(a.split()), ok) for a, ok in zip(answers[:k], correct[:k]) if a]
    if not votes:
        return 0.0
    counts = Counter(a for a, _ in votes)
    top = max(counts.values())
    # first-seen answer among those with top count
    winner_ok = next(ok for a, ok in votes if counts[a] == top)
    return float(winner_ok)


def aes(acc: float, length: float, base_acc: float, base_length: float) -> float:
    """O1-Pruner's accuracy-efficiency score (equation in the module docstring); acc in any unit,
    same as base."""
    if base_acc <= 0 or base_length <= 0:
        raise ValueError(f"AES needs a baseline with accuracy > 0 and length > 0, "
                         f"got {base_acc}, {base_length}")
    d_len = (base_length - length) / base_length
    d_acc = (acc - base_acc) / base_acc
    return AES_ALPHA * d_len + (AES_BETA * d_acc if d_acc >= 0 else -AES_GAMMA * abs(d_acc))


def summarize(records: list[dict], k: int) -> dict:
    """One benchmark's metrics from its per-example records (see `evaluate`)."""
    n = len(records)
    cs = [sum(r["correct"]) for r in records]
    lengths = [x for r in records for x in r["lengths"]]
    out = {"n": n, "k": k, "mean@k": sum(c / k for c in cs) / n}
    out.update({f"pass@{j}": sum(pass_at_k(k, c, j) for c in cs) / n for j in range(1, k + 1)})
    out["maj@k"] = sum(maj_at_k(r["extracted"], r["correct"], k) for r in records) / n
    out["length/mean"] = sum(lengths) / len(lengths)
    out["truncated/frac"] = sum(t for r in records for t in r["truncated"]) / len(lengths)
    return out


# ---- sampling and grading ------------------------------------------------------------------------

def sample(engine, prompts: list, k: int, sampling: "Sampling", desc: str | None = None) -> list:
    """k rollouts per prompt (the k of one prompt consecutive), in engine-batch-sized chunks behind
    a progress bar. Chunk i samples with seed + i, so no two chunks share a random stream; greedy is
    unaffected."""
    per_chunk = max(1, getattr(engine, "batch_size", len(prompts) * k) // k)
    rollouts = []
    with tqdm(total=len(prompts) * k, desc=desc, unit="sample", disable=None) as bar:
        for i, start in enumerate(range(0, len(prompts), per_chunk)):
            chunk = prompts[start:start + per_chunk]
            rollouts += engine.generate(chunk, k,
                                        dataclasses.replace(sampling, seed=sampling.seed + i))
            bar.update(len(chunk) * k)
    return rollouts


def evaluate(engine, tokenizer, examples: list[data.Example], *, template: str, k: int,
             sampling: "Sampling", desc: str | None = None,
             grader=None) -> tuple[dict, list[dict]]:
    """(summary, per_example) of k samples per example, each graded by grader(response, gold)
    (None: verify.grade; a set's own rule: verify.grader(name)); summary keys as in `summarize`."""
    import verify
    grader = grader or verify.grade
    if k < 1 or not examples:
        raise ValueError(f"evaluate needs k >= 1 and at least one example, "
                         f"got k={k}, {len(examples)} examples")
    prompts = data.make_prompts(examples, template, tokenizer)
    rollouts = sample(engine, prompts, k, sampling, desc)
    records = []
    for i, ex in enumerate(examples):
        group = rollouts[i * k:(i + 1) * k]
        texts = [r.text for r in group]
        records.append({"index": i, "question": ex.question, "gold": ex.answer,
                        "prompt": tokenizer.decode(prompts[i].ids), "responses": texts,
                        "extracted": [verify.extract_answer(t) for t in texts],
                        "correct": [bool(grader(t, ex.answer)) for t in texts],
                        "lengths": [len(r.completion_ids) for r in group],
                        "truncated": [bool(r.truncated) for r in group]})
    return summarize(records, k), records


# ---- train.py's periodic eval: its flags, its sets, its share on each rank, its log fields -------

@dataclass(frozen=True)
class TrainFlags:
    # ---- eval and logs ---------------------------------------------------------------------------
    eval_every: int = 20
    """evaluate every N steps and at the end (0 = only at the end)"""
    eval_size: int = 500
    """held-out prompts evaluated greedy as eval/accuracy (--eval-data says which: the built-in
    task's test split, a file's held-out rows, all of them when fewer); 0 = no test eval"""
    dev_size: int = 0
    """prompts of the dev split evaluated greedy as eval/dev_accuracy (0 = none): what learning
    rates are chosen on (bench/compare.py --experiment); a file's: its dev rows (--eval-data)"""
    eval_data: str = "auto"
    """what eval/accuracy is on: auto = a built-in --train-data's own test split, or a file's
    held-out rows (a question is held out iff crc32(question) % 10 == 0, as in the built-in
    splits: about a tenth, not trained on; --dev-size's: == 1); or a benchmark name or a file,
    evaluated whole (--train-data then trained on whole, less its dev rows under --dev-size); one
    that shares a question with what --train-data trains on is refused"""
    eval_benchmarks: str = ""
    """comma-separated benchmarks (names from data.py or files) also evaluated at each eval:
    eval/<bench>/mean@<k>"""
    eval_k: int = 1
    """samples per problem for --eval-benchmarks"""
    eval_temperature: float = 0.0
    """sampling temperature for --eval-benchmarks (0 = greedy)"""
    data_dir: str = data.DEFAULT_DATA_DIR
    """where named benchmarks (--train-data, --eval-benchmarks) are read from"""

    AT_LEAST_1 = ("eval_k",)
    AT_LEAST_0 = ("eval_size", "dev_size", "eval_every", "eval_temperature")

    def due(self, step: int, steps: int) -> bool:
        """Whether the loop evaluates after step `step` (0-based) of `steps`: every eval_every
        steps and after the last."""
        return bool(self.eval_every and (step + 1) % self.eval_every == 0) or step + 1 == steps


def log_fields(row: dict) -> list[str]:
    """The eval numbers of a log line (eval/<key> -> "<key> 0.123"), in the row's order."""
    return [f"{k[5:]} {v:.3f}" for k, v in row.items() if k.startswith("eval/")]


def held_out_splits(train_data: str, eval_data: str = "auto", eval_size: int = 500,
                    dev_size: int = 0) -> tuple[str, ...]:
    """The splits of --train-data (data.held_out) that the periodic eval holds out of training:
    none for a built-in task (its train split is apart already), else "test" when eval/accuracy is
    on the file's own held-out rows (--eval-data auto, --eval-size > 0) and "dev" under
    --dev-size: a row is never both trained on and evaluated."""
    if train_data in data.BUILTIN_NAMES:
        return ()
    return (("test",) if eval_data == "auto" and eval_size else ()) + (("dev",) if dev_size
                                                                       else ())


def training_examples(examples: list, train_data: str, eval_data: str = "auto",
                      eval_size: int = 500, dev_size: int = 0) -> list:
    """The examples a run trains on: --train-data's (`examples`, as data.load_benchmark read them)
    less the rows the eval holds out (held_out_splits). ValueError when none is left."""
    held = {id(ex) for split in held_out_splits(train_data, eval_data, eval_size, dev_size)
            for ex in data.held_out(examples, split)}
    kept = [ex for ex in examples if id(ex) not in held]
    if not kept:
        raise ValueError(f"{train_data}: every row is held out for the eval (--eval-data "
                         f"{eval_data}): name an eval set with --eval-data, or set --eval-size 0")
    return kept


def _own_rows(train_data: str, split: str, n: int, data_dir: str, keys) -> list:
    """The first n rows of --train-data's `split` (data.held_out), the file read with `keys`;
    ValueError when it has none."""
    rows = data.held_out(data.load_benchmark(train_data, data_dir, keys[0] or None,
                                             keys[1] or None), split)
    if not rows:
        rule, flag = (0, "--eval-size") if split == "test" else (1, "--dev-size")
        raise ValueError(f"{train_data}: no row is in its {split} split (crc32(question) % 10 == "
                         f"{rule}, about one in ten): name an eval set with --eval-data, or set "
                         f"{flag} 0")
    return rows[:n]


def train_eval_sets(eval_size: int, benchmarks: str, k: int, temperature: float, template: str,
                    data_dir: str, train_data: str = data.BUILTIN, dev_size: int = 0,
                    tokenizer=None, keys: tuple[str, str] = ("", ""),
                    eval_data: str | None = None) -> dict:
    """train.py's periodic eval: {key: (examples, template, k, temperature, grader)} for
    "accuracy" (greedy; none when eval_size is 0): the first eval_size prompts of the built-in
    task's test split (data.builtin_test) or of a file's held-out rows (data.held_out, as many as
    there are), both in the template and grader the run trains with, or of the set `eval_data`
    names, in its own; "dev_accuracy" (greedy; none when dev_size is 0), the same from the dev
    split; and each comma-separated benchmark ("<bench>/mean@k"). `eval_data` None: "accuracy" and
    "dev_accuracy" from the built-in task's splits whatever `train_data` is (for a caller that does
    not hold a file's rows out of training: training_examples). Templates from `template`
    (--prompt-template; auto: data.template_for with `tokenizer`), each set graded by its rule under
    its template (verify.grader); a file is read with `keys` (--question-key, --answer-key; '' =
    data.py's guess). What each set is: eval_sets_about."""
    import verify
    sets = {}
    own = data.template_for(data.train_split(train_data), template, tokenizer)
    grade_own = verify.grader(train_data, own)
    builtin = train_data in data.BUILTIN_NAMES or eval_data is None
    if eval_size and eval_data not in ("auto", None):
        theirs = data.template_for(eval_data, template, tokenizer)
        examples = data.load_benchmark(eval_data, data_dir, keys[0] or None,
                                       keys[1] or None)[:eval_size]
        check_held_out(examples, eval_data, train_data, data_dir, keys, dev_size)
        sets["accuracy"] = (examples, theirs, 1, 0.0, verify.grader(eval_data, theirs))
    elif eval_size:
        examples = (data.builtin_test(train_data, eval_size) if builtin
                    else _own_rows(train_data, "test", eval_size, data_dir, keys))
        sets["accuracy"] = (examples, own, 1, 0.0, grade_own)
    if dev_size:
        examples = (data.builtin_dev(train_data, dev_size) if builtin
                    else _own_rows(train_data, "dev", dev_size, data_dir, keys))
        sets["dev_accuracy"] = (examples, own, 1, 0.0, grade_own)
    for name in filter(None, (n.strip() for n in benchmarks.split(","))):
        bench_template = data.template_for(name, template, tokenizer)
        sets[f"{data.bench_label(name)}/mean@{k}"] = (
            data.load_benchmark(name, data_dir, keys[0] or None, keys[1] or None),
            bench_template, k, temperature,
            verify.grader(name, bench_template))
    return sets


def check_held_out(examples: list, eval_data: str, train_data: str, data_dir: str,
                   keys: tuple[str, str], dev_size: int = 0) -> None:
    """eval/accuracy is on prompts never trained on: ValueError (one line) when a question of
    --eval-data's `examples` is one --train-data trains on (training_examples; by its text, spaces
    at either end aside), as when --eval-data names the training file itself."""
    train = data.load_benchmark(data.train_split(train_data), data_dir, keys[0] or None,
                                keys[1] or None)
    trained = {ex.question.strip()
               for ex in training_examples(train, train_data, eval_data, len(examples), dev_size)}
    both = sum(ex.question.strip() in trained for ex in examples)
    if both:
        raise ValueError(f"--eval-data {cli.shown_path(eval_data)}: {both} of its {len(examples)} "
                         f"questions are trained on (--train-data): use --eval-data auto")


def eval_sets_about(sets: dict, train_data: str, eval_data: str | None = None) -> dict[str, str]:
    """What each of train_eval_sets' "accuracy" and "dev_accuracy" is measured on, in words: the
    first screen's line and step 0's "eval_on" in metrics.jsonl. {key: "500 prompts of the built-in
    test split (builtin)"}; a file's: "47 held-out rows of my.jsonl (crc32(question) % 10 == 0,
    not trained on)". `eval_data` as train_eval_sets was given it."""
    about = {}
    for key, split in (("accuracy", "test"), ("dev_accuracy", "dev")):
        if key not in sets:
            continue
        n = len(sets[key][0])
        if key == "accuracy" and eval_data not in ("auto", None):
            about[key] = f"{n} prompts of {eval_data} (--eval-data)"
        elif train_data in data.BUILTIN_NAMES or eval_data is None:   # (train_eval_sets' rule)
            task = train_data if train_data in data.BUILTIN_NAMES else data.BUILTIN
            about[key] = f"{n} prompts of the built-in {split} split ({task})"
        else:
            rule = 0 if split == "test" else 1
            about[key] = (f"{n} held-out rows of {train_data} (crc32(question) % 10 == {rule}, "
                          "not trained on)")
    return about


# how evaluate_shard's numbers combine over ranks (metrics.Metrics.add): each rank's share, summed
COMBINE = {"eval/*": "sum"}


def evaluate_shard(engine, tokenizer, sets: dict, metrics, *, top_p: float, max_new_tokens: int,
                   seed: int, rank: int = 0, world: int = 1) -> None:
    """eval/<key>, this rank's share of mean@k, into `metrics` for each of train_eval_sets: rank r
    grades every world-th problem (the same weights on every rank), so the shares summed over ranks
    (COMBINE) are each set's mean@k, and `python eval.py --model <checkpoint>` with the same
    settings reproduces it."""
    for key, (examples, template, k, temperature, grader) in sets.items():
        mine, correct = examples[rank::world], 0.0
        if mine:
            from rollout import Sampling
            summary, _ = evaluate(engine, tokenizer, mine, template=template, k=k, grader=grader,
                                  sampling=Sampling(temperature, top_p, max_new_tokens, seed=seed))
            correct = summary["mean@k"] * len(mine)
        metrics.add(COMBINE, {f"eval/{key}": correct / len(examples)})


# ---- the CLI -------------------------------------------------------------------------------------

@dataclass
class Args:
    model: str = "assets/tiny-arith"
    """Hugging Face model directory (assets/tiny-arith is the built-in tiny model), or a Hub id
    (org/name), fetched where the Hub is reachable, as train.py's --model"""
    benchmarks: str = data.BUILTIN
    """comma-separated benchmark names (builtin, gsm8k, math500, aime24, amc23, minerva,
    olympiadbench, ...) or .jsonl/.json/.parquet files"""
    k: int = 1
    """samples per problem: mean@k, pass@1..k and maj@k are computed from them"""
    temperature: float = 0.0
    """sampling temperature; 0 is greedy"""
    top_p: float = 1.0
    """nucleus sampling mass"""
    max_new_tokens: int = 8
    """completion length limit in tokens; a sample that hits it counts as truncated
    (8 = train.py's default)"""
    seed: int = 0
    """sampling seed"""
    out: str = "runs/eval"
    """output directory for <bench>.jsonl, summary.json and summary.md"""
    data_dir: str = data.DEFAULT_DATA_DIR
    """where named benchmarks are read from"""
    prompt_template: Literal["auto", *data.TEMPLATES] = "auto"
    """auto = for the built-in tasks instruct (a chat model: its chat template over a direct
    question) or builtin (a model without a chat template), plain for every other set"""
    question_key: str = ""
    """question field of a generic data file (dotted for nested)"""
    answer_key: str = ""
    """gold answer field of a generic data file (dotted for nested); a list there is one answer of
    several parts, all to be given, as train.py's --answer-key"""
    baseline: str = ""
    """summary.json of a baseline model's eval: adds AES per benchmark and for the macro row"""
    limit: int = 0
    """evaluate only the first N problems of each benchmark (0 = all)"""
    batch_size: int = 512
    """sequences per generation batch (512 = the TorchEngine default train.py evaluates with; the
    batch's padding can move greedy ties, so keep it equal to train.py's for identical numbers)"""
    device: str = "cpu"
    """torch device for the model"""


def parse_args(argv=None) -> Args:
    return cli.parse(Args, argv, __doc__.split("\n\n")[0])


def _repo_relative(path: str) -> str:
    """A relative path that does not exist from the working directory is taken from the repo
    root."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), path)
    return here if os.path.exists(here) else path


def load_inputs(args: Args):
    """Every input, checked before any sampling: (benchmarks {label: (examples, template,
    grader)}, baseline, model, tok)."""
    import verify
    if args.k < 1 or args.max_new_tokens < 1 or args.temperature < 0 or not 0 < args.top_p <= 1:
        raise ValueError("need --k >= 1, --max-new-tokens >= 1, --temperature >= 0 "
                         "and 0 < --top-p <= 1")
    benches = {}
    for name in [b.strip() for b in args.benchmarks.split(",") if b.strip()]:
        exs = data.load_benchmark(name, args.data_dir, args.question_key or None,
                                  args.answer_key or None)
        benches[data.bench_label(name)] = (exs[:args.limit] if args.limit > 0 else exs, name)
    if not benches:
        raise ValueError("--benchmarks is empty")
    baseline = load_baseline(args.baseline, benches) if args.baseline else None
    model_dir = _repo_relative(args.model)
    problem = cli.model_problem(model_dir)      # before importing torch: a typo answers at once
    if problem:
        raise ValueError(problem)
    from transformers.utils import logging as hf_logging
    from checkpoint import load_model
    hf_logging.disable_progress_bar()     # no bar for loading the weights, as in train.py's runs
    model, tokenizer = load_model(model_dir, device=args.device)
    for label, (exs, name) in benches.items():       # templates need the tokenizer (auto)
        template = data.template_for(name, args.prompt_template, tokenizer)
        benches[label] = (exs, template, verify.grader(name, template))
    os.makedirs(args.out, exist_ok=True)
    return benches, baseline, model, tokenizer


def load_baseline(path: str, names) -> dict[str, dict]:
    """The per-benchmark results of a baseline's summary.json, checked to hold what AES needs for
    every name."""
    try:
        results = json.loads(Path(path).read_text())["benchmarks"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ValueError(f"baseline {path} is not a summary.json written by eval.py") from None
    for name in names:
        b = results.get(name, {})
        if not (b.get("mean@k", 0) > 0 and b.get("length/mean", 0) > 0):
            raise ValueError(f"baseline {path}: AES needs mean@k > 0 and length/mean > 0 "
                             f"for {name}")
    return results


def markdown_table(results: dict[str, dict], k: int) -> str:
    cols = [(f"mean@{k}", "mean@k", 100), (f"pass@{k}", f"pass@{k}", 100),
            (f"maj@{k}", "maj@k", 100), ("length", "length/mean", 1),
            ("truncated %", "truncated/frac", 100)]
    if any("aes" in r for r in results.values()):
        cols.append(("AES", "aes", 1))
    lines = ["| benchmark | n | " + " | ".join(c for c, _, _ in cols) + " |",
             "|---" * (len(cols) + 2) + "|"]
    for name, r in results.items():
        cells = [f"{r[key] * scale:.{2 if key == 'aes' else 1}f}" for _, key, scale in cols]
        lines.append(f"| {name} | {r.get('n', '')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(args: Args, benches, baseline, model, tokenizer) -> dict:
    from engine import TorchEngine
    from rollout import Sampling
    engine = TorchEngine(model, tokenizer, batch_size=args.batch_size)
    sampling = Sampling(temperature=args.temperature, top_p=args.top_p,
                        max_new_tokens=args.max_new_tokens, seed=args.seed)
    results = {}
    for name, (examples, template, grader) in benches.items():
        summary, records = evaluate(engine, tokenizer, examples, template=template, k=args.k,
                                    sampling=sampling, desc=name, grader=grader)
        if baseline is not None:
            b = baseline[name]
            summary["aes"] = aes(summary["mean@k"], summary["length/mean"],
                                 b["mean@k"], b["length/mean"])
        results[name] = summary
        with open(os.path.join(args.out, f"{name}.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    keys = [key for key in results[next(iter(results))] if key not in ("n", "k", "aes")]
    macro = {key: sum(r[key] for r in results.values()) / len(results) for key in keys}
    if baseline is not None:
        base = {key: sum(baseline[name][key] for name in results) / len(results)
                for key in ("mean@k", "length/mean")}
        macro["aes"] = aes(macro["mean@k"], macro["length/mean"],
                           base["mean@k"], base["length/mean"])
    summary = {"benchmarks": results, "macro": macro, "args": dataclasses.asdict(args)}
    table = markdown_table({**results, "average": macro}, args.k)
    Path(args.out, "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    Path(args.out, "summary.md").write_text(table + "\n")
    print(table)
    print(f"wrote {args.out}/summary.json, summary.md and one .jsonl per benchmark")
    return summary


if __name__ == "__main__":
    args = parse_args()
    # bad input ends in one line and exit status 2, as train.py's; a bug past this point still
    # shows its traceback
    try:
        inputs = load_inputs(args)
    except (ValueError, OSError, ImportError, KeyError) as e:
        print(cli.relative_paths(f"error: {e}"), file=sys.stderr)
        sys.exit(2)
    main(args, *inputs)
