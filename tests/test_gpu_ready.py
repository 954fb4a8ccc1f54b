"""What a first GPU run needs, checked on the CPU: one process on CUDA takes the bf16 path,
micro-batches cut by a token budget leave the gradient alone, the update's memory estimate warns, a
LOCAL_RANK past the GPUs is one error line, vLLM wakes only after the trainer's cache is freed, the
canary's bf16 floor, and FSDP2 reshards after a no-grad forward."""
import copy
import dataclasses
import io
import os
import re
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from types import SimpleNamespace

import pytest
import torch

import checkpoint
import cli
import engine as engine_lib
import flags
import memory
import rollout
import run_setup
import train
import vllm_engine
from conftest import cpu_env
from make_tiny_model import make_model, make_tokenizer
from rollout import Rollout
from tiny import memory_asked, setup, update

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rollouts(vocab: int, n: int = 12, seed: int = 0) -> list[Rollout]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        P, T = 2 + i % 4, 1 + (i * 5) % 7
        prompt = torch.randint(0, vocab - 2, (P,), generator=g).tolist()
        completion = torch.randint(0, vocab - 2, (T,), generator=g).tolist()
        out.append(Rollout(prompt_id=i // 4, prompt_ids=prompt, completion_ids=completion,
                           logprobs=[-4.0] * T, advantage=float(i % 3) - 1.0))
    return out


# ---- precision -----------------------------------------------------------------------------------

def test_precision_of_each_configuration():
    assert run_setup.precision("cuda", distributed=False) == "autocast-bf16"
    assert run_setup.precision("cuda:0", distributed=True) == "fsdp-bf16"
    assert run_setup.precision("cpu", distributed=False) == "fp32"
    assert run_setup.precision("cpu", distributed=True) == "fp32"


@pytest.mark.filterwarnings("ignore:CUDA is not available")       # the wrapper is made, not run
def test_one_process_cuda_setup_takes_the_bf16_path(monkeypatch):
    """setup() as plain `python train.py` on CUDA makes it (nothing here touches the GPU: the model
    is loaded on the CPU and the device's memory is made up, only the configuration is CUDA's): the
    policy's forward runs under bf16 autocast, the engine keeps its own fp32 copy."""
    real = checkpoint.load_model
    monkeypatch.setattr(checkpoint, "load_model", lambda path, device, *a: real(path, "cpu", *a))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(total_memory=2 ** 40))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 ** 40, 2 ** 40))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    args = flags.Args(engine="torch", replay="none", eval_size=8)
    run = setup(args, device="cuda")
    assert run.precision == "autocast-bf16"
    assert "forward" in vars(run.model)             # the autocast wrapper, on the instance
    assert "forward" not in vars(run.engine.model)
    cpu = setup(args)
    assert cpu.precision == "fp32" and "forward" not in vars(cpu.model)


def test_autocast_bf16_computes_in_bf16_and_keeps_fp32_weights_and_gradients():
    tok = make_tokenizer()
    model = run_setup.autocast_bf16(make_model(len(tok), seed=0), "cpu")
    ids = torch.tensor([[3, 4, 5, 6]])
    logits = model(input_ids=ids).logits
    assert logits.dtype == torch.bfloat16
    logits.float().sum().backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32
               for p in model.parameters() if p.grad is not None)


def test_canary_floor_is_what_bf16_alone_moves():
    tok = make_tokenizer()
    model = make_model(len(tok), seed=0)
    rs = rollouts(len(tok))
    floor = engine_lib.logprob_floor(model, rs, 1.0, tok.pad_token_id)
    assert 1e-4 < floor < 0.5  # bf16 has 8 bits of mantissa: a visible, small gap
    wrapped = run_setup.autocast_bf16(copy.deepcopy(model), "cpu")
    forward = wrapped.forward
    assert (engine_lib.logprob_floor(wrapped, rs, 1.0, tok.pad_token_id)
            == pytest.approx(floor, rel=1e-6))
    assert wrapped.forward is forward               # the wrapper is put back
    assert engine_lib.logprob_floor(model, [], 1.0, tok.pad_token_id) == 0.0


# ---- micro-batches by token budget ---------------------------------------------------------------

def test_length_buckets_respect_the_token_budget():
    rs = rollouts(50, n=40)
    length = [len(r.prompt_ids) + len(r.completion_ids) for r in rs]
    for budget in (8, 20, 64):
        chunks = rollout.length_buckets(rs, 16, budget)
        assert sorted(i for c in chunks for i in c) == list(range(40))
        assert all(len(c) <= 16 for c in chunks)
        assert all(len(c) == 1 or len(c) * max(length[i] for i in c) <= budget for c in chunks)
    assert rollout.length_buckets(rs, 16, 0) == rollout.length_buckets(rs, 16, 10 ** 9)


