"""Prompt sets: the built-in synthetic arithmetic task (the default, no download), the published
math benchmarks, any JSONL/JSON/Parquet file of questions and answers, and the prompt templates.

    python data.py                         # prints a few built-in examples
    python data.py math500 minerva         # loads benchmarks by name and prints a count and one
                                           # example each

The built-in task: integer expressions of 2-3 single-digit operands joined by + - *, evaluated with
the usual precedence (9,300 expressions in all). Deterministic given a seed. Its three splits are
disjoint by construction, whatever the seed: an expression is in the test split iff
crc32(expression) % 10 == 0, in the dev split (what learning rates are chosen on) iff it is 1, and
in the train split otherwise, so no test or dev expression can ever appear in training. The prompt
is the expression followed by "=" and the gold answer is the integer value, e.g. "3+4*2=" -> "11";
it is graded by value (verify.grade).
The second built-in task (`builtin_steps`, long completions): 5-6 single-digit operands (at most
two "*", never two side by side), answered step by step, one operation per step:
    "7+6*9-3*2-1=" -> "7+54-3*2-1=7+54-6-1=61-6-1=55-1=54"
(worked solutions of 19 to 41 characters = tokens, mean 28.1); 25,000 distinct expressions drawn
with a fixed seed, split by the same crc32 rule. Its answer rule (STEPS_NAMES, verify.grader): only
a plain integer final answer scores, the text after the completion's last "=" must be an integer
literal equal to the gold, so a chain stopped early ("4-1+1*4=" answered "4-1+4", of the right
value) scores 0.
The third (`builtin_mixed`, a difficulty spread): 2 to 6 single-digit operands (the step-by-step
task's "*" rule), 2,000 distinct expressions of each count (all 300 of 2 operands), answered
directly and graded by value, so that per-prompt success spans 0..1; the same crc32 split.
Chat models get every built-in task through the instruct template (`apply_template`): the chat
template over a direct instruction, "What is 4*5-7+1? Reply with only the number.".

Benchmarks (`load_benchmark(name)`; files read in place from `data_dir`, default ../shared/data, in
the layouts they are published in; a row without a gold answer is an error naming the file and line,
never a silent skip; a missing file, one naming the file and --data-dir). The five of the RLVR
papers come as the evaluation data of QwenLM/Qwen2.5-Math publishes them (on GitHub, its
evaluation/data/NAME/test.jsonl for NAME = aime24, amc23, math500, minerva_math, olympiadbench),
GSM8K as openai/grade-school-math's test.jsonl and train.jsonl: each saved in data_dir under the
file name below, unchanged. Each as name: file | question | gold answer:

- builtin: (generated) | expression | its value; the test split, BUILTIN_TEST_SIZE examples, seed 0
- builtin_dev: (generated) | expression | BUILTIN_DEV_SIZE dev examples, seed 0
- builtin_train: (generated) | expression | BUILTIN_TRAIN_SIZE train examples, seed 0
- builtin_steps: (generated) | 5-6 operands | its value; STEPS_TEST_SIZE test examples, seed 0
- builtin_steps_dev: (generated) | same | STEPS_DEV_SIZE dev examples, seed 0
- builtin_steps_train: (generated) | same | STEPS_TRAIN_SIZE train examples, seed 0
- builtin_mixed, builtin_mixed_dev, builtin_mixed_train: (generated) | 2-6 operands | its value;
  MIXED_TEST_SIZE, MIXED_DEV_SIZE, MIXED_TRAIN_SIZE examples, seed 0
- gsm8k, gsm8k_test / gsm8k_train: gsm8k_test.jsonl / gsm8k_train.jsonl | question |
  after "#### " in answer, commas removed
- math500: math500.jsonl | problem | answer
- aime24, amc23: aime24.jsonl, amc23.jsonl | problem | answer (AMC's floats 27.0 -> "27")
- minerva: minerva_math.jsonl | problem | the last \\boxed{...} of solution (nested braces)
- olympiadbench: olympiadbench.jsonl | question | final_answer: a list (or a list written as a
  string); items joined by ", ", "$" removed

Anything else is a path to a .jsonl / .json / .parquet file, read with `question_key` / `answer_key`
(dotted keys reach into nested objects, e.g. "reward_model.ground_truth"; a question given as a list
of chat messages uses the last user message). Without keys, the first of question/problem/prompt and
of answer/final_answer/ground_truth present is used.
"""
import ast
import functools
import json
import random
import zlib
from dataclasses import dataclass
from pathlib import Path

