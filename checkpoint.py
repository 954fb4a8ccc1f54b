"""Checkpoints that a crash cannot corrupt and that resume a run exactly: save, find, load.

    python train.py --save-every 10         # out_dir/checkpoints/step_000010/, ..., and at the end
    python train.py --resume auto           # the newest complete checkpoint in out_dir/checkpoints
    python train.py --resume runs/x/checkpoints/step_000040
    python eval.py --model runs/x/checkpoints/step_000040   # a plain Hugging Face model directory

One checkpoint, `out_dir/checkpoints/step_000040/`:

    config.json, generation_config.json, model.safetensors, tokenizer files
                                  the policy, full (unsharded) weights, gathered to rank 0: loads
                                  with AutoModelForCausalLM.from_pretrained
    args.json                     the run's Args
    trainer/state.json            step, skipped-step counters, world size (the same on every
                                  rank), the names of the objects whose state the rank files keep
    trainer/optimizer/            AdamW state through torch.distributed.checkpoint: each rank
                                  writes its own shard
    trainer/rank_00000.pt, ...    per rank: its data position, the python / torch RNGs, and the
                                  state_dict() of each object with state, by name: the replay
                                  buffer (contents, RNG, last stats), a slot's (R²PO's head and
                                  its optimizer: methods/r2po.py)
    r2po_head.safetensors, ...    an object's own files (its `files()`, rank 0's): what a user
                                  loads without the trainer's state (R²PO's rollout head)
    COMPLETE                      the marker, written last

Atomic: everything is written into `checkpoints/.tmp-step_000040`, every file is fsynced, the marker
is written, and only then is the directory renamed to `step_000040` (os.rename within one directory
is atomic on POSIX). A run killed mid-write leaves a `.tmp-*` directory, which `latest()` never
matches; a `step_*` directory without the marker (a partial copy, a non-POSIX filesystem) is ignored
too. Multi-node runs need `out_dir` on a filesystem every node sees.

What exact resume needs, and where it comes from: weights (model.safetensors, fp32 as trained),
optimizer moments and step counts (DCP), the data position and the replay buffer with its numpy
Generator (rank files), python's and torch's global RNGs (rank files; numpy's global RNG is used
nowhere: buffer.py owns a Generator), and the engine's sampling seed, which run_setup.py derives
from (seed, rank, step), so it needs no state. A checkpoint written by W ranks resumes with W
ranks: each rank's replay buffer belongs to that rank's share of the prompts.

Around them: `load_model` reads any Hugging Face directory (a checkpoint or a base model); `resolve`
reads `--resume DIR|auto`; `check_state` refuses a checkpoint that lacks the state of one of the
run's objects; `open_log` continues metrics.jsonl / samples.jsonl on resume (appending after the
resumed step, dropping lines of steps that are being redone); `point_final` keeps `out_dir/final`
a symlink to the last checkpoint; `changed_args` lists flags a resumed run changed;
`claim_out_dir` refuses to start a fresh run over an earlier one (`--resume auto` continues it,
`--overwrite` deletes it: `start_over`).
"""
import json
import os
import random
import re
import shutil
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_optimizer_state_dict)

import cli
from parallel import print0