@pytest.mark.paths
def test_token_budget_leaves_the_update_alone():
    """One SGD step with micro-batches of at most 12 padded tokens against one without a budget: the
    same step up to float summation order (relative to the step's size)."""
    tok = make_tokenizer()
    base = make_model(len(tok), seed=0)
    batch = rollouts(len(tok))
    moved = []
    for tokens in (0, 12):
        model = copy.deepcopy(base).train()
        args = dataclasses.replace(flags.Args(), micro_batch_tokens=tokens, lr=0.5,
                                   max_grad_norm=0.0)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
        m = update(model, None, opt, batch, [], args, step=0, pad_id=tok.pad_token_id)
        pairs = zip(model.parameters(), base.parameters())
        moved.append(torch.cat([(p - q).flatten() for p, q in pairs]))
        assert m.reduce(1)["loss/tokens"] == sum(len(r.completion_ids) for r in batch)
    scale = moved[0].abs().max()
    assert scale > 1e-3
    # float32 micro-batches of other shapes sum in another order: ~1e-7 relative, so 1e-4 of the
    # step's size is rounding; a rollout lost or counted twice moves it by ~1e-1
    assert (moved[0] - moved[1]).abs().max() <= 1e-4 * scale


SMOLLM2 = SimpleNamespace(vocab_size=49_152, hidden_size=576, num_hidden_layers=30,
                          intermediate_size=1_536)


def shaped(config, numels: list[int]):
    """A stand-in model of `config` whose parameters have these sizes (numel), none allocated."""
    params = [SimpleNamespace(numel=lambda n=n: n) for n in numels]
    return SimpleNamespace(config=config, parameters=lambda: params)


def asked(**given) -> memory.Asked:
    """What these flags ask of the memory, bound as the door binds them (run_setup.memory_asked)."""
    return memory_asked(flags.Args(**given))


def test_what_the_flags_ask_of_the_memory_is_bound_at_the_door():
    """run_setup.memory_asked binds the four owners' flags memory.py reads, a method's completions
    a step (VIGOR's budget; 0 for fixed groups) and whether a frozen copy is kept (--kl-coef > 0,
    or R²PO's head anchored at the model as loaded); the copy shows in the estimate's copies."""
    plain = asked(max_new_tokens=64, micro_batch_size=7, engine="torch", eval_size=9)
    assert (plain.run.max_new_tokens, plain.optim.micro_batch_size, plain.engine.engine,
            plain.evals.eval_size) == (64, 7, "torch", 9)
    assert plain.completions == 0 and not plain.frozen
    assert asked(kl_coef=0.1).frozen and asked(r2po_head="residual").frozen
    assert not asked(r2po_head="residual", r2po_kl_anchor="current").frozen
    model = SimpleNamespace(config=SMOLLM2, parameters=lambda: [SimpleNamespace(numel=lambda: 10)])
    copies = [memory.update_memory(a, model, 4, engine_copy=False).copies
              for a in (plain, asked(kl_coef=0.1))]
    assert copies == [0, 4 * 10]


def test_auto_token_budget_from_activations_and_logits():
    """--micro-batch-tokens 0: the fewer of AUTO_LOGITS / V and AUTO_ACTIVATIONS / token_bytes.
    SmolLM2-135M's shape by hand: fp32 25 * 576 * 4 * 30 + 12 * 49,152 = 2,317,824 bytes a token,
    2^31 // that = 926 tokens; bf16 (halved activations) 1,453,824 -> 1,477; fp32 with
    --grad-checkpointing 30 * 576 * 4 + 25 * 576 * 4 + 589,824 = 716,544 -> 2,997. The tiny model
    (d 128, ff 384, 4 layers, V 98): (43 * 128 + 12 * 384) // 3 = 3,370 values a layer, 53,920 +
    1,176 = 55,096 bytes, 38,977 tokens (its logits: 2.7M)."""
    tok = make_tokenizer()
    model = make_model(len(tok), seed=0)
    optim = flags.OptimFlags()
    assert memory.micro_batch_tokens(optim, model) == 38_977 < memory.AUTO_LOGITS // len(tok)
    assert memory.micro_batch_tokens(flags.OptimFlags(micro_batch_tokens=77), model) == 77
    smol = SimpleNamespace(config=SMOLLM2)
    assert memory.token_bytes(SMOLLM2) == 2_317_824
    assert memory.micro_batch_tokens(optim, smol) == 926
    assert memory.micro_batch_tokens(optim, smol, bytes_per_value=2) == 1477
    ckpt = flags.OptimFlags(grad_checkpointing=True)
    assert memory.token_bytes(SMOLLM2, checkpointing=True) == 716_544
    assert memory.micro_batch_tokens(ckpt, smol) == 2997
    assert memory.sizes(asked(), smol, 1).micro_batch_tokens == 926            # what a run prints
    assert memory.sizes(asked(), smol, 1, 2,
                        4 * memory.AUTO_ACTIVATIONS).micro_batch_tokens == 5_461
    vigor = asked(allocation="vigor", vigor_budget=40)
    assert vigor.completions == 40 and memory.sizes(vigor, smol, 2).completions == 20
    assert memory.sizes(vigor, smol, 1).micro_batch_tokens == 926      # VIGOR's budget apart
    prompts = [SimpleNamespace(ids=[1, 2, 3])] * 64
    memory.check_sizes(asked(), model, prompts, memory.sizes(asked(), model, 1))      # no error


