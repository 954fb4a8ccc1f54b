"""R²PO (arXiv 2601.11960; its abstract and official code, RRPO-ARR/Code, were read): training
rollouts sampled from a residual rollout head that inference never uses.

    python train.py --preset r2po          # rank-64 head, 8 head steps then 10 policy steps

Training rollouts are sampled from

    z_rollout = z + W2 · ReLU(W1 · h),      z = lm_head(h) the base logits,
                                            h the last hidden state (after the final norm),

while eval and the saved model use z alone. The loop alternates two phases (`--r2po-schedule H,P`:
H loop steps of the head phase, then P of the policy phase, and again; a function of the step,
so a resumed run continues in the same phase):

- head phase (`R2PO.head_step`): the base is frozen, the head takes one optimizer step on this
  step's head-sampled rollouts, with rarity advantages (`rarity_advantages`) and a k3 KL of the
  rollout policy to an anchor (`--r2po-kl-anchor`: the initial model, the official code's, or
  the current base policy);
- policy phase: the spine's GRPO update on head-sampled rollouts, ratios against the base head's
  log-probs at generation (`Rollout.logprobs`), uncorrected for sampling from the head (the
  paper's choice).

It fills the step slot (`Phases.wrap`: the loop step in the schedule's phase, the head phase's
step in place of sample, store, update and sync; the head and its optimizer in checkpoints) and
hands the head to the engine (`TorchEngine.logits_head`, which samples through it when
`Sampling.use_head`); vLLM cannot, so --engine vllm is refused with the flags, before any engine
starts (`Flags.needs_torch_engine`), and --engine auto picks torch.
Departures from the official code, each a flag with the official value available:

    setting                 official code                           here (--preset r2po)
    head lr                 1e-6 (AdamW; the policy's too)          --r2po-head-lr 1e-3 (dev)
    schedule                ~20 head loop steps, then 20-40 policy  --r2po-schedule 8,10
    KL to / coefficient     the initial model, 0.04 (k3)            the same
    temperature             0.9 (log-probs scored at 1)             0.9 (scored at 0.9)
    reward                  correct ±1, format +1.25 / -1           --reward correct+format
                                                                    --reward-wrong -1
    head                    W2 ReLU(W1 h), W1 d x d, W2 V x d       W1 r x d, W2 V x r (r = 64)
    head init               both N(0, 1e-6²)                        lora: W1 ~ N(0, 2/d), W2 = 0

Why the head lr and the init depart (a head at std 1e-6 does not move in tens of steps), and the
dev sweeps that chose them: docs/methods.md.
"""
import dataclasses
import re
import time
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from torch import Tensor

import grpo
import metrics as metrics_lib
import parallel
from data import Prompt
from metrics import Metrics, diversity, host_sum
from rollout import Sampling, StepOut, completion_logits, forward_logprobs, micro_batches

HEADS = ("none", "residual")
KL_ANCHORS = ("initial", "current")   # the head's KL to: the model at step 0 | the current base
HEAD_INITS = ("lora", "official")     # ResidualHead's init: W1 Kaiming, W2 = 0 | both N(0, 1e-6²)


@dataclass(frozen=True)
class Flags:
    # ---- R²PO ------------------------------------------------------------------------------------
    r2po_head: Literal[HEADS] = "none"
    """R²PO: none | residual (training rollouts sampled from base + a low-rank residual head; eval
    uses the base)"""
    r2po_head_rank: int = 64
    """R²PO: rank r of the head W2 ReLU(W1 h): r (d + V) parameters (64: 2% of a 0.5B model)"""
    r2po_head_init: Literal[HEAD_INITS] = "lora"
    """R²PO: the head's init: lora (W1 ~ N(0, 2/d), W2 = 0: starts at the base, moves from the
    first step) | official (both N(0, 1e-6²): the official code's)"""
    r2po_schedule: str = "8,10"
    """R²PO: 'H,P' = H loop steps of the head phase (base frozen), then P of the policy phase (head
    frozen), again"""
    r2po_head_lr: float = 1e-3
    """R²PO: the head's AdamW learning rate (the official code: 1e-6 at 3B-8B; the preset's is
    chosen on the dev split)"""
    r2po_kl_coef: float = 0.04
    """R²PO: head phase, coefficient of the k3 KL of the rollout head's policy to the anchor
    (--r2po-kl-anchor; the official code: 0.04)"""
    r2po_kl_anchor: Literal[KL_ANCHORS] = "initial"
    """R²PO: head phase, the KL's anchor: initial (the model as loaded at step 0, frozen: the
    official code's) | current (the current base policy)"""

    AT_LEAST_1 = ("r2po_head_rank",)
    AT_LEAST_0 = ("r2po_head_lr", "r2po_kl_coef")

    def rules(self) -> list[tuple[bool, str]]:
        return [(not re.fullmatch(r"\d+,[1-9]\d*", self.r2po_schedule),
                 f"--r2po-schedule must be 'H,P' (loop steps of the head phase, >= 0, then of the "
                 f"policy phase, >= 1), got {self.r2po_schedule!r}")]

    @property
    def needs_torch_engine(self) -> str:
        """Why R²PO needs the torch engine ("" without a head): the rule checked with the flags,
        before any engine starts (flags.torch_engine_needed)."""
        if self.r2po_head == "none":
            return ""
        return ("--r2po-head residual needs the torch engine (vLLM cannot add R²PO's head to "
                "its logits)")

    @property
    def needs_initial(self) -> bool:
        """Whether the head's KL anchor is the model as loaded (a frozen copy: run_setup.build)."""
        return self.r2po_head != "none" and self.r2po_kl_anchor == "initial"


