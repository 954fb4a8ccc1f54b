"""An example reward for `train.py --reward-fn` (reward_fn.py has the contract): the verdict, less
a price for every character past the gold answer's length, so that of two right answers the shorter
one earns more.

    python train.py --reward-fn examples/reward_length.py:right_and_brief --out-dir runs/brief
    python reward_fn.py examples/reward_length.py:right_and_brief " 42 and more" 42    # one value

The accuracy train.py logs is still the task's own grader's; only what the advantage is computed
from changes.
"""
import verify        # the repository's verifier (train.py runs with the repository on its path)

PRICE = 0.02         # reward lost per character past the gold answer's length


def right_and_brief(completion: str, gold_answer: str) -> float:
    """1 when the completion's answer has the gold value (verify.grade), else 0; minus PRICE for
    each character of the stripped completion beyond len(gold_answer)."""
    verdict = 1.0 if verify.grade(completion, gold_answer) else 0.0
    extra = max(len(completion.strip()) - len(gold_answer), 0)
    return verdict - PRICE * extra