def test_memory_check_names_the_flag_that_fixes_it():
    """SmolLM2's shape, 134.5M parameters: 16 bytes each for training (2.0 GiB), a 4-byte engine
    copy (0.5 GiB), 926 auto-sized tokens (2.0 GiB), the runtime: about 5.2 GiB. On a 4 GiB machine
    an error that says --micro-batch-tokens N with N what fits 90% of it; with 1 GiB the weights
    alone do not fit; on a 24 GiB machine nothing, or a warning when little is free now."""
    model = shaped(SMOLLM2, [28_311_552] + [3_540_115] * 30 + [6])   # 134,515,008: the embedding
    args = asked(max_new_tokens=64, micro_batch_size=64)
    need = memory.update_memory(args, model, longest_prompt=44, foreach=False)   # the CPU
    assert need.training == 16 * 134_515_008 and need.copies == 4 * 134_515_008
    assert need.micro_batch == 926 * 2_317_824
    assert need.slack == int(926 * 0.75 * 1_728_000)           # the activations' part, 3/4 again
    assert 6.0 < need.total / memory.GiB < 6.5
    per_token = memory.peak_token_bytes(SMOLLM2)
    gib = memory.GiB

    def check(need, total, available, ranks_here=1):
        return memory.check_memory(need, per_token, checkpointing=False, total=total * gib,
                                   available=available * gib, what="RAM", ranks_here=ranks_here)

    assert check(need, 24, 20) is None
    assert "available now" in check(need, 24, 3)
    with pytest.raises(ValueError, match=r"--micro-batch-tokens (\d+)") as e:
        check(need, 4, 4)
    fits = int(re.search(r"--micro-batch-tokens (\d+)", str(e.value)).group(1))
    small = memory.update_memory(asked(max_new_tokens=64, micro_batch_size=64,
                                       micro_batch_tokens=fits), model, 44, foreach=False)
    assert small.total <= 0.9 * 4 * gib < small.total + per_token
    assert "--grad-checkpointing" in str(e.value)
    with pytest.raises(ValueError, match="alone do not fit"):
        check(need, 1, 1)
    # two ranks of one CPU node share its RAM: FSDP2 halves the training state, not the copies
    two = memory.update_memory(args, model, 44, world=2, foreach=False)
    assert two.training == need.training // 2 and two.copies == need.copies
    with pytest.raises(ValueError, match="2 x"):
        check(two, 8, 8, ranks_here=2)


@pytest.mark.parametrize("what, shape, params, longest, value_bytes, peak_gib", [
    # the README's your-data line on the tiny model, its file under the plain template (76 tokens
    # a prompt), fp32: printed 1.7 GiB, peaked at 2.4 over 100 steps (an Intel Xeon)
    ("your data", SimpleNamespace(vocab_size=98, hidden_size=128, num_hidden_layers=4,
                                  intermediate_size=384), 801_152, 76, 4, 2.4),
    # SmolLM2-135M --precision bf16: printed 5.2 GiB, peaked at 5.6-5.8 GiB
    ("smollm2 bf16", SMOLLM2, 134_515_008, 44, 2, 5.8),
    # the README's SmolLM2 line, fp32: 5.9 GB peak
    ("smollm2 fp32", SMOLLM2, 134_515_008, 44, 4, 5.9e9 / 2 ** 30),
])
def test_the_memory_estimate_is_at_or_above_the_measured_peaks(what, shape, params, longest,
                                                               value_bytes, peak_gib):
    """The estimate a run prints, against the peak resident memory measured for the README's runs:
    never below it (it was 1.7 against 2.4 and 5.2 against 5.8: the bf16 cast of the weights and
    the micro-batch's backward and allocator slack were missing), nor far above (a machine that can
    run it is not refused)."""
    class Params:
        def numel(self):
            return params

    model = SimpleNamespace(config=shape, parameters=lambda: [Params()])
    args = asked(max_new_tokens=16 if "smollm2" in what else 8)
    need = memory.update_memory(args, model, longest, bytes_per_value=value_bytes)
    assert peak_gib <= need.total / memory.GiB <= 1.15 * peak_gib, need.line()