class Shared(NamedTuple):
    """What the head step takes from the rest of the run: its clip and aggregation (the policy's
    objective's), --temperature, L_max, the micro-batching and the gradient clip."""
    eps_low: float
    eps_high: float
    agg: str
    temperature: float
    max_len: int
    micro_batch_size: int
    micro_batch_tokens: int
    max_grad_norm: float
    group_size: int


def rarity_advantages(rewards: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """The head phase's advantage: reward the rollout head for outcomes that are rare in their
    group,

        u_i = 1 / |{j in g(i) : r_j = r_i}|,     A_i = (u_i - mean_g(u)) / (std_g(u) + eps)

    standardised as grpo.grpo_advantages does (Bessel std, eps = 1e-6). With 0/1 rewards and 1
    correct of 8, the correct rollout has u = 1 and the 7 wrong ones u = 1/7. A group whose u are
    all equal (all one outcome, or as many of each) gets exactly 0: the head step skips those
    groups. Returns [B].
    """
    pairs = torch.stack([group_ids.double(), rewards.double()], 1)  # [B, 2] (group, outcome)
    _, inv, count = torch.unique(pairs, dim=0, return_inverse=True, return_counts=True)
    return grpo.grpo_advantages(1.0 / count[inv].to(rewards.dtype), group_ids, eps)   # [B]


class ResidualHead(torch.nn.Module):
    """The residual rollout head on the last hidden state h [..., d],

        residual = W2 · ReLU(W1 · h)   [..., V],     W1: r x d,  W2: V x r,

    low-rank, so r (d + V) parameters: a full head (the official code's W1 is d x d: d² + V d) is
    more than a quarter of a 0.5B model, r = 64 is 2% of Qwen2.5-0.5B (and of the built-in
    model). `init` (--r2po-head-init) draws from torch's global generator, which run_setup seeds
    the same on every rank, after nn.Linear's own draws (as the head always has):

    - lora: W1 ~ N(0, 2/d) (Kaiming normal, He et al. 2015: fan-in d, ReLU's gain), W2 = 0,
      as LoRA starts its second factor at 0. The residual is exactly 0, so the rollout policy
      starts exactly at the base policy; dL/dW2 = dL/dz · ReLU(W1 h)ᵀ is dL/dz's size (ReLU(W1 h)
      is of order 1), so the head's output moves by about the head lr from the first Adam step.
      (dL/dW1 = 0 at the first step, W2 being 0: W1 follows from the second.)
    - official: both N(0, 1e-6²) (the official code's `random_init`). The residual is ~1e-10 and
      each factor's gradient is scaled by the other, 1e-6: a saddle. Adam's steps do not depend
      on the gradients' scale only while they are well above its eps (1e-8), and here they are
      near it (~1e-8 on the built-in model), so its first steps barely move the product, which
      then grows as lr².

    fp32 always."""

    def __init__(self, hidden: int, vocab: int, rank: int, init: str):
        super().__init__()
        self.w1 = torch.nn.Linear(hidden, rank, bias=False)
        self.w2 = torch.nn.Linear(rank, vocab, bias=False)
        inits = {"lora": self.lora_init, "official": self.official_init}
        inits[init]()

    def lora_init(self) -> None:
        """W1 ~ N(0, 2/d), W2 = 0: the residual is exactly 0."""
        torch.nn.init.normal_(self.w1.weight, std=(2 / self.w1.in_features) ** 0.5)
        torch.nn.init.zeros_(self.w2.weight)

    def official_init(self) -> None:
        """W1, W2 ~ N(0, 1e-6²), the official code's."""
        for w in (self.w1.weight, self.w2.weight):
            torch.nn.init.normal_(w, std=1e-6)

    def forward(self, h: Tensor) -> Tensor:
        """[..., d] -> [..., V]: the residual on the logits."""
        return self.w2(torch.relu(self.w1(h.float())))


def head_forward(model, head: ResidualHead, batch: dict,
                 temperature: float) -> tuple[Tensor, Tensor]:
    """(log pi_base [b, T], log pi_rollout [b, T]) of a collated batch's tokens: the base model runs
    without gradient (the head phase freezes it), the head on top of it with."""
    with torch.no_grad():
        out, logits = completion_logits(model, batch, output_hidden_states=True)   # [b, T, V]
    T = logits.shape[1]
    ids = batch["input_ids"][:, -T:]
    head_logits = logits.float() + head(out.hidden_states[-1][:, -(T + 1):-1])
    base_logp = grpo.token_logprobs(logits, ids, temperature)
    return base_logp, grpo.token_logprobs(head_logits, ids, temperature)


class R2PO:
    """The head, its optimizer and its schedule, for one run (`make` builds it from its flags and
    what it shares with the run). The head is the same on every rank (made from the same seed) and
    stays whole: it is replicated, not sharded, and its gradients are summed over ranks. `initial`:
    the frozen model as loaded at step 0, the head's KL anchor under `--r2po-kl-anchor initial`
    (None otherwise)."""

    def __init__(self, head: ResidualHead, flags: Flags, shared: Shared,
                 initial: torch.nn.Module | None = None):
        self.head = head
        self.f = flags
        self.s = shared
        self.initial = initial
        self.opt = torch.optim.AdamW(head.parameters(), lr=flags.r2po_head_lr)
        h, p = (int(x) for x in flags.r2po_schedule.split(","))
        self.head_steps, self.policy_steps = h, p

    def phase(self, step: int) -> str:
        """"head" or "policy": H loop steps of the head phase, then P of the policy phase, and
        again."""
        in_cycle = step % (self.head_steps + self.policy_steps)
        return "head" if in_cycle < self.head_steps else "policy"

    def head_step(self, model, rollouts: list, pad_id: int, world: int) -> Metrics:
        """The head phase: one optimizer step of the rollout head with the base frozen,

            L = clipped surrogate of pi_rollout / pi_rollout,gen with rarity advantages
                + r2po_kl_coef * k3 KL(pi_rollout || pi_anchor)

        on this step's head-sampled rollouts; groups whose rarities are all equal are skipped.
        pi_anchor (`--r2po-kl-anchor`): initial = the model as loaded at step 0 (the official
        code's reference), its log-probs from a no-grad forward of `self.initial` on each
        micro-batch at --temperature; current = the current base policy. Metrics: r2po/head_kl
        (to the anchor) and r2po/head_kl_current (to the current base, always: head_forward
        returns its log-probs). The base gets no gradient (its forward runs without one), so FSDP
        joins only the forward passes, in lockstep; the frozen initial model is sharded as the base
        is, so its forwards join the same lockstep; the head's gradients are summed over ranks
        here."""
        f, s, metrics = self.f, self.s, Metrics()
        if f.r2po_kl_anchor == "initial" and self.initial is None:
            raise ValueError("--r2po-kl-anchor initial: R2PO needs the initial model (r2po.make "
                             "loads it)")
        rewards = torch.tensor([r.reward for r in rollouts])
        adv = rarity_advantages(rewards, grpo.group_ids(rollouts)).tolist()
        live = {r.prompt_id for r, A in zip(rollouts, adv) if A != 0}
        batch = [dataclasses.replace(r, advantage=A)
                 for r, A in zip(rollouts, adv) if r.prompt_id in live]
        n_groups = len({r.prompt_id for r in rollouts})
        metrics.add(COMBINE, {"r2po/head_groups_used": len(live) / max(n_groups, 1)})
        device = next(self.head.parameters()).device
        # the ratio's old log-probs: the head's, at generation
        mbs = micro_batches(batch, s.micro_batch_size, pad_id, device,
                            old_logprobs=[r.head_logprobs for r in batch],
                            max_tokens=s.micro_batch_tokens)
        normaliser = parallel.global_normaliser(mbs, s.agg, s.max_len, world)
        if normaliser is None:
            return metrics
        head_losses = []                  # tensors, read after the loop: no sync before a backward
        anchor = (self.initial,) if f.r2po_kl_anchor == "initial" else ()  # sharded: lockstep
        for mb in parallel.forward_passes(mbs, model, pad_id, world, followers=anchor):
            base_logp, logp = head_forward(model, self.head, mb, s.temperature)       # [b, T] each
            mask = mb["completion_mask"]
            log_w = grpo.token_log_ratio(logp, mb["old_logprobs"], mask)
            loss, _ = grpo.policy_loss(log_w, mb["advantages"], mask, eps_low=s.eps_low,
                                       eps_high=s.eps_high, agg=s.agg, normaliser=normaliser)
            kl = kl_current = grpo.kl_penalty(logp, base_logp, "k3")                # [b, T]
            if f.r2po_kl_anchor == "initial":
                with torch.no_grad():
                    initial_logp = forward_logprobs(self.initial, mb, s.temperature)[1]  # [b, T]
                kl = grpo.kl_penalty(logp, initial_logp, "k3")
            (loss + f.r2po_kl_coef * grpo.aggregate(kl, mask, s.agg, normaliser)).backward()
            head_losses.append(loss.detach())
            metrics.add(COMBINE, {"r2po/head_kl": grpo.masked_mean(kl.detach(), mask),
                                  "r2po/head_kl_current": grpo.masked_mean(kl_current.detach(),
                                                                           mask)},
                        tokens=mask.sum())
        head_loss = host_sum(head_losses)
        metrics.add(COMBINE, {"r2po/head_loss": head_loss})  # the step's surrogate, every rank's
        parallel.sum_gradients(self.head, world)
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), s.max_grad_norm or float("inf"))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return metrics

    def base_diversity(self, engine, generated: list, sampling: Sampling, metrics: Metrics) -> None:
        """At eval: the distinct-answer and distinct-chain shares of `group_size` completions of
        this step's prompts sampled from the base policy (no head), beside rollout/distinct_answers
        and rollout/distinct_chains of the head-sampled ones."""
        by_id = {r.prompt_id: Prompt(r.prompt_id, r.prompt_ids, r.answer) for r in generated}
        prompts = list(by_id.values())
        base = engine.generate(prompts, self.s.group_size, sampling)
        answers, chains = diversity(base)
        metrics.add(COMBINE, {"r2po/base_distinct_answers": answers,
                              "r2po/base_distinct_chains": chains}, prompts=len(prompts))

    # ---- checkpoints: the head and its optimizer, in each rank's file ----------------------------

    def state_dict(self) -> dict:
        """What resume needs (checkpoint.save keeps it in every rank's file): the head's weights
        (the same on every rank) and its AdamW state; the phase is a function of the step."""
        return {"head": self.head.state_dict(), "head_opt": self.opt.state_dict()}

    def files(self) -> dict:
        """The head alone, beside each checkpoint (checkpoint.save_files: HEAD_FILE): loads with
        safetensors.torch.load_file into a ResidualHead, without the trainer's state."""
        return {HEAD_FILE: self.head.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.head.load_state_dict(state["head"])
        self.opt.load_state_dict(state["head_opt"])


# R²PO's fields of the log line (metrics.fields): the phase (0 = the head's, 1 = the policy's) and,
# in the head phase, the head's loss
LOG = ("r2po phase {r2po/phase:.0f}", "head loss {r2po/head_loss:+.4f}")
# how its metrics combine over micro-batches and ranks (metrics.Metrics.add): the share of groups
# used and the phase (the same on every rank), the head's KL over the completion tokens, its loss
# every rank's, the base policy's diversity over the prompts probed
COMBINE = {"r2po/head_groups_used": "mean", "r2po/head_kl": "mean tokens",
           "r2po/head_kl_current": "mean tokens", "r2po/head_loss": "sum",
           "r2po/base_distinct_answers": "mean prompts",
           "r2po/base_distinct_chains": "mean prompts", "r2po/phase": "max"}
BASE_SAMPLING_ROUND = 999          # the probe of the base policy at eval: its own sampling round
HEAD_FILE = "r2po_head.safetensors"   # the head alone, in each checkpoint (R2PO.files)

PRESETS = {
    "r2po": ("R²PO (arXiv 2601.11960, official code): rank-64 residual rollout head, 8 head "
             "then 10 policy steps, KL to the initial model, reward ±1 + format, T 0.9; lr 1e-4",
             dict(replay="none", r2po_head="residual", r2po_head_rank=64, r2po_schedule="8,10",
                  r2po_head_lr=1e-3, r2po_kl_coef=0.04, r2po_kl_anchor="initial",
                  reward="correct+format", reward_wrong=-1.0, temperature=0.9, lr=1e-4)),
}


class Phases(R2PO):
    """The step slot: R2PO's schedule around the loop step (`wrap`), with the spine's steps
    (methods.Steps) for the head phase's generation and the probe's sampling."""

    def __init__(self, head, flags: Flags, shared: Shared, initial, steps):
        super().__init__(head, flags, shared, initial)
        self.steps = steps

    def wrap(self, train_step):
        """The loop step under R²PO, train_step's signature: the spine's train_step in the policy
        phase; in the head phase 1. and 2. as the spine does them, then head_step in place of 3.
        to 6. (`head_phase`). Every step reports its phase, r2po/phase (0 = the head's, 1 = the
        policy's); a step the loop evaluates after also probes the base policy (base_diversity,
        its own sampling round)."""
        def step_in_phase(run, pos: int, *, step: int, guard):
            if self.phase(step) == "policy":
                out = train_step(run, pos, step=step, guard=guard)
            else:
                out = self.head_phase(run, pos, step=step)
            out.metrics.add(COMBINE, {"r2po/phase": float(self.phase(step) == "policy")})
            if run.settings.eval.due(step, run.settings.run.steps):
                sampling = self.steps.sampling(run, step, BASE_SAMPLING_ROUND)
                base = dataclasses.replace(sampling, use_head=False)
                self.base_diversity(run.engine, out.generated, base, out.metrics)
            return out
        return step_in_phase

    def head_phase(self, run, pos: int, *, step: int):
        """A step of the head phase: the spine's 1. and 2., then one head_step on the fresh
        rollouts (the engine asleep, the base untouched: nothing to sync). Returns what train_step
        does (StepOut), with no optimizer step of the policy."""
        fresh, generated, pos, m = self.steps.generate_and_score(run, pos, step)   # 1. and 2.
        t1 = time.perf_counter()
        run.engine.sleep(push_follows=False)     # no push follows: it wakes with its weights
        m.merge(self.steps.canary(run, generated, step))
        m.merge(self.head_step(run.model, fresh, run.tok.pad_token_id, run.world))
        m.add(metrics_lib.COMBINE, {"time/update": time.perf_counter() - t1})
        return StepOut(generated, pos, m, [])


def make(flags: Flags, run, steps) -> dict:
    """R²PO for `--r2po-head residual`, else {} (no head: the loop is plain GRPO). run.initial:
    the KL anchor under `--r2po-kl-anchor initial`, the model as loaded from --model (the original
    base, also when resuming from a checkpoint): a frozen copy, bf16 on CUDA and fp32 on the CPU,
    sharded as the policy under torchrun (run_setup.build loads it once, the KL reference of
    --kl-coef too); it is not saved in
    checkpoints. The head is made from the torch seed (the same on every rank); the door hands it
    to the engine (the head slot), which samples the training rollouts through it."""
    if flags.r2po_head == "none":
        return {}
    if not hasattr(run.engine, "logits_head"):
        raise ValueError("--r2po-head residual needs --engine torch: vLLM cannot add R²PO's head "
                         "to its logits")
    if flags.needs_initial and run.initial is None:
        raise ValueError("--r2po-kl-anchor initial: R2PO needs the initial model")
    config = run.model.config
    head = ResidualHead(config.hidden_size, config.vocab_size, flags.r2po_head_rank,
                        flags.r2po_head_init).to(run.device)
    s = run.settings
    rows, tokens = run.micro_batch
    shared = Shared(s.loss.eps_low, s.loss.eps_high, s.loss.agg, s.run.temperature,
                    s.run.max_new_tokens, rows, tokens, s.optim.max_grad_norm, s.run.group_size)
    phases = Phases(head, flags, shared, run.initial if flags.needs_initial else None, steps)
    # the head slot: the door hands the head to the engine, which samples through it
    return {"step": phases, "head": head}