MARKER = "COMPLETE"
STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step_{step:06d}")


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _fsync(path: str) -> None:
    """Flush a file's (or a directory's entries') data to disk: a rename is atomic, but only durable
    once the data it points at is."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


def rng_state() -> dict:
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(s: dict) -> None:
    random.setstate(s["python"])
    torch.set_rng_state(s["torch"])
    if s["cuda"]:
        torch.cuda.set_rng_state_all(s["cuda"])


def save_hf(model, tokenizer, path: str, state_dict=None) -> None:
    """`model` and `tokenizer` as a Hugging Face directory that plain transformers runs the way the
    trainer does: `model.generate` stops at EOS and pads with PAD, and AutoTokenizer gives back the
    tokenizer's own class (its save_pretrained names it in tokenizer_config.json).

    Where the model's configs name none, the tokenizer's ids are filled in (in place, on `model`'s
    configs): EOS and BOS in config.json and generation_config.json, PAD in generation_config.json
    only, which is where `generate` reads it. PAD in config.json would not be inert: transformers
    builds the input embedding with padding_idx = config.pad_token_id, which zeroes that row's
    gradient, so a run resumed from (or started on) such a directory would train differently from
    the run that wrote it. Ids a model already names (a real model's list of EOS ids in
    generation_config.json) are kept."""
    fill = {"eos_token_id": tokenizer.eos_token_id, "bos_token_id": tokenizer.bos_token_id}
    targets = [(model.config, fill)]
    if getattr(model, "generation_config", None) is not None:
        targets.append((model.generation_config, {**fill, "pad_token_id": tokenizer.pad_token_id}))
    for cfg, ids in targets:
        for name, value in ids.items():
            if getattr(cfg, name, None) is None and value is not None:
                setattr(cfg, name, value)
    model.save_pretrained(path, state_dict=state_dict, safe_serialization=True)
    tokenizer.save_pretrained(path)
    readable(path)


def readable(path: str) -> None:
    """The files directly in `path` get the mode a file written with open() gets, 0666 less the
    umask (0644 under the usual 022): transformers writes model.safetensors through a temporary
    file, mode 0600, which the group could not read."""
    mask = os.umask(0)
    os.umask(mask)                               # read, and put back: there is no getter
    for name in os.listdir(path):
        file = os.path.join(path, name)
        if os.path.isfile(file) and not os.path.islink(file):
            os.chmod(file, 0o666 & ~mask)


def save(root: str, step: int, model, opt, tokenizer, flags: dict, *, guard, state: dict,
         pos: int, rank: int, world: int) -> str:
    """Write checkpoint `step` under `root` atomically (what `restore` reads back); every rank calls
    it (the gathers are collective). `flags`: the run's flags as a dict (dataclasses.asdict of
    train.py's Args), written as args.json. `state`: {name: object} of the run's objects with
    state (the replay buffer, a slot's), each one's state_dict() kept under its name in this
    rank's file. Returns the checkpoint's directory."""
    trainer_state = {"step": step, "skipped": guard.skipped, "in_row": guard.in_row,
                     "state": sorted(state)}
    rank_state = {"pos": pos, "rng": rng_state(),
                  **{name: obj.state_dict() for name, obj in state.items()}}
    final, tmp = step_dir(root, step), os.path.join(root, f".tmp-step_{step:06d}")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # left by an earlier attempt that was cut off
        os.makedirs(os.path.join(tmp, "trainer"))
    _barrier()
    # Full state dict: all-gathered tensor by tensor, kept on rank 0's CPU only (cpu_offload), so no
    # GPU ever holds the whole model twice. An un-sharded model (plain `python`) is its own.
    if dist.is_initialized():
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(model, options=options)
    else:
        full = model.state_dict()
    if rank == 0:
        save_hf(model, tokenizer, tmp, state_dict=full)
        _write_json(os.path.join(tmp, "args.json"), flags)
        _write_json(os.path.join(tmp, "trainer", "state.json"),
                    {**trainer_state, "world_size": world})
        save_files(state, tmp)
    del full
    # plain `python`: a single-process DCP save is what we mean, say nothing
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        dcp.save({"optimizer": get_optimizer_state_dict(model, opt)},
                 checkpoint_id=os.path.join(tmp, "trainer", "optimizer"),
                 no_dist=not dist.is_initialized())
    torch.save(rank_state, os.path.join(tmp, "trainer", f"rank_{rank:05d}.pt"))
    _barrier()
    if rank == 0:
        for d, _, files in os.walk(tmp):
            for name in files:
                _fsync(os.path.join(d, name))
        with open(os.path.join(tmp, MARKER), "w") as f:
            f.write(f"step {step}\n")
        _fsync(os.path.join(tmp, MARKER))
        old = final + ".replaced"  # a fresh run writing over an earlier run's checkpoint
        if os.path.exists(final):
            os.rename(final, old)
        os.rename(tmp, final)                           # the commit point
        _fsync(root)
        shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def save_files(state: dict, where: str) -> None:
    """Each object's own files beside the checkpoint (`files()` -> {file name: {tensor name:
    tensor}}, written as safetensors): what a user reads with `safetensors.torch.load_file`,
    without the trainer's optimizer (R²PO's head)."""
    from safetensors.torch import save_file
    for obj in state.values():
        for name, tensors in getattr(obj, "files", dict)().items():
            save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                      os.path.join(where, name))


def load_model(path: str, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from a local Hugging Face directory, or from a Hub id (org/name) as
    transformers fetches it (as TRL takes one): from huggingface_hub's cache when it holds it, else
    downloaded where the Hub is reachable. FileNotFoundError (no such directory) / ValueError /
    OSError in one line (cli.model_problem, cli.hub_unreachable)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    problem = cli.model_problem(path)
    if problem:
        raise (ValueError if os.path.isdir(path) else FileNotFoundError)(problem)
    hub = cli.is_hub_id(path)
    local_only = not hub or hub_cached(path)
    if not local_only:
        require_hub(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=local_only,
                                                     dtype=dtype)
    except OSError as e:
        if not hub:
            raise
        raise OSError(f"--model {path}: {str(e).strip().splitlines()[0]}") from None
    model = model.to(device)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def hub_cached(model_id: str) -> bool:
    """Whether huggingface_hub's cache holds Hub model `model_id` (its config.json): loaded from
    there without a request."""
    from huggingface_hub import try_to_load_from_cache
    return isinstance(try_to_load_from_cache(model_id, "config.json"), str)


def require_hub(model_id: str, timeout: float = 10.0) -> None:
    """OSError, one line (cli.hub_unreachable), where the Hub does not answer one request to its
    endpoint within `timeout` seconds (or HF_HUB_OFFLINE is set): said at once, not after the
    downloader's minute of retries."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session
    if constants.HF_HUB_OFFLINE:
        raise OSError(cli.hub_unreachable(model_id))
    try:
        get_session().head(constants.ENDPOINT, timeout=timeout)
    except Exception:       # any way of not reaching it (DNS, refused, timeout, proxy): this line
        raise OSError(cli.hub_unreachable(model_id)) from None


