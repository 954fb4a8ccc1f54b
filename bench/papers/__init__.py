"""Each paper's settings, a module per paper (bench/design.py's vocabulary): EXPERIMENTS maps an
experiment's name to the function that gives its settings (quick: the toy sizes the tests run)."""
from papers.dapo import dapo
from papers.headroom_drift import headroom_drift
from papers.mu_grpo import mu_grpo
from papers.pnpo import pnpo
from papers.r2po import r2po_exp
from papers.replay import replay
from papers.vigor import vigor

EXPERIMENTS = {"replay": replay, "mu-grpo": mu_grpo, "pnpo": pnpo, "dapo": dapo, "vigor": vigor,
               "headroom-drift": headroom_drift, "r2po": r2po_exp}