def test_memory_estimate_of_a_05b_model_is_in_range():
    """Qwen2.5-0.5B's shape, 512 new tokens, bf16 activations (a GPU): weights + AdamW (~7.4 GiB),
    its engine copy, and one auto-sized micro-batch (2 GiB): about 12 GiB, not the 650 GB of 256
    rows."""
    class Params:                                   # numel without allocating half a billion floats
        def numel(self):
            return 494_032_768

    config = SimpleNamespace(vocab_size=151_936, hidden_size=896, num_hidden_layers=24,
                             intermediate_size=4_864)
    model = SimpleNamespace(config=config, parameters=lambda: [Params()])
    need = memory.update_memory(asked(max_new_tokens=512), model, longest_prompt=150,
                                bytes_per_value=2)
    assert 8 * 2 ** 30 < need.total < 20 * 2 ** 30


# ---- start-up and the vLLM engine's memory -------------------------------------------------------

def test_local_rank_past_the_gpus_is_one_error_line(monkeypatch, tmp_path):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="LOCAL_RANK 1, but this machine shows 1 GPU"):
        run_setup.setup_distributed()
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        assert train.main(["--steps", "1", "--out-dir", str(tmp_path / "run")]) == 2
    assert err.getvalue().startswith("error: LOCAL_RANK 1") and "Traceback" not in err.getvalue()


def test_vllm_wakes_only_after_the_trainer_cache_is_freed(monkeypatch):
    calls = []

    class FakeLLM:
        def wake_up(self, tags=None):
            calls.append(("wake", tuple(tags or ())))

        def collective_rpc(self, name, args):
            calls.append(("push", len(list(args[0]))))

        def reset_prefix_cache(self):
            calls.append(("reset",))

    engine = object.__new__(vllm_engine.VLLMEngine)
    engine.llm, engine.cuda, engine.asleep, engine.expected = FakeLLM(), True, True, None
    engine.dtype = torch.float32
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty_cache",)))
    engine.load_weights([("w", torch.zeros(2))])
    assert calls == [("empty_cache",), ("wake", ("weights",)), ("push", 1), ("empty_cache",),
                     ("wake", ("kv_cache",)), ("reset",)]
    calls.clear()
    engine.asleep, engine.level = True, 1
    engine.wake_up()
    assert calls[:2] == [("empty_cache",), ("wake", ())]


# ---- FSDP2: reshard after a no-grad forward ------------------------------------------------------

RESHARD = """
import sys, torch, torch.distributed as dist
sys.path[:0] = [{root!r}, {assets!r}]
import parallel, rollout, run_setup, train
from make_tiny_model import make_model, make_tokenizer
from torch.distributed.tensor import DTensor
torch.set_num_threads(1)
rank, world, device = run_setup.setup_distributed()
tok = make_tokenizer()
model = train.shard_model(make_model(len(tok), seed=0), device)
rs = [rollout.Rollout(0, [3, 4], [5, 6], [-1.0, -1.0])] * (rank + 1)
kind = lambda: type(model.model.embed_tokens.weight).__name__
with torch.no_grad():
    model(input_ids=torch.ones(1, 3, dtype=torch.long))
left = kind()                                  # the root keeps its gathered parameters...
parallel.reshard(model)
after = kind()                                 # ...until resharded
rollout.lockstep_logprobs(model, rs, 1, 1.0, tok.pad_token_id, world)
# one write of the whole line: the two ranks share the pipe, and print's pieces could interleave
sys.stdout.write(f"{{rank}} {{left}} {{after}} {{kind()}}\\n")
sys.stdout.flush()
dist.barrier()
dist.destroy_process_group()
"""


def test_fsdp_reshards_after_no_grad_passes(tmp_path):
    script = tmp_path / "reshard.py"
    script.write_text(RESHARD.format(root=ROOT, assets=os.path.join(ROOT, "assets")))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",  # CPU
                           "--nproc-per-node", "2", str(script)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=cpu_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = sorted(line for line in proc.stdout.splitlines() if line[:2] in ("0 ", "1 "))
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert lines == ["0 Parameter DTensor DTensor", "1 Parameter DTensor DTensor"]