BUILTIN = "builtin"          # name of the built-in task wherever a prompt set is named
OPERATORS = "+-*"
MAX_OPERAND = 10             # operands are the digits 0..9
BUILTIN_TEST_SIZE = 500      # `load_benchmark("builtin")`: the held-out split every accuracy in
                             # this repo is quoted on
BUILTIN_DEV_SIZE = 500       # `load_benchmark("builtin_dev")`: of 912, what lrs are chosen on
BUILTIN_TRAIN_SIZE = 7450    # the whole train split (9,300 less 938 test and 912 dev)
SPLITS = ("train", "dev", "test")
DEFAULT_DATA_DIR = "../shared/data"
# The base-model instruction of the RLVR papers (Qwen2.5-Math evaluation, SimpleRL-Zoo, Dr. GRPO).
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
# The built-in tasks' instruction to a chat model: a direct question and the answer form it must
# take (verify.format_rule: the reply is the number alone).
DIRECT_INSTRUCTION = "What is {question}? Reply with only the number."
TEMPLATES = ("plain", "chat", "builtin", "instruct")


@dataclass
class Example:
    question: str
    answer: str


@dataclass
class Prompt:
    """A templated, tokenized question: what an engine generates from (rollout.py)."""
    prompt_id: int
    ids: list[int]
    answer: str = ""


def _split(expr: str) -> str:
    """The split of an expression, whatever the seed: crc32 % 10 == 0 test, == 1 dev, else train."""
    return {0: "test", 1: "dev"}.get(zlib.crc32(expr.encode()) % 10, "train")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(map(repr, SPLITS))}, got {split!r}")


def _all_expressions() -> list[str]:
    """Every expression of the task, in a fixed order: 2 operands (300) and 3 operands (9000)."""
    digits = [str(d) for d in range(MAX_OPERAND)]
    two = [a + o + b for a in digits for o in OPERATORS for b in digits]
    return two + [e + o + c for e in two for o in OPERATORS for c in digits]


def _drawn(pool, split: str, n: int | None, seed: int, task: str) -> list[str]:
    """The expressions of `pool` in `split` (_split), shuffled by random.Random("[task-]split-seed")
    (each task's own order), of which the first n are asked for (all if None): at least n must
    exist."""
    _check_split(split)
    exprs = list(_in_split(tuple(pool), split))
    random.Random(f"{task}-{split}-{seed}" if task else f"{split}-{seed}").shuffle(exprs)
    if n is not None and n > len(exprs):
        name = f"{task} {split}" if task else split
        raise ValueError(f"the built-in {name} split has {len(exprs)} examples, "
                         f"{n} were asked for")
    return exprs


@functools.lru_cache(maxsize=16)
def _in_split(pool: tuple[str, ...], split: str) -> tuple[str, ...]:
    """The expressions of pool in split, in pool's order (each task's pool: _split is a crc32 of
    each expression, computed once a process, not once a run)."""
    return tuple(e for e in pool if _split(e) == split)


def arithmetic_examples(split: str, n: int | None = None, seed: int = 0) -> list[Example]:
    """The first n examples (all if n is None) of the split ("train", "dev" or "test") in an
    order shuffled by seed."""
    exprs = _drawn(_all_expressions(), split, n, seed, "")
    # Only digits and + - * reach eval here: strings this module built itself, never model output.
    return [Example(question=e, answer=str(eval(e))) for e in exprs[:n]]


# ---- the second built-in task: the same arithmetic, worked step by step (long completions) -------