def latest(root: str) -> str | None:
    """The newest complete checkpoint under `root`: a `step_N` directory holding the marker.
    Temporaries and directories without the marker are never chosen."""
    if not os.path.isdir(root):
        return None
    found = [(int(m.group(1)), name) for name in os.listdir(root) if (m := STEP_DIR.match(name))
             and os.path.isfile(os.path.join(root, name, MARKER))]
    return os.path.join(root, max(found)[1]) if found else None


def resolve(resume: str, out_dir: str, world: int = 1) -> str | None:
    """`--resume`: '' -> None (fresh start); 'auto' -> latest() in out_dir/checkpoints (None when
    there is none, so the same command starts and restarts a job); a path -> itself, if it is a
    complete checkpoint. ValueError for an incomplete one, or one written by another number of
    ranks."""
    if not resume:
        return None
    path = latest(os.path.join(out_dir, "checkpoints")) if resume == "auto" else resume
    if path is None:
        return None
    if not os.path.isfile(os.path.join(path, MARKER)):
        raise ValueError(f"--resume: {path} is not a complete checkpoint (no {MARKER} marker)")
    with open(os.path.join(path, "trainer", "state.json")) as f:
        written_by = json.load(f)["world_size"]
    if written_by != world:
        raise ValueError(f"--resume: {path} was written by {written_by} ranks, this run has "
                         f"{world}: each rank's replay buffer belongs to its share of the prompts")
    return path


def check_state(path: str, names) -> None:
    """ValueError unless checkpoint `path` keeps the state of each of `names` (the run's objects
    with state: its replay buffer, a slot's), so a run with a method's state (R²PO's head) resumes
    only from a run that kept it. A checkpoint written before state.json listed them kept the
    replay buffer's alone."""
    with open(os.path.join(path, "trainer", "state.json")) as f:
        kept = json.load(f).get("state", ["replay"])
    for name in names:
        if name not in kept:
            raise ValueError(f"--resume: {path} keeps no {name} state: it was written by a run "
                             f"without one (or by an older version of train.py)")


# flags a resumed run may change without changing what its steps compute
FREE_ON_RESUME = ("resume", "overwrite", "out_dir", "steps", "save_every", "eval_every",
                  "log_samples", "threads", "save_rollouts")


# ---- the out dir: one run's, never silently another's --------------------------------------------

# What a run of train.py leaves in its --out-dir: the logs (metrics.LOG_FILES), --tensorboard's
# folder, the checkpoints and the final link. Other files there (a bench script's run.log and
# argv.json, written before it starts train.py) are not a run's: they neither count nor go.
RUN_OUTPUTS = ("metrics.jsonl", "checkpoints", "final", "samples.jsonl", "updates.jsonl",
               "tensorboard")


