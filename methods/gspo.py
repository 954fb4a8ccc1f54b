"""GSPO (Zheng et al., "Group Sequence Policy Optimization", arXiv 2507.18071): the importance
weight of a whole response, its geometric mean of token ratios, in place of the token ratio.

    python train.py --preset gspo       # --ratio gspo, clip 3e-4 / 4e-4, 4 mini-batches a step

The GSPO-token form: every token of response i weighs s_i, and its gradient goes through the token
itself, so all tokens of a response are clipped together (`gspo_log_ratio`). Checked against
verl's core_algos.py (tests/test_golden.py).
"""
import torch
from torch import Tensor


GSPO_LOG_RATIO_MAX = 10.0    # verl's upper cap on GSPO's log s_i
CHOICES = {"ratio": ("gspo",)}
PRESETS = {
    "gspo": ("GSPO (arXiv 2507.18071): sequence ratio, clip 3e-4/4e-4, 4 mini-batches per step, "
             "no replay; lr 3e-5 (the long task's)",
             dict(replay="none", ratio="gspo", agg="seq-mean-token-mean", eps_low=3e-4,
                  eps_high=4e-4, mini_batches=4, lr=3e-5)),
}


def gspo_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO sequence ratio with token-wise gradient (arXiv 2507.18071: s_i, and the GSPO-token
    variant):

        log s_i  = (1/|y_i|) sum_{valid t} (logp_it - old_logp_it)
        log w_it = logp_it - sg(logp_it) + sg(log s_i),  capped above at 10 (verl)
    Its value is log s_i on every valid token; its gradient is grad logp_it. 0 on invalid tokens.
    [B, T].
    """
    valid = mask.bool()
    log_s = torch.where(valid, logp - old_logp, 0.0).sum(-1) / valid.sum(-1).clamp(min=1)  # [B]
    log_w = logp - logp.detach() + log_s.detach()[:, None]                                  # [B, T]
    return torch.where(valid, log_w.clamp(max=GSPO_LOG_RATIO_MAX), 0.0)


class SequenceRatio:
    """The loss slot: GSPO's weight in place of the token ratio."""

    def log_ratio(self, logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
        return gspo_log_ratio(logp, old_logp, mask)


def make(flags, run, steps) -> dict:
    return {"loss": SequenceRatio()} if run.settings.loss.ratio == "gspo" else {}