STEPS = "builtin_steps"      # its test split's name; builtin_steps_dev, _train the others
# The task's answer rule, on its splits only (verify.grader(name) -> verify.grade_integer): the text
# after the completion's last "=" (all of it without one), stripped, must be a plain integer literal
# -?[0-9]+ equal to the gold. "...=61-6=55", "55" and " 55 " score; "61-6" (unreduced), "55.0" and
# "+55" do not. Every other prompt set is graded by value (verify.grade), which accepts an
# unreduced expression of the right value.
STEPS_NAMES = (STEPS, "builtin_steps_dev", "builtin_steps_train")
STEPS_TEST_SIZE = 500        # of 2,455 test expressions
STEPS_DEV_SIZE = 500         # of 2,514 dev expressions
STEPS_TRAIN_SIZE = 20031     # the whole train split
STEPS_OPERANDS = (5, 6)      # operands of an expression, each count equally likely
STEPS_MAX_PRODUCTS = 2       # "*" per expression at most, never two side by side (digit x digit)
STEPS_POOL = 25_000          # distinct expressions drawn, all splits together
STEPS_POOL_SEED = "steps-pool"
STEPS_MAX_NEW_TOKENS = 48    # the longest worked solution (41 characters) and EOS fit


def worked_solution(expr: str) -> str:
    """The expression reduced one operation at a time, each intermediate form followed by "=",
    ending in its value: the leftmost * first (precedence), then + and - left to right.
    "7+6*9-3*2" -> "7+54-3*2=7+54-6=61-6=55". The task's rule (STEPS_NAMES) reads what follows the
    last "=": the gold is the final number."""
    tokens = []                                     # alternating ints and operator characters
    for ch in expr:
        if ch in OPERATORS and tokens and not isinstance(tokens[-1], str):
            tokens.append(ch)
        elif tokens and isinstance(tokens[-1], int):
            tokens[-1] = tokens[-1] * 10 + int(ch)
        else:
            tokens.append(int(ch))
    steps = []
    while len(tokens) > 1:
        i = tokens.index("*") if "*" in tokens else 1
        a, op, b = tokens[i - 1:i + 2]
        tokens[i - 1:i + 2] = [a * b if op == "*" else a + b if op == "+" else a - b]
        steps.append("".join(str(t) for t in tokens))
    return "=".join(steps)


def _steps_draw(rng: random.Random, counts: tuple[int, ...] = STEPS_OPERANDS) -> str:
    """One expression: an operand count from `counts`, each operator uniform over + - * and
    drawn again (all of them) while more than STEPS_MAX_PRODUCTS are "*" or two "*" are neighbours,
    digits uniform 0-9. Every product is then digit x digit, every intermediate value within
    -171..180."""
    k = rng.choice(counts)
    while True:
        ops = [rng.choice(OPERATORS) for _ in range(k - 1)]
        if ops.count("*") <= STEPS_MAX_PRODUCTS and "**" not in "".join(ops):
            break
    return "".join(str(rng.randrange(MAX_OPERAND)) + op for op in ops + [""])


@functools.lru_cache(maxsize=1)
def _steps_pool() -> tuple[str, ...]:
    """STEPS_POOL distinct expressions in the order first drawn (seed STEPS_POOL_SEED, whatever the
    caller's seed): 5-6 operands are too many to enumerate (8.1M and 243M before the "*" rule)."""
    rng, seen = random.Random(STEPS_POOL_SEED), {}
    while len(seen) < STEPS_POOL:
        seen.setdefault(_steps_draw(rng), None)
    return tuple(seen)


def arithmetic_chain_examples(split: str, n: int | None = None, seed: int = 0) -> list[Example]:
    """The step-by-step task: the first n examples (all if None) of the split in an order shuffled
    by seed. The question is the expression ("7+6*9-3*2-1", prompt "7+6*9-3*2-1=" under the builtin
    template), the gold answer its value ("54"); a completion scores when its last "=" is followed
    by that integer alone (the task's rule, at STEPS_NAMES), as worked_solution(question) does."""
    exprs = _drawn(_steps_pool(), split, n, seed, "steps")
    golds = _steps_golds()
    return [Example(question=e, answer=golds[e]) for e in exprs[:n]]


@functools.lru_cache(maxsize=1)
def _steps_golds() -> dict[str, str]:
    """Each pool expression's value (the last step of its worked solution), computed once."""
    return {e: worked_solution(e).rsplit("=", 1)[-1] for e in _steps_pool()}


# ---- the third built-in task: a difficulty spread, 2 to 6 operands answered directly -------------