def previous_run(out_dir: str) -> list[str]:
    """What an earlier run left in out_dir, of RUN_OUTPUTS (a folder named with a trailing "/",
    and counted only when it holds something); [] when nothing."""
    found = []
    for name in RUN_OUTPUTS:
        path = os.path.join(out_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            if os.listdir(path):
                found.append(name + "/")
        elif os.path.lexists(path):
            found.append(name)
    return found


def _few(found: list[str]) -> str:
    """The first two of previous_run's names, then "..." when there are more."""
    return ", ".join(found[:2]) + (", ..." if len(found) > 2 else "")


def claim_out_dir(out_dir: str, *, resume: str, overwrite: bool) -> None:
    """A fresh run (no --resume, no --overwrite) does not start over an earlier run's files in
    out_dir: ValueError (one line) naming what is there and both ways on. Reads only, so train.main
    calls it on every rank before the process group exists (no rank can have written yet), and
    every rank decides alike."""
    found = [] if resume or overwrite else previous_run(out_dir)
    if found:
        raise ValueError(f"{out_dir} already holds a run ({_few(found)}): continue it with "
                         f"--resume auto, or start over with --overwrite (deletes it)")


def start_over(out_dir: str, rank: int) -> None:
    """--overwrite: rank 0 deletes what an earlier run left in out_dir (previous_run) and says so;
    every rank waits for it. train.main calls it once the run's inputs are checked, so a typo in
    another flag loses nothing."""
    if rank == 0:
        found = previous_run(out_dir)
        for name in found:
            path = os.path.join(out_dir, name.rstrip("/"))
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        if found:
            print0(f"--overwrite: deleted the earlier run in {out_dir} ({_few(found)})")
    _barrier()


def changed_args(path: str, now: dict, free=FREE_ON_RESUME) -> list[str]:
    """'name: saved -> now' for each flag this run sets differently from the checkpoint's run (flags
    in `free` may change on resume without changing what the steps compute)."""
    with open(os.path.join(path, "args.json")) as f:
        saved = json.load(f)
    now = json.loads(json.dumps(now))              # as args.json has them: a tuple is a list
    return [f"{k}: {saved.get(k)!r} -> {v!r}" for k, v in now.items()
            if k not in free and saved.get(k) != v]


def load(path: str, model, opt, rank: int) -> tuple[dict, dict]:
    """Restore the optimizer into `opt` (sharded like `model`) and return (trainer_state, this
    rank's state). The weights themselves were loaded from `path` as a Hugging Face directory,
    before sharding; `resolve` has checked the world size."""
    with open(os.path.join(path, "trainer", "state.json")) as f:
        state = json.load(f)
    osd = get_optimizer_state_dict(model, opt)          # the target layout (DCP loads in place)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        dcp.load({"optimizer": osd}, checkpoint_id=os.path.join(path, "trainer", "optimizer"),
                 no_dist=not dist.is_initialized())
    set_optimizer_state_dict(model, opt, osd)
    rank_state = torch.load(os.path.join(path, "trainer", f"rank_{rank:05d}.pt"), weights_only=True)
    return state, rank_state


def open_log(path: str, start: int):
    """A fresh run truncates; a resumed run keeps the lines of steps <= start and appends, so the
    file reads as one run (a run killed after its last checkpoint may have logged steps that the
    resumed run now redoes)."""
    if start == 0:
        return open(path, "w")
    keep = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    if json.loads(line)["step"] <= start:
                        keep.append(line)
                # a line cut off by the kill: it belongs to a step being redone
                except json.JSONDecodeError:
                    pass
    with open(path + ".tmp", "w") as f:
        f.writelines(keep)
    os.replace(path + ".tmp", path)
    return open(path, "a")


def point_final(out_dir: str, ckpt: str) -> str:
    """out_dir/final -> the last checkpoint (a relative symlink, replaced atomically)."""
    link, tmp = os.path.join(out_dir, "final"), os.path.join(out_dir, ".final.tmp")
    if os.path.lexists(tmp):
        os.remove(tmp)
    # a real directory left by an older version of train.py
    if os.path.isdir(link) and not os.path.islink(link):
        shutil.rmtree(link)
    os.symlink(os.path.relpath(ckpt, out_dir), tmp)
    os.replace(tmp, link)
    return link


def restore(resume: str | None, model, opt, *, state: dict, guard, rank: int,
            flags: dict) -> tuple[int, int]:
    """Load a checkpoint into the model, optimizer, guard, RNGs and each object of `state` ({name:
    object with load_state_dict}, as `save` took it); returns (step, prompt position), (0, 0) when
    `resume` is None. `flags` (the run's, as a dict) are compared with the checkpoint's args.json:
    a changed one is a warning."""
    if resume is None:
        return 0, 0
    trainer_state, mine = load(resume, model, opt, rank)
    for name, obj in state.items():
        obj.load_state_dict(mine[name])
    guard.skipped, guard.in_row = trainer_state["skipped"], trainer_state["in_row"]
    set_rng_state(mine["rng"])
    print0(f"resumed from {resume} at step {trainer_state['step']}")
    for change in changed_args(resume, flags):
        print0(f"warning: resumed with a changed flag, {change}")
    return trainer_state["step"], mine["pos"]