def test_cpu_bf16_precision_runs_trainer_and_engine_under_autocast(tmp_path):
    """--precision bf16 on the CPU: the trainer's forward and TorchEngine's copy both under bf16
    autocast (fp32 weights), the run's line says so, and two steps train with the canary (engine
    against trainer, both bf16 but in other shapes: bf16 rounding, ~1e-2) under its limit and the
    floor (what bf16 alone moves a log-prob) logged beside it. --allow-slow-bf16: on a CPU
    without bf16 units (emulated) the run would be refused, not what this test is about."""
    args = flags.Args(precision="bf16", steps=2, eval_size=8, check_every=1,
                      out_dir=str(tmp_path / "run"), prompts_per_step=8, replay="none",
                      allow_slow_bf16=True)
    run = setup(args)
    assert run.precision == "autocast-bf16"
    assert "forward" in vars(run.model) and "forward" in vars(run.engine.model)
    assert setup(dataclasses.replace(args, precision="auto")).precision == "fp32"
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        assert train.main(["--precision", "bf16", "--allow-slow-bf16", "--steps", "2",
                           "--eval-size", "8", "--check-every", "1", "--prompts-per-step", "8",
                           "--replay", "none", "--out-dir", str(tmp_path / "main")]) == 0
    assert "autocast-bf16" in out.getvalue()
    import json
    rows = [json.loads(line) for line in open(tmp_path / "main" / "metrics.jsonl")]
    diffs = [r["rollout/logprob_diff"] for r in rows if "rollout/logprob_diff" in r]
    floors = [r["rollout/logprob_floor"] for r in rows if "rollout/logprob_floor" in r]
    assert diffs and floors and max(diffs) < args.max_logprob_diff


def test_bf16_on_a_cpu_without_bf16_units_warns_naming_the_cause():
    """--precision bf16 on a CPU whose flags hold neither avx512_bf16 nor amx_bf16: one short
    sentence that says so, with the measured factor (torch emulates bf16 there); none with either
    flag, for fp32, or on a GPU."""
    avx2 = "flags\t\t: fpu vme sse sse2 avx avx2 fma"
    warning = flags.bf16_cpu_warning("bf16", "cpu", avx2)
    assert "no bf16 units" in warning and "12x slower than fp32" in warning
    assert len(f"warning: {warning}") <= 100
    assert flags.bf16_cpu_warning("bf16", "cpu", avx2 + " avx512f avx512_bf16") is None
    assert flags.bf16_cpu_warning("bf16", "cpu", avx2 + " amx_bf16 amx_tile") is None
    assert flags.bf16_cpu_warning("auto", "cpu", avx2) is None
    assert flags.bf16_cpu_warning("bf16", "cuda:0", avx2) is None
    assert flags.cpu_has_bf16(avx2) is False and flags.cpu_has_bf16("x amx_bf16") is True


def test_bf16_on_a_cpu_without_bf16_units_is_refused_unless_allowed(tmp_path, cpu_only,
                                                                    monkeypatch):
    """On such a CPU (here, one that says it has no bf16 units) --precision bf16 ends in one line,
    exit status 2, that names the flag that runs it all the same; with --allow-slow-bf16 the run
    goes on, one warning line at its start. The --help text states the measured numbers."""
    monkeypatch.setattr(flags, "cpu_has_bf16", lambda cpuinfo=None: False)
    tiny = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--eval-size", "0",
            "--max-new-tokens", "4", "--save-every", "0", "--threads", "1", "--precision", "bf16"]
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        rc = train.main([*tiny, "--out-dir", str(tmp_path / "a")])
    line = err.getvalue().strip()
    assert rc == 2 and len(line.splitlines()) == 1 and len(line) <= 100, line
    assert "12x slower than fp32" in line and "--allow-slow-bf16" in line
    out = io.StringIO()
    with redirect_stderr(io.StringIO()), redirect_stdout(out):
        rc = train.main([*tiny, "--allow-slow-bf16", "--out-dir", str(tmp_path / "b")])
    warnings = [w for w in out.getvalue().splitlines() if "no bf16 units" in w]
    assert rc == 0 and len(warnings) == 1 and warnings[0].startswith("warning: "), warnings
    doc = cli.field_docs(flags.Args)["precision"]
    assert "368 s against fp32's 40 s (12-13x; the update 13-16x)" in doc