MIXED = "builtin_mixed"      # its test split's name; builtin_mixed_dev, _train the others
MIXED_NAMES = (MIXED, "builtin_mixed_dev", "builtin_mixed_train")
MIXED_OPERANDS = (2, 3, 4, 5, 6)
MIXED_PER_COUNT = 2000       # distinct expressions of each operand count (2 operands: all 300)
MIXED_POOL_SEED = "mixed-pool"
MIXED_TEST_SIZE = 500        # of 840 test expressions
MIXED_DEV_SIZE = 500         # of 821 dev expressions
MIXED_TRAIN_SIZE = 6639      # the whole train split


@functools.lru_cache(maxsize=1)
def _mixed_pool() -> tuple[str, ...]:
    """MIXED_PER_COUNT distinct expressions of each operand count in MIXED_OPERANDS (all 300 of 2
    operands), drawn as the step-by-step task draws (_steps_draw's rule: at most two "*", never side
    by side, so every value is within -171..180) with seed MIXED_POOL_SEED, whatever the caller's
    seed; in the order first drawn, the counts one after another."""
    rng, pool = random.Random(MIXED_POOL_SEED), {}
    every_pair = len(OPERATORS) * MAX_OPERAND ** 2             # the 300 of 2 operands
    for k in MIXED_OPERANDS:
        want = len(pool) + (min(MIXED_PER_COUNT, every_pair) if k == 2 else MIXED_PER_COUNT)
        while len(pool) < want:
            pool.setdefault(_steps_draw(rng, (k,)), None)
    return tuple(pool)


def mixed_examples(split: str, n: int | None = None, seed: int = 0) -> list[Example]:
    """The difficulty-spread task: the first n examples (all if None) of the split, shuffled by
    seed; per-prompt success spans 0..1 (a model that answers 2 operands well rarely answers 6).
    The question is the expression ("4*5-7+1", prompt "4*5-7+1=" under the builtin template), the
    gold its value ("14"), graded by value (verify.grade). Split by the crc32 rule of the other
    built-in tasks (_split), so an expression is in the same split in every task that has it: no
    test or dev expression of any built-in task is ever trained on."""
    exprs = _drawn(_mixed_pool(), split, n, seed, "mixed")
    return [Example(question=e, answer=worked_solution(e).rsplit("=", 1)[-1]) for e in exprs[:n]]


def operands(question: str) -> int:
    """The operand count of a built-in expression ("4*5-7+1" -> 4): the difficulty of a prompt."""
    return sum(ch.isdigit() and (i == 0 or not question[i - 1].isdigit())
               for i, ch in enumerate(question))


# The built-in prompt sets, each with its train split (what --train-data NAME should train on).
BUILTIN_TRAIN_SPLITS = {BUILTIN: "builtin_train", STEPS: "builtin_steps_train",
                        MIXED: "builtin_mixed_train"}


BUILTIN_NAMES = (BUILTIN, "builtin_dev", "builtin_train", *STEPS_NAMES, *MIXED_NAMES)


def builtin_split(train_data: str, split: str, n: int | None = None) -> list[Example]:
    """A split of the built-in task a run trains on: the step-by-step one for
    builtin_steps[_train|_dev], the difficulty spread for builtin_mixed[_train|_dev], the
    arithmetic one otherwise."""
    if train_data in STEPS_NAMES:
        return arithmetic_chain_examples(split, n)
    if train_data in MIXED_NAMES:
        return mixed_examples(split, n)
    return arithmetic_examples(split, n)


def builtin_test(train_data: str, n: int | None = None) -> list[Example]:
    """The test split of the built-in task trained on: what train.py's eval/accuracy is on."""
    return builtin_split(train_data, "test", n)


def builtin_dev(train_data: str, n: int | None = None) -> list[Example]:
    """The dev split of the built-in task trained on: train.py's eval/dev_accuracy (--dev-size)."""
    return builtin_split(train_data, "dev", n)


def held_out(examples: list[Example], split: str) -> list[Example]:
    """The examples of a file (or any non-built-in prompt set) in `split`, by the built-in tasks'
    rule on the question's text (_split: crc32 % 10 == 0 test, == 1 dev, else train), in the file's
    order: disjoint by construction (a question repeated in the file is on one side only), about a
    tenth each for test and dev, and a row keeps its side when the file grows."""
    _check_split(split)
    return [ex for ex in examples if _split(ex.question) == split]


