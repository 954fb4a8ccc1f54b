"""A reward of your own: `--reward-fn path/to/file.py:name` trains on the value of a Python function
instead of the verdict's term of the shaped reward.

    python train.py --reward-fn examples/reward_length.py:right_and_brief

The contract: `name` in `file.py` is called once per rollout as

    fn(completion, gold_answer) -> float              # or, if it has a parameter named prompt:
    fn(completion, gold_answer, prompt=prompt) -> float

with the decoded completion, the prompt set's gold answer and (only when asked for) the prompt's
text as the model saw it (template and special tokens included). It must return a real finite
number (int, float, bool or a numpy scalar); that number replaces the verdict's term, wrong + (right
- wrong) c, of allocation.shaped_reward (so --reward-right / --reward-wrong are unused; "+format"
and --overlong-buffer still add their terms), and the advantage is computed from it. The verdict
itself, r.correct, stays the task's grader's: the accuracy, DAPO's dynamic sampling and VIGOR's
ranking read it, not this reward. The function runs on every rank for that rank's rollouts; keep it
pure (no state between calls).

Checked before training (`make`, a ValueError of one line): the spec's form, the file, that it
imports (any exception its import raises is named with the line of the file it came from), that it
defines a function `name` and that the function takes (completion, gold_answer). Checked at every
call (`RewardFnError`, a ValueError that train.main prints as one line, exit status 2): the value is
a finite real number, and the call returns; an exception raised inside the function is named with
its type, message and the line of the user's file it came from, and the completion it was called
on. Under torchrun the rank whose reward failed is not alone: `parallel.stop_together` makes every
rank stop at the same step, the cause shown once.
"""
import importlib.util
import inspect
import math
import numbers
import os
import sys
import traceback


class RewardFnError(ValueError):
    """The user's reward function raised, or returned something that is not a finite real number:
    bad input found mid-run (one line, exit status 2)."""


def raised_at(e: BaseException, path: str) -> str:
    """Where in the user's file `path` the exception `e` was raised (" (mine.py, line 3)", from the
    last frame of its traceback in that file), or "" when no frame is in it."""
    here = os.path.abspath(path)
    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__)
             if os.path.abspath(f.filename) == here]
    return f" ({os.path.basename(path)}, line {lines[-1]})" if lines else ""


def what_raised(e: BaseException, path: str) -> str:
    """An exception as one line: "ZeroDivisionError: division by zero (mine.py, line 3)"."""
    message = " ".join(str(e).split())[:200]
    return f"{type(e).__name__}{': ' + message if message else ''}{raised_at(e, path)}"


def load(spec: str):
    """The function named by `spec` ("path/to/file.py:name"), checked: ValueError (one line) for a
    malformed spec, a missing or unimportable file, a missing name or one that cannot be called as
    fn(completion, gold_answer)."""
    path, _, name = spec.rpartition(":")
    if not path or not name.isidentifier():
        raise ValueError(f"--reward-fn {spec!r}: expected path/to/file.py:function_name")
    if not os.path.isfile(path):
        raise ValueError(f"--reward-fn: no such file: {path}")
    module_name = f"_reward_fn_{os.path.splitext(os.path.basename(path))[0]}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None:
        raise ValueError(f"--reward-fn: {path} is not a Python file (name it .py)")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module            # so that a dataclass in it can find its module
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ValueError(f"--reward-fn: {path}, line {e.lineno}: {e.msg}") from None
    except Exception as e:       # the user's module-level code: ImportError, NameError, anything
        raise ValueError(f"--reward-fn: importing {path} failed: {what_raised(e, path)}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        defined = [n for n, v in vars(module).items() if inspect.isfunction(v)
                   and v.__module__ == module_name]
        raise ValueError(f"--reward-fn: {path} has no function {name!r} (its functions: "
                         f"{', '.join(defined) or 'none'})")
    check_signature(fn, spec)
    return fn


def check_signature(fn, spec: str) -> None:
    """ValueError unless fn can be called as fn(completion, gold_answer) (and, when it has a
    parameter named prompt, with prompt= as well)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return                                   # a builtin without a signature: the call decides
    try:
        if wants_prompt(fn):
            sig.bind("completion", "gold", prompt="prompt")
        else:
            sig.bind("completion", "gold")
    except TypeError:
        raise ValueError(f"--reward-fn {spec}: it takes {sig}, but is called as "
                         f"fn(completion, gold_answer) or fn(completion, gold_answer, "
                         f"prompt=...)") from None


def wants_prompt(fn) -> bool:
    """Whether fn declares a parameter named prompt (it is then passed the prompt's text)."""
    try:
        return "prompt" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def checked(value, spec: str, completion: str) -> float:
    """value as a float, or RewardFnError when it is not a finite real number."""
    if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise RewardFnError(f"--reward-fn {spec} returned {value!r} ({type(value).__name__}) for "
                            f"the completion {completion[:40]!r}: it must return a finite number")
    return float(value)


class OwnReward:
    """The rollouts' rewards under --reward-fn `spec`: called on rollouts, one value each (from
    r.text, r.answer and, when the function asks for it, the decoded r.prompt_ids). A bad value or
    an exception of the function is a RewardFnError, raised at once, or with `hold` kept in
    `error` (the first one) while that call's rollouts get 0.0, for the caller to stop every rank
    at the same point (parallel.stop_together(own_reward.error, world))."""

    def __init__(self, fn, spec: str, tokenizer, hold: bool = False):
        self.fn, self.spec, self.tokenizer, self.hold = fn, spec, tokenizer, hold
        self.prompt = wants_prompt(fn)
        self.error: RewardFnError | None = None

    def __call__(self, rollouts) -> list[float]:
        try:
            return [self.one(r) for r in rollouts]
        except RewardFnError as e:
            if not self.hold:
                raise
            self.error = self.error or e
            return [0.0] * len(rollouts)

    def one(self, r) -> float:
        kw = {"prompt": self.tokenizer.decode(r.prompt_ids)} if self.prompt else {}
        return checked(call(self.fn, self.spec, r.text, r.answer, **kw), self.spec, r.text)


def make(spec: str, tokenizer, hold: bool = False) -> OwnReward | None:
    """--reward-fn `spec`'s rewards (OwnReward; `hold`: its errors kept for the caller), or None
    when `spec` is "" (the shaped reward's own verdict term). Loads and checks the function now
    (`load`)."""
    return OwnReward(load(spec), spec, tokenizer, hold) if spec else None


def call(fn, spec: str, completion: str, gold: str, **kw):
    """fn(completion, gold, **kw): the user's reward function called once; an exception it raises
    is a RewardFnError of one line naming it, where it was raised and the completion."""
    try:
        return fn(completion, gold, **kw)
    except Exception as e:
        raise RewardFnError(f"--reward-fn {spec} raised {what_raised(e, spec.rpartition(':')[0])} "
                            f"on the completion {completion[:40]!r} (gold {gold[:40]!r})") from None


if __name__ == "__main__":
    # python reward_fn.py FILE.py:NAME COMPLETION GOLD: the function's reward for one completion
    if len(sys.argv) != 4:
        sys.exit("usage: python reward_fn.py path/to/file.py:name COMPLETION GOLD_ANSWER")
    try:
        fn = load(sys.argv[1])
        kw = {"prompt": ""} if wants_prompt(fn) else {}
        reward = checked(call(fn, sys.argv[1], sys.argv[2], sys.argv[3], **kw), sys.argv[1],
                         sys.argv[2])
        print(round(reward, 6))          # 0.82, not float arithmetic's 0.8200000000000001
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