def train_split(name: str) -> str:
    """The train split of a built-in prompt set ("builtin" -> "builtin_train"); any other name is
    itself."""
    return BUILTIN_TRAIN_SPLITS.get(name, name)


def builtin_prompt(question: str) -> str:
    """The built-in task's template: the expression and '=' ("3+4*2" -> "3+4*2="); the model
    answers with the number. A question that ends in '=' already (a file's "8*7=") is kept as it is,
    never doubled into "8*7==". """
    q = question.rstrip()
    return q if q.endswith("=") else f"{q}="


# ---- prompt templates ----------------------------------------------------------------------------

def apply_template(example_or_question, template: str, tokenizer=None) -> str:
    """The prompt text for one question.

    plain:    question + "\\n" + BOXED_INSTRUCTION (the base-model template of the RLVR papers)
    chat:     the tokenizer's chat template over one user turn holding the plain text, with the
              generation prompt
    builtin:  builtin_prompt(question), "3+4*2="
    instruct: the chat template over DIRECT_INSTRUCTION, "What is 3+4*2? Reply with only the
              number." (the built-in tasks for a chat model)
    """
    q = (example_or_question.question if isinstance(example_or_question, Example)
         else example_or_question)
    if template == "builtin":
        return builtin_prompt(q)
    plain = f"{q}\n{BOXED_INSTRUCTION}"
    if template == "plain":
        return plain
    if template in ("chat", "instruct"):
        if not has_chat_template(tokenizer):
            raise ValueError(f"prompt template {template!r} needs a tokenizer with a chat "
                             "template; this one has none (use --prompt-template plain or builtin)")
        text = plain if template == "chat" else DIRECT_INSTRUCTION.format(question=q)
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    raise ValueError(f"unknown prompt template {template!r}; choose one of {', '.join(TEMPLATES)}")


def has_chat_template(tokenizer) -> bool:
    return bool(tokenizer is not None and getattr(tokenizer, "chat_template", None))


def model_template(tokenizer) -> str | None:
    """The template a model names as its own: "prompt_template" in its tokenizer_config.json (kept
    in tokenizer.init_kwargs, and written again by save_pretrained, so a checkpoint keeps it); the
    built-in tiny models name builtin, the only form they were trained on. None when it names none;
    ValueError for a name that is not a template."""
    named = (getattr(tokenizer, "init_kwargs", None) or {}).get("prompt_template")
    if named is not None and named not in TEMPLATES:
        raise ValueError(f"the model's tokenizer_config.json names prompt_template {named!r}, "
                         f"not one of {', '.join(TEMPLATES)}")
    return named


def template_for(name: str, choice: str = "auto", tokenizer=None) -> str:
    """The template of prompt set `name` (the one rule for training and evaluation): `choice` unless
    it is auto. auto = the template the model names as its own (model_template: builtin for the
    built-in tiny models) when it names one; else for the built-in tasks' splits instruct when the
    tokenizer has a chat template (an instruct model) and builtin otherwise; for every other set
    (a benchmark, a file) chat when the tokenizer has a chat template, plain (the base-model
    template of the RLVR papers) otherwise."""
    if choice != "auto":
        return choice
    own = model_template(tokenizer)
    if own is not None:
        return own
    if name in BUILTIN_NAMES:
        return "instruct" if has_chat_template(tokenizer) else "builtin"
    return "chat" if has_chat_template(tokenizer) else "plain"


def make_prompts(examples: list[Example], template: str, tokenizer) -> list[Prompt]:
    """The token ids of each templated question. A chat template already holds its special tokens,
    so none are added to it."""
    texts = [apply_template(ex, template, tokenizer) for ex in examples]
    special = template not in ("chat", "instruct")
    fast = getattr(tokenizer, "backend_tokenizer", None)     # a Hugging Face fast tokenizer's
    if fast is not None and fast.truncation is None and fast.padding is None and texts:
        # its Rust tokenizer, batched: the ids tokenizer(texts) gives, without building a Python
        # encoding object per text (half the time of a 20,000-prompt split)
        ids = [e.ids for e in fast.encode_batch(texts, add_special_tokens=special)]
    elif callable(tokenizer) and texts:  # another Hugging Face tokenizer: one batched call
        ids = tokenizer(texts, add_special_tokens=special)["input_ids"]
    else:
        ids = [tokenizer.encode(t, add_special_tokens=special) for t in texts]
    return [Prompt(i, row, ex.answer) for i, (row, ex) in enumerate(zip(ids, examples))]


def bench_label(name: str) -> str:
    """A prompt set's name in metrics and file names: the benchmark name, or a file's stem."""
    return name if name in BENCHMARK_NAMES else Path(name).stem


# ---- gold answers as published -------------------------------------------------------------------

def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}) in text, nested braces matched; None if
    there is none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
        j += 1
    return None                                  # unbalanced: no answer rather than a truncated one


def answer_text(value) -> str:
    """A published answer value as a string: 27.0 -> "27", [a, b] -> "a, b", None -> ""."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, tuple)):
        return ", ".join(answer_text(v) for v in value)
    return str(value).strip()


def gsm8k_answer(solution: str) -> str:
    """GSM8K's worked solution ends in '#### N'; N with thousands separators removed
    ("1,080" -> "1080")."""
    return solution.rsplit("####", 1)[1].strip().replace(",", "") if "####" in solution else ""


def olympiad_answer(final_answer) -> str:
    """OlympiadBench's final_answer is a list (sometimes written as a string of one); its items are
    LaTeX in $...$."""
    if isinstance(final_answer, str) and final_answer.strip().startswith("["):
        # a literal only: literal_eval runs no code
        final_answer = ast.literal_eval(final_answer.strip())
    return answer_text(final_answer).replace("$", "").strip()


# name -> (file, question field, gold answer from the row)
BENCHMARKS = {
    "gsm8k": ("gsm8k_test.jsonl", "question", lambda r: gsm8k_answer(r["answer"])),
    "gsm8k_test": ("gsm8k_test.jsonl", "question", lambda r: gsm8k_answer(r["answer"])),
    "gsm8k_train": ("gsm8k_train.jsonl", "question", lambda r: gsm8k_answer(r["answer"])),
    "math500": ("math500.jsonl", "problem", lambda r: answer_text(r["answer"])),
    "aime24": ("aime24.jsonl", "problem", lambda r: answer_text(r["answer"])),
    "amc23": ("amc23.jsonl", "problem", lambda r: answer_text(r["answer"])),
    "minerva": ("minerva_math.jsonl", "problem", lambda r: last_boxed(r["solution"]) or ""),
    "olympiadbench": ("olympiadbench.jsonl", "question",
                      lambda r: olympiad_answer(r["final_answer"])),
}
BENCHMARK_NAMES = (*BUILTIN_NAMES, *BENCHMARKS)


# ---- reading files -------------------------------------------------------------------------------

def read_records(path: Path) -> list[tuple[int, dict]]:
    """(line number, row) pairs of a .jsonl / .json / .parquet file. A malformed line raises naming
    file and line; a file that cannot be read (no permission, not UTF-8 text, not Parquet) raises
    OSError / ValueError naming the file."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:         # bad input here, not a bug: train.py's one-line ValueError
            raise ValueError(f"reading {path} needs pyarrow, which is not installed: "
                              "pip install pyarrow") from None
        try:
            return list(enumerate(pq.read_table(path).to_pylist(), start=1))
        except (OSError, ValueError) as e:        # pyarrow's ArrowIOError, ArrowInvalid
            raise ValueError(f"{path}: cannot read it as Parquet ({e})") from None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise OSError(f"{path}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}): not a JSON file") from None
    if suffix == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from None
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a JSON list of objects, got {type(rows).__name__}")
        return list(enumerate(rows, start=1))
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append((lineno, json.loads(line)))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: malformed JSON line ({e.msg})") from None
    return rows


class MissingField(KeyError):
    """A key that names no field: `key` as given, `at` the dotted path walked before the part that
    is missing ('' at the top), and `fields` the fields at that depth (None: not an object)."""

    def __init__(self, key: str, at: str, fields: list | None):
        super().__init__(key)
        self.key, self.at, self.fields = key, at, fields

    def describe(self) -> str:
        """"missing field 'a.x' (fields of a: p, q)"; at the top, "(fields: ...)"."""
        if self.fields is None:
            return f"missing field {self.key!r} ({self.at} is not an object)"
        of = f" of {self.at}" if self.at else ""
        return (f"missing field {self.key!r} (fields{of}: "
                f"{', '.join(map(str, self.fields)) or 'none'})")


class FieldError(ValueError):
    """A row's field that is there but holds no question or answer (an object, a list)."""


def _get(row: dict, key: str):
    """row[key], where a dotted key walks nested objects; MissingField names the depth where the
    walk stopped and the fields there (a typo in "item.qestion" lists item's fields)."""
    if key in row:
        return row[key]
    node, walked = row, []
    for part in key.split("."):
        if not isinstance(node, dict):
            raise MissingField(key, ".".join(walked), None)
        if part not in node:
            raise MissingField(key, ".".join(walked), list(node))
        node = node[part]
        walked.append(part)
    return node


def _is_chat(value) -> bool:
    """A list of chat messages ({"role": ..., "content": ...} objects)."""
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and "content" in m for m in value))


def _question_text(value) -> str:
    """A question as text; a list of chat messages gives its last user message."""
    if _is_chat(value):
        users = [m["content"] for m in value if m.get("role") == "user"]
        return (users or [value[-1]["content"]])[-1]
    return answer_text(value)


def _shown(value, width: int = 60) -> str:
    """A value as JSON, cut to `width` characters: what an error line quotes of a user's row."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= width else text[:width - 3] + "..."


def _value(value, key: str, what: str):
    """`value`, the row's field `key`, when it can be the question or the gold answer (`what`):
    text or a number; a question also a list of chat messages, an answer also a list of plain
    values (the published multi-answer form, OlympiadBench's: joined by ", "). An object, or any
    other list, is a FieldError naming the key and what it holds (an object: the keys inside it),
    never its repr taken as text: that would put the gold answer into the prompt, or make every
    gold a repr that nothing can match."""
    if isinstance(value, dict):
        inside = ", ".join(f"{key}.{k}" for k in list(value)[:4]) or "it is empty"
        raise FieldError(f"--{what}-key {key} names an object, not a value: {_shown(value)}; "
                         f"name a field inside it ({inside})")
    if not isinstance(value, (list, tuple)):
        return value
    if what == "question" and _is_chat(value):
        return value
    if what == "question" or any(isinstance(v, (dict, list, tuple)) for v in value):
        raise FieldError(f"--{what}-key {key} names a list of {len(value)}, not a value: "
                         f"{_shown(value)}")
    return value


def _guess_key(row: dict, candidates: tuple[str, ...], what: str, path: Path) -> str:
    for key in candidates:
        if key in row:
            return key
    raise ValueError(f"{path}: no {what} field among {', '.join(candidates)} "
                     f"(fields: {', '.join(row)}); name it with --{what}-key")


def _examples(path: Path, rows, question_of, answer_of, keyed: bool = False) -> list[Example]:
    """The examples of `rows` (read_records), each row's question and gold answer read by
    `question_of` / `answer_of`. A row without a field names the fields it has, and with `keyed`
    (a file of the user's: the fields are named by flags) the flag that names the field."""
    if not rows:
        raise ValueError(f"{path}: the file is empty (no rows)")
    out = []
    for lineno, row in rows:
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        q = _field(question_of, row, "question", keyed, f"{path}:{lineno}")
        a = _field(answer_of, row, "answer", keyed, f"{path}:{lineno}")
        if not q or not a:
            raise ValueError(f"{path}:{lineno}: empty {'question' if not q else 'gold answer'}")
        out.append(Example(question=q, answer=a))
    return out


def _field(read, row: dict, what: str, keyed: bool, where: str) -> str:
    """read(row), the row's question or answer (`what`); a missing field is a ValueError that
    names the fields the row has (and with `keyed` the flag --question-key / --answer-key)."""
    try:
        return read(row)
    except FieldError as e:
        raise ValueError(f"{where}: {e}") from None
    except KeyError as e:
        hint = f"; name the {what} field with --{what}-key" if keyed else ""
        missing = (e.describe() if isinstance(e, MissingField) else
                   f"missing field {e.args[0]!r} (fields: {', '.join(map(str, row)) or 'none'})")
        raise ValueError(f"{where}: {missing}{hint}") from None


def resolve_data_dir(data_dir: str) -> Path:
    """A relative data_dir is taken from the working directory, else from the repo root (so the
    default works from anywhere)."""
    p = Path(data_dir)
    if p.is_absolute() or p.is_dir():
        return p
    return Path(__file__).resolve().parent / p


def load_benchmark(name_or_path: str, data_dir: str = DEFAULT_DATA_DIR,
                   question_key: str | None = None,
                   answer_key: str | None = None) -> list[Example]:
    """Examples of a named benchmark (BENCHMARK_NAMES) or of a file. FileNotFoundError / ValueError
    with a message that names the file (and line) on bad input (a .parquet file without pyarrow:
    ValueError)."""
    if name_or_path == BUILTIN:
        return arithmetic_examples("test", BUILTIN_TEST_SIZE, seed=0)
    if name_or_path == "builtin_dev":
        return arithmetic_examples("dev", BUILTIN_DEV_SIZE, seed=0)
    if name_or_path == "builtin_train":
        return arithmetic_examples("train", BUILTIN_TRAIN_SIZE, seed=0)
    if name_or_path == STEPS:
        return arithmetic_chain_examples("test", STEPS_TEST_SIZE, seed=0)
    if name_or_path == "builtin_steps_dev":
        return arithmetic_chain_examples("dev", STEPS_DEV_SIZE, seed=0)
    if name_or_path == "builtin_steps_train":
        return arithmetic_chain_examples("train", STEPS_TRAIN_SIZE, seed=0)
    if name_or_path in MIXED_NAMES:
        split = {MIXED: "test", "builtin_mixed_dev": "dev"}.get(name_or_path, "train")
        size = {"test": MIXED_TEST_SIZE, "dev": MIXED_DEV_SIZE, "train": MIXED_TRAIN_SIZE}[split]
        return mixed_examples(split, size, seed=0)
    if name_or_path in BENCHMARKS:
        file, qkey, answer_of = BENCHMARKS[name_or_path]
        path = resolve_data_dir(data_dir) / file
        if not path.is_file():
            raise FileNotFoundError(f"benchmark {name_or_path!r}: {path} not found: set "
                                    f"--data-dir to the folder that holds {file} (data.py "
                                    "says where the benchmark files come from)")
        return _examples(path, read_records(path), lambda r: _question_text(r[qkey]), answer_of)
    path = Path(name_or_path)
    if path.suffix.lower() not in (".jsonl", ".json", ".parquet"):
        raise ValueError(f"unknown benchmark {name_or_path!r}: use one of "
                         f"{', '.join(BENCHMARK_NAMES)} or a .jsonl/.json/.parquet file")
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    rows = read_records(path)
    if not rows:
        raise ValueError(f"{path}: the file is empty (no rows)")
    first = next((r for _, r in rows if isinstance(r, dict)), {})
    qkey = question_key or _guess_key(first, ("question", "problem", "prompt"), "question", path)
    akey = answer_key or _guess_key(first, ("answer", "final_answer", "ground_truth"),
                                    "answer", path)
    return _examples(path, rows,
                     lambda r: _question_text(_value(_get(r, qkey), qkey, "question")),
                     lambda r: answer_text(_value(_get(r, akey), akey, "answer")), keyed=True)


if __name__ == "__main__":
    import sys
    if len(sys.argv) == 1:
        for ex in arithmetic_examples("train", 5):
            print(f"{builtin_prompt(ex.question)!r:16} gold {ex.answer}")
        for ex in arithmetic_chain_examples("train", 3):
            print(f"{builtin_prompt(ex.question)!r:16} gold {ex.answer:6s} "
                  f"worked {worked_solution(ex.question)}")
    if {"-h", "--help"} & set(sys.argv[1:]):
        sys.exit(print(__doc__.split("\n\n")[1]))                   # the two usage lines
    for name in sys.argv[1:]:
        try:
            exs = load_benchmark(name)
        except (ValueError, OSError) as e:
            sys.exit(f"error: {e}")
        print(f"{name}: {len(exs)} examples; first gold {exs[0].answer!r}; "
              f"question {exs[0].question[:80]!r}")
