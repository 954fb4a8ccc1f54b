"""Issue 56, a GPU node on the first try, checked on the CPU with made-up devices, versions and
memory: the engine named and why, a method's engine rule before any engine starts, frozen copies
in bf16 on CUDA, vLLM's sleep level, vLLM's share and the micro-batch budget from the GPU's memory,
and every term of the memory estimate."""
import dataclasses
import os
from types import SimpleNamespace

import pytest
import torch

import checkpoint
import flags
import memory
import run_setup
import vllm_engine
from engine import TorchEngine
from tiny import memory_asked, setup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = memory.GiB
QWEN_7B = SimpleNamespace(vocab_size=152_064, hidden_size=3_584, num_hidden_layers=28,
                          intermediate_size=18_944, tie_word_embeddings=False)


def shaped(config, numels: list[int]):
    """A stand-in model of `config` whose parameters have these sizes (numel), none allocated."""
    params = [SimpleNamespace(numel=lambda n=n: n) for n in numels]
    return SimpleNamespace(config=config, parameters=lambda: params)


def qwen_7b():
    """Qwen2.5-7B's shape: 7.6B parameters, the largest its 545M-value embedding."""
    return shaped(QWEN_7B, [545_001_472] * 2 + [6_525_000_000])


def fake_gpu(monkeypatch, gib: float, free_gib: float | None = None,
             reserved_gib: float = 0) -> None:
    """A made-up GPU of `gib`, `free_gib` of it free (all of it when None), `reserved_gib` held by
    this process's caching allocator."""
    free = gib if free_gib is None else free_gib
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(total_memory=int(gib * GiB)))
    monkeypatch.setattr(torch.cuda, "mem_get_info",
                        lambda device=None: (int(free * GiB), int(gib * GiB)))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: int(reserved_gib * GiB))


# ---- 1. the engine named, and why ----------------------------------------------------------------

def test_the_engine_and_why(monkeypatch):
    choose = vllm_engine.choose_engine
    assert choose("torch", cuda=True) == ("torch", "--engine torch", None)
    assert choose("auto", cuda=False) == ("torch", "auto: no CUDA", None)
    assert choose("auto", cuda=True, needs_torch="R²PO's head") == ("torch", "auto: R²PO's head",
                                                                    None)
    with pytest.raises(ValueError, match="not one of"):
        choose("tensorrt", cuda=True)


@pytest.mark.parametrize("installed, named", [("", "vllm is not installed"),
                                              ("0.40.1", "vllm 0.40.1 is installed")])
def test_auto_on_cuda_without_a_tested_vllm_warns_naming_the_version(monkeypatch, installed,
                                                                     named):
    """--engine auto on CUDA with vllm missing or outside VLLM_VERSIONS: torch, and a warning that
    says so, names the version and how to install the tested one (it was silent)."""
    monkeypatch.setattr(vllm_engine, "installed_vllm", lambda: installed)
    kind, why, warning = vllm_engine.choose_engine("auto", cuda=True)
    assert kind == "torch" and named in why and named in warning
    assert f"pip install 'vllm{vllm_engine.VLLM_VERSIONS}'" in warning
    assert vllm_engine.choose_engine("auto", cuda=False).warning is None     # the CPU: no warning


def test_auto_on_cuda_with_a_tested_vllm_picks_it(monkeypatch):
    monkeypatch.setattr(vllm_engine, "installed_vllm", lambda: "0.32.0")
    monkeypatch.setattr(vllm_engine, "_vllm_module", lambda: (object(), None))
    assert vllm_engine.choose_engine("auto", cuda=True) == ("vllm", "auto: CUDA and vllm 0.32.0",
                                                            None)


def test_the_first_screen_names_the_engine(capsys):
    setup(flags.Args(replay="none", eval_size=8))
    assert "engine torch (auto: no CUDA)" in capsys.readouterr().out


def test_the_tested_vllm_range_is_pinned_where_users_install_it():
    pin = f"vllm{vllm_engine.VLLM_VERSIONS}"
    for name in ("requirements.txt", os.path.join("docs", "gpus.md")):
        with open(os.path.join(ROOT, name)) as f:
            assert pin in f.read(), name


# the one install route with vLLM: vLLM first, then the rest with torch left as vLLM installed it
INSTALL = (f"pip install 'vllm{vllm_engine.VLLM_VERSIONS}'",
           "grep -v '^torch' requirements.txt | pip install -r /dev/stdin")


def test_one_install_route_with_vllm_everywhere_it_is_written():
    """Every place that says how to install vLLM writes the same two steps, in that order; none
    writes the one command that cannot resolve (vLLM 0.32.0 pins transformers < 5.20, and
    requirements.txt 5.24-5.25) or a vLLM release that does not exist (0.32.1)."""
    for name in ("requirements.txt", "docs/gpus.md", "ops/README.md", "ops/gpu_check.sh"):
        with open(os.path.join(ROOT, name)) as f:
            text = f.read()
        at = [text.find(step) for step in INSTALL]
        assert -1 < at[0] < at[1], (name, at)
        assert "-r requirements.txt 'vllm" not in text and "0.32.1" not in text, name


# ---- 2. a method's engine rule, before any engine starts -----------------------------------------

def test_r2po_with_vllm_is_refused_before_vllm_is_touched(monkeypatch):
    def no_vllm(*a, **k):
        raise AssertionError("vllm touched before the flags were checked")

    monkeypatch.setattr(vllm_engine, "_vllm_module", no_vllm)
    monkeypatch.setattr(vllm_engine, "start_vllm", no_vllm)
    args = flags.parse(["--preset", "r2po", "--engine", "vllm"])
    with pytest.raises(ValueError, match="r2po-head residual needs the torch engine"):
        flags.check_args(args)
    with pytest.raises(ValueError, match="r2po-head residual needs the torch engine"):
        setup(args)
    top_p = flags.parse(["--top-p", "0.9", "--engine", "vllm"])
    with pytest.raises(ValueError, match="--top-p < 1 needs the torch engine"):
        flags.check_args(top_p)


def test_auto_picks_the_engine_a_method_needs(monkeypatch):
    """On CUDA with a tested vllm, auto is vLLM, except for R²PO (or --top-p < 1): torch, and
    why."""
    monkeypatch.setattr(vllm_engine, "installed_vllm", lambda: "0.32.0")
    monkeypatch.setattr(vllm_engine, "_vllm_module", lambda: (object(), None))
    r2po = flags.parse(["--preset", "r2po"])
    kind, why, _ = vllm_engine.choose_engine("auto", cuda=True,
                                             needs_torch=flags.torch_engine_needed(r2po))
    assert kind == "torch" and "R²PO's head" in why
    assert flags.torch_engine_needed(flags.Args()) == ""
    assert vllm_engine.choose_engine("auto", cuda=True).kind == "vllm"


# ---- 3. frozen copies in bf16 on CUDA ------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:CUDA is not available")       # the wrapper is made, not run
def test_frozen_copies_are_bf16_on_cuda_and_fp32_on_the_cpu(monkeypatch):
    assert run_setup.frozen_dtype("cuda:3") == torch.bfloat16
    assert run_setup.frozen_dtype("cpu") == torch.float32
    args = flags.Args(engine="torch", replay="none", eval_size=8, kl_coef=0.01)
    assert setup(args).initial.model.embed_tokens.weight.dtype == torch.float32
    real = checkpoint.load_model           # CUDA's configuration, the tensors on the CPU
    monkeypatch.setattr(checkpoint, "load_model", lambda path, device, *a: real(path, "cpu", *a))
    fake_gpu(monkeypatch, 80)
    cuda = setup(args, device="cuda")
    assert cuda.initial.model.embed_tokens.weight.dtype == torch.bfloat16
    assert cuda.model.model.embed_tokens.weight.dtype == torch.float32    # the policy: fp32


def test_a_sharded_kl_reference_keeps_the_ranks_in_lockstep(tmp_path):
    """Under torchrun the KL reference is sharded as the policy: its forwards are collectives, so a
    rank with fewer micro-batches (replay and a small --micro-batch-tokens make them uneven from
    step 2) runs it in its padding passes too, between the policy's forward and backward as the
    loss does. Before that order was kept, step 2 hung."""
    import json
    import subprocess
    import sys

    from conftest import cpu_env
    out = tmp_path / "kl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(ROOT, "train.py"), "--threads", "1", "--steps", "3", "--prompts-per-step",
           "8", "--eval-size", "8", "--kl-coef", "0.05", "--micro-batch-tokens", "40",
           "--save-every", "0", "--out-dir", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=cpu_env(OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and rows[-1]["kl"] > 0


# ---- 4. vLLM's sleep level -----------------------------------------------------------------------

class FakeLLM:
    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake", tuple(tags or ())))

    def collective_rpc(self, name, args):
        self.calls.append(("push", len(list(args[0]))))

    def reset_prefix_cache(self):
        pass


def fake_engine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    engine = object.__new__(vllm_engine.VLLMEngine)
    engine.llm, engine.cuda, engine.expected, engine.dtype = FakeLLM(), True, None, torch.float32
    engine.asleep, engine.level = False, 0
    return engine


def test_sleep_level_2_where_a_push_follows_1_where_none_does(monkeypatch):
    """The loop's update sleeps at level 2 (the weights dropped, not copied to host and back, then
    overwritten by the push); R²PO's head phase, which wakes with the same weights, at level 1; a
    wake after level 2 without a push is an error, not an engine sampling from freed memory."""
    assert vllm_engine.sleep_level(push_follows=True) == 2
    assert vllm_engine.sleep_level(push_follows=False) == 1
    engine = fake_engine(monkeypatch)
    engine.sleep(push_follows=True)
    engine.load_weights([("w", torch.zeros(2))])
    assert engine.llm.calls == [("sleep", 2), ("wake", ("weights",)), ("push", 1),
                                ("wake", ("kv_cache",))]
    engine.llm.calls.clear()
    engine.sleep()
    engine.wake_up()
    assert engine.llm.calls == [("sleep", 1), ("wake", ())]
    engine.sleep(push_follows=True)
    with pytest.raises(RuntimeError, match="level-2 sleep without a weight push"):
        engine.wake_up()


def test_asleep_bytes_is_what_sleep_left_of_the_free_memory(monkeypatch):
    """What vLLM keeps asleep, from the driver's free memory before the engine started and after
    it sleeps (4 GiB here), not total - free - memory_reserved(): torch still counts as reserved
    the 30 GiB of segments vLLM's allocator released, which would read 80 - 70 - 30 = -20 GiB."""
    free = {"now": 70 * GiB}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["now"], 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 30 * GiB)
    engine = fake_engine(monkeypatch)
    engine.free_at_start = vllm_engine.free_gpu_bytes()        # what __init__ takes on CUDA
    free["now"] = 40 * GiB                                      # vLLM awake, at its share
    engine.sleep(push_follows=True)
    free["now"] = 66 * GiB                                      # asleep: its pools released
    assert engine.asleep_bytes() == 4 * GiB


def test_vllm_is_sized_for_one_generate_call(monkeypatch):
    """max_num_seqs is the completions of one generate call on a rank (prompts x group size, or a
    method's budget), at most vLLM's own default of 1,024 (which costs ~2 GiB a rank in buffers
    sized for it): setup hands start_vllm the number and start_vllm hands it to vLLM."""
    assert vllm_engine.num_seqs(64 * 8) == 512 and vllm_engine.num_seqs(10_000) == 1024
    made = {}

    class Engine:
        def __init__(self, *a, **kw):
            made.update(kw)

        def load_weights(self, named):
            pass

    monkeypatch.setattr(vllm_engine, "_import_vllm", lambda: None)
    monkeypatch.setattr(vllm_engine, "VLLMEngine", Engine)
    model = torch.nn.Linear(1, 1)
    vllm_engine.start_vllm(model, None, "path", "cpu", sequences=32)
    assert made["max_num_seqs"] == 32
    vllm_engine.start_vllm(model, None, "path", "cpu")
    assert made["max_num_seqs"] is None                          # vLLM's default

    started = {}

    def start(model, tok, path, device, **kw):
        started.update(kw)
        return TorchEngine(model, tok)

    monkeypatch.setattr(vllm_engine, "installed_vllm", lambda: "0.32.0")
    monkeypatch.setattr(vllm_engine, "_vllm_module", lambda: (object(), None))
    monkeypatch.setattr(vllm_engine, "start_vllm", start)
    setup(flags.Args(engine="vllm", replay="none", eval_size=8, prompts_per_step=8, group_size=4))
    assert started["sequences"] == 8 * 4


def test_the_loop_sleeps_for_a_push_and_r2pos_head_phase_does_not():
    import inspect

    import train
    from methods import r2po
    assert "run.engine.sleep(push_follows=True)" in inspect.getsource(train.train_step)
    assert "run.engine.sleep(push_follows=False)" in inspect.getsource(r2po.Phases.head_phase)


# ---- 5. vLLM's share and the micro-batch budget from the GPU's memory ----------------------------

def plan(args, model, world: int = 1, frozen_bytes: int = 2):
    prompts = [SimpleNamespace(ids=list(range(150)))]
    return memory.plan_memory(memory_asked(args), model, prompts, world=world,
                              device="cuda:0", value_bytes=2, frozen_bytes=frozen_bytes)


def test_engine_share_auto_fits_beside_the_trainer_and_a_bad_share_is_refused(monkeypatch):
    """A 7B under FSDP2 on 8 ranks of 80 GB GPUs: the trainer keeps 12 bytes a parameter / 8
    (~10.6 GiB) plus the runtime between updates, so auto gives vLLM the rest of 90%: 0.76, ~46
    GiB of KV cache beside its 14 GiB of weights (the old 0.3 left ~4 GB); 0.95 cannot fit beside
    it (one error naming the flag and the most it may be);
    on one GPU the trainer alone holds 85 GiB: no share fits. A share below the engine's bf16
    weights is refused too."""
    fake_gpu(monkeypatch, 80)
    args = flags.Args(engine="vllm", max_new_tokens=512)
    assert 0.75 < plan(args, qwen_7b(), world=8).engine_share < 0.77
    small = shaped(QWEN_7B, [100_000_000])                        # a small model: at most 0.85
    assert plan(args, small, world=8).engine_share == memory.VLLM_SHARE_MAX
    with pytest.raises(ValueError, match=r"--gpu-memory-utilization 0.95: .* at most 0\.76"):
        plan(dataclasses.replace(args, gpu_memory_utilization=0.95), qwen_7b(), world=8)
    with pytest.raises(ValueError, match="--gpu-memory-utilization"):
        plan(args, qwen_7b(), world=1)
    with pytest.raises(ValueError, match="no room for a KV cache"):
        plan(dataclasses.replace(args, gpu_memory_utilization=0.15), qwen_7b(), world=8)
    assert plan(dataclasses.replace(args, gpu_memory_utilization=0.5), qwen_7b(),
                world=8).engine_share == 0.5
    cpu = memory.plan_memory(memory_asked(args), qwen_7b(), [], world=1, device="cpu",
                             value_bytes=4, frozen_bytes=4)
    assert cpu == (memory.AUTO_ACTIVATIONS, 0.3, 0)                 # the CPU: as it was


def test_the_micro_batch_budget_is_what_the_gpu_leaves(monkeypatch):
    """On an 80 GB GPU, a 7B on 8 ranks with vLLM: the budget is 90% of the GPU less the trainer's
    resident state (training 14.2 GiB, bf16 weights 14.2, the runtime) and vLLM asleep (4 GiB),
    over 1.75: about 22 GiB, 3,500 tokens a micro-batch (an eighth of the GPU gave ~1,500: the
    logits' 2^28 cap, lifted to 2^30 on CUDA); a bigger GPU, a bigger budget; the run's estimate
    then fits 90% of the GPU."""
    fake_gpu(monkeypatch, 80)
    args = flags.Args(engine="vllm", max_new_tokens=512)
    asked, model = memory_asked(args), qwen_7b()
    p = plan(args, model, world=8)
    resident = memory.update_memory(asked, model, 150, 8, engine_copy=False, bytes_per_value=2,
                                    budget=0, frozen_bytes=2)
    assert p.engine_asleep == int(0.05 * 80 * GiB)
    assert p.budget == int((0.9 * 80 * GiB - resident.beside_micro_batch - p.engine_asleep)
                           / 1.75)
    tokens = memory.sizes(asked, model, 8, 2, p.budget, memory.AUTO_LOGITS_CUDA).micro_batch_tokens
    assert 3_000 < tokens and memory.AUTO_LOGITS // QWEN_7B.vocab_size < 1_800
    resolved = memory_asked(dataclasses.replace(args, micro_batch_tokens=tokens))
    need = memory.update_memory(resolved, model, 150, 8, engine_copy=False, bytes_per_value=2,
                                frozen_bytes=2, engine_asleep=p.engine_asleep)
    assert need.total <= 0.9 * 80 * GiB
    fake_gpu(monkeypatch, 141)
    assert plan(args, model, world=8).budget > p.budget


def test_the_share_and_the_budget_leave_what_other_processes_hold(monkeypatch):
    """vLLM refuses to start when less than its share is free: a GPU where another process holds
    25 of 80 GiB (a test's engine at share 0.3, never closed, when train.py starts) gets an auto
    share that fits what is free beside the trainer (it was 0.85, 68 GiB, and vLLM refused to
    start), and a given share that does not is refused naming the others' GiB; memory this
    process's own allocator holds is the trainer's, not another's. The micro-batch's budget
    leaves the others' memory too."""
    args = flags.Args(engine="vllm", max_new_tokens=512)
    small = shaped(QWEN_7B, [100_000_000])
    fake_gpu(monkeypatch, 80)
    alone = plan(args, small, world=8)
    assert alone.engine_share == memory.VLLM_SHARE_MAX
    fake_gpu(monkeypatch, 80, free_gib=55)
    shared = plan(args, small, world=8)
    trainer = memory.update_memory(memory_asked(args), small, 150, 8, engine_copy=False,
                                   bytes_per_value=2, budget=0, frozen_bytes=2).between_updates
    assert shared.engine_share == pytest.approx(0.9 - (trainer + 25 * GiB) / (80 * GiB))
    assert shared.engine_share * 80 * GiB < 55 * GiB - trainer         # vLLM's start check passes
    assert shared.budget == pytest.approx(alone.budget - 25 * GiB / 1.75, abs=1)
    with pytest.raises(ValueError, match=r"0\.85: .* 25\.0 GiB other processes hold .* at most"):
        plan(dataclasses.replace(args, gpu_memory_utilization=0.85), small, world=8)
    fake_gpu(monkeypatch, 80, free_gib=55, reserved_gib=25)             # this process's own
    assert plan(args, small, world=8) == alone
    assert memory.engine_share(0, total=100, trainer=10, engine_weights=1, others=30) == \
        pytest.approx(0.5)
    # a trainer past 90% of the GPU leaves auto no share: said so, not a negative share
    with pytest.raises(ValueError, match=r"trainer keeps .* no share is left for vLLM"):
        memory.engine_share(0, total=100, trainer=95, engine_weights=1)


# ---- 6. every term of the memory estimate --------------------------------------------------------

def terms(**kw) -> memory.Memory:
    args = flags.Args(max_new_tokens=64, **kw.pop("flags", {}))
    return memory.update_memory(memory_asked(args), shaped(QWEN_7B, [1000, 3000]), 44,
                                **kw)


def test_memory_term_training_is_16_bytes_a_parameter_sharded():
    assert terms().training == 16 * 4000 and terms(world=4).training == 4 * 4000


def test_memory_term_cast_is_2_bytes_a_parameter_under_bf16_only():
    """autocast's bf16 copies of the weights, kept from the forward to the backward."""
    assert terms(bytes_per_value=2).cast == 2 * 4000 and terms().cast == 0


def test_memory_term_cast_under_fsdp2_is_the_root_and_two_layers():
    """Under FSDP2 (world > 1) a rank holds bf16 weights only where they are gathered: the root (the
    embedding, an untied head), kept from the forward to the backward, and two decoder layers (the
    one computing, the one prefetched), not the whole model's 2 n. A made-up model: vocabulary 100,
    width 10, 4 layers of 500 parameters."""
    config = SimpleNamespace(vocab_size=100, hidden_size=10, num_hidden_layers=4,
                             intermediate_size=30, tie_word_embeddings=False)
    n = 2 * 100 * 10 + 4 * 500
    assert memory.bf16_weights(config, n, world=1) == 2 * n
    assert memory.bf16_weights(config, n, world=2) == 2 * (2_000 + 2 * 500)
    tied = SimpleNamespace(**{**vars(config), "tie_word_embeddings": True})
    assert memory.bf16_weights(tied, n - 1_000, world=8) == 2 * (1_000 + 2 * 500)
    asked = memory_asked(flags.Args(max_new_tokens=64))
    model = shaped(config, [1_000, 1_000] + [500] * 4)
    fsdp = memory.update_memory(asked, model, 44, 4, bytes_per_value=2)
    assert fsdp.cast == 2 * (2_000 + 2 * 500)
    assert memory.update_memory(asked, model, 44, 1, bytes_per_value=2).cast == 2 * n
    # a 7B on 8 ranks: 2.9 GiB of bf16 weights a rank, not 14.2
    assert 2.8 < memory.bf16_weights(QWEN_7B, 7_615_002_944, world=8) / GiB < 3.0


def test_the_activation_term_follows_the_mlp_width():
    """A layer keeps 25 d values of a token at SmolLM2's MLP width (ff = 8/3 d, where it was
    measured) and 4 more for each unit of ff beyond: a made-up width-30 model at ff 80 (8/3 d),
    120 (4 d) and 160 (16/3 d, Qwen's ratio), and one without intermediate_size (SmolLM2's)."""
    def config(ff):
        return SimpleNamespace(vocab_size=7, hidden_size=30, num_hidden_layers=2,
                               intermediate_size=ff)
    assert memory.layer_values(config(80)) == 25 * 30
    assert memory.layer_values(config(120)) == 25 * 30 + 4 * 40
    assert memory.layer_values(config(160)) == 25 * 30 + 4 * 80
    assert memory.layer_values(config(None)) == 25 * 30
    assert memory.activation_bytes(config(160), 2) == 2 * 2 * (25 * 30 + 4 * 80)
    assert memory.token_bytes(config(160), 2) == 2 * 2 * (25 * 30 + 4 * 80) + 12 * 7
    # Qwen2.5-7B: 1.42x what SmolLM2's 25 d a layer gave
    assert 1.4 < memory.layer_values(QWEN_7B) / (25 * QWEN_7B.hidden_size) < 1.45


def test_memory_term_optimizer_is_adamws_temporaries_at_its_step():
    """foreach AdamW (CUDA) holds sqrt(v) for every parameter of the shard at once; the CPU's loop
    two of the largest parameter's."""
    assert terms(foreach=True).optimizer == 4 * 4000
    assert terms(foreach=True, world=2).optimizer == 2 * 4000
    assert terms(foreach=False).optimizer == 8 * 3000


def test_memory_term_copies_engine_whole_frozen_in_its_dtype_and_sharded():
    assert terms().copies == 4 * 4000                                 # TorchEngine's fp32 copy
    assert terms(engine_copy=False).copies == 0
    kl = {"kl_coef": 0.1}
    assert terms(flags=kl, engine_copy=False).copies == 4 * 4000     # fp32 reference (the CPU)
    assert terms(flags=kl, engine_copy=False, frozen_bytes=2, world=4).copies == 2 * 4000 // 4


def test_memory_term_engine_asleep_and_the_runtime():
    assert terms(engine_asleep=5 * GiB).engine == 5 * GiB and terms().engine == 0
    assert terms().runtime == memory.RUNTIME_BYTES


def test_memory_total_holds_the_backward_or_the_optimizer_step_not_both():
    """The bf16 cast, the micro-batch and its backward are gone by opt.step, where AdamW's
    temporaries appear: the peak is the persistent part plus the larger of the two."""
    m = memory.Memory(training=10, copies=1, micro_batch=5, runtime=2, slack=3, cast=4,
                      optimizer=9, engine=6)
    assert m.total == 10 + 1 + 2 + 6 + max(4 + 5 + 3, 9)
    assert m._replace(optimizer=20).total == 10 + 1 + 2 + 6 + 20
    assert m.beside_micro_batch == 10 + 1 + 2 + 6 + 4
    assert m.between_updates == 10 * 3 // 4 + 1 + 2


def test_a_7b_on_one_h200_is_refused_at_start_not_at_its_first_optimizer_step():
    """A 7B trained in one process on a 141 GB H200 with vLLM: weights, gradients and AdamW 113
    GiB, plus AdamW's foreach temporaries at the step (28 GiB): more than the GPU, said at start
    (it was admitted at 125 GiB, then ran out of memory at the first opt.step)."""
    asked = memory_asked(flags.Args(engine="vllm", max_new_tokens=512,
                                              micro_batch_tokens=1024))
    need = memory.update_memory(asked, qwen_7b(), 150, engine_copy=False, bytes_per_value=2,
                                frozen_bytes=2)
    assert need.optimizer == 4 * 7_615_002_944
    with pytest.raises(ValueError, match="alone do not fit"):
        memory.check_memory(need, memory.peak_token_bytes(QWEN_7B, 2), checkpointing=False,
                            total=141 * GiB, available=141 * GiB, what="GPU memory")


# ---- 9. and 10. the update reads no number before its optimizer step -----------------------------

# every way a tensor's value reaches Python: on CUDA each one waits for the device
READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__")


@pytest.mark.parametrize("kw", [{}, {"kl_coef": 0.05, "tis_cap": 2.0, "dual_clip": 3.0},
                                {"ratio": "gspo", "agg": "seq-mean-token-mean"}])
def test_a_micro_batch_reads_no_number_between_its_forward_and_its_backward(monkeypatch, kw):
    """train.micro_batch_loss (the loss, its metrics, the KL and TIS terms) turns no tensor into a
    Python number: its metrics stay tensors until the optimizer step (metrics.Metrics.settle), so
    the backward is queued right behind the forward. The model's own forward is not ours and is
    not watched. Then the step's numbers read as float() would have read them."""
    import parallel
    import rollout
    import train
    from make_tiny_model import make_model, make_tokenizer
    from rollout import Rollout
    from tiny import run_of
    tok = make_tokenizer()
    model = make_model(len(tok), seed=0)
    run = run_of(flags.Args(**kw), model)
    rollouts = [Rollout(prompt_id=i // 2, prompt_ids=tok.encode(f"{i}+1="),
                        completion_ids=tok.encode(str(i + 1)), logprobs=[-1.5] * len(str(i + 1)),
                        advantage=(-1.0) ** i) for i in range(6)]
    ref = [[-1.6] * len(r.completion_ids) for r in rollouts] if kw.get("kl_coef") else None
    mbs = rollout.micro_batches(rollouts, 2, tok.pad_token_id, "cpu",
                                old_logprobs=[[-1.4] * len(r.completion_ids) for r in rollouts],
                                ref_logprobs=ref)       # the KL reference's: once a step (update)
    watching, reads = [False], []

    def watch(name):
        real = getattr(torch.Tensor, name)

        def read(self, *a, **k):
            if watching[0]:
                reads.append(name)
            return real(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, read)
    for name in READS:
        watch(name)

    def unwatched(real):
        def call(*a, **k):
            before, watching[0] = watching[0], False
            try:
                return real(*a, **k)
            finally:
                watching[0] = before
        return call
    monkeypatch.setattr(rollout, "forward_logprobs", unwatched(rollout.forward_logprobs))
    real_loss = train.micro_batch_loss

    def watched(*a, **k):
        watching[0] = True
        try:
            return real_loss(*a, **k)
        finally:
            watching[0] = False
    monkeypatch.setattr(train, "micro_batch_loss", watched)
    watching[0] = True                       # the watch itself sees a read
    float(torch.ones(()))
    watching[0] = False
    assert reads == ["__float__"]
    reads.clear()
    m = train.optimizer_step(run, mbs, 10.0, guard=parallel.StepGuard(3), step=0)
    assert reads == []
    row = m.reduce(1)
    assert row["loss/tokens"] == sum(float(mb["completion_mask"].sum()) for mb in mbs)
    assert all(isinstance(v, (int, float)) for v in row.values())


def test_metrics_read_tensors_as_float_would_and_keep_extremes_where_their_count_is_not_0():
    """Means, totals and extremes given as 0-dim tensors (float32, bf16, int64 counts) reduce to
    exactly what the same values given as floats reduce to; an extreme over 0 tokens is dropped,
    and a key whose every extreme was over 0 tokens is absent, as with float counts."""
    from metrics import Metrics
    parts = [({"x": 0.1, "lo": 0.7, "hi": 1.3, "frac": 0.25, "count": 4}, 9),
             ({"x": 0.3, "lo": float("nan"), "hi": float("nan"), "frac": 0.0, "count": 0}, 0),
             ({"x": 1 / 3, "lo": 0.6, "hi": 1.2, "frac": 0.5, "count": 2}, 5)]
    rules = {"x": "mean tokens", "lo": "min tokens", "hi": "max tokens", "frac": "mean count",
             "count": "weight", "n": "sum"}
    as_tensors, as_floats = Metrics(), Metrics()
    for means, n in parts:
        held = {k: torch.tensor(v, dtype=torch.int64 if k == "count" else torch.float32)
                for k, v in means.items()}
        held["x"] = held["x"].to(torch.bfloat16)
        as_tensors.add(rules, held, tokens=torch.tensor(n))
        as_tensors.add(rules, {"n": torch.tensor(n)})
        as_floats.add(rules, {k: float(v) for k, v in held.items()}, tokens=float(n))
        as_floats.add(rules, {"n": float(n)})
    assert as_tensors.reduce(1) == as_floats.reduce(1)
    assert set(as_floats.reduce(1)) == {"x", "lo", "hi", "frac", "n"}      # count: a weight alone
    nothing, none_f = Metrics(), Metrics()
    nothing.add(rules, {"lo": torch.tensor(float("nan"))}, tokens=torch.tensor(0))
    none_f.add(rules, {"lo": float("nan")}, tokens=0.0)
    assert nothing.reduce(1) == none_f.reduce(1) == {}


def test_a_steps_loss_is_the_host_sum_of_its_micro_batch_losses():
    """metrics.host_sum (the trainer's and R2PO's head step's loss, read after the last backward)
    gives what adding each loss read as a float gives, bf16 included, and 0.0 for no micro-batch."""
    from metrics import host_sum
    losses = [torch.tensor(0.1), torch.tensor(-2.5e-3), torch.tensor(1 / 3)]
    assert host_sum(losses) == sum(float(t) for t in losses)
    halves = [t.to(torch.bfloat16) for t in losses]
    assert host_sum(halves) == sum(float(t) for t in halves)
    assert host_sum([]) == 0.0 and isinstance(host_sum(losses), float)


def test_the_surrogates_ratio_metrics_without_a_boolean_index():
    """ratio/min and ratio/max over the valid tokens exactly as the compacted ratio[valid] gives
    them, ratio/mean and loss/ppo_kl to float rounding (another summation order), NaN over 0
    tokens."""
    import grpo
    g = torch.Generator().manual_seed(0)
    log_ratio = torch.randn(5, 7, generator=g) * 0.3
    mask = torch.rand(5, 7, generator=g) < 0.6
    _, m = grpo.policy_loss(log_ratio, torch.randn(5, generator=g), mask, eps_low=0.2,
                            eps_high=0.28, normaliser=10.0)
    w = log_ratio.exp()[mask]
    assert float(m["ratio/min"]) == float(w.min()) and float(m["ratio/max"]) == float(w.max())
    assert float(m["ratio/mean"]) == pytest.approx(float(w.mean()), rel=1e-6)
    assert float(m["loss/ppo_kl"]) == pytest.approx(float(-log_ratio[mask].mean()), rel=1e-5)
    _, empty = grpo.policy_loss(log_ratio, torch.ones(5), torch.zeros(5, 7), eps_low=0.2,
                                eps_high=0.28, normaliser=1.0)
    assert all(torch.isnan(empty[k]) for k in ("ratio/min", "ratio/mean", "ratio/max"))


# ---- 7. a sequence ratio on a bf16 engine: pi_old is the trainer's own forward -------------------

@pytest.mark.parametrize("engine,on,precision,ratio,tis,recomputes", [
    ("vllm", "cuda", "fsdp-bf16", True, 0.0, True),      # GSPO or PNPO sampled by vLLM on a GPU
    ("vllm", "cuda", "fsdp-bf16", False, 0.0, False),    # the token ratio: its 0.2 clip is far
    ("torch", "cuda", "autocast-bf16", True, 0.0, True),   # fp32 engine, bf16 trainer
    ("torch", "cpu", "autocast-bf16", True, 0.0, True),    # both bf16, rounded by other paths
    ("torch", "cpu", "fp32", True, 0.0, False),          # both fp32: about 1e-6 apart
    ("vllm", "cpu", "fp32", True, 0.0, False),           # vLLM's CPU build: fp32 on both sides
    ("torch", "cpu", "fp32", False, 2.0, True),          # --tis-cap recomputes wherever it runs
])
def test_pi_old_is_the_trainers_forward_unless_the_engine_computes_as_the_trainer(
        engine, on, precision, ratio, tis, recomputes):
    """The pi_old rule follows the precision, not the engine's name (engine.serves_as_old)."""
    import engine as engine_lib
    import train
    import vllm_engine
    if engine == "torch":       # TorchEngine's copy autocasts where the trainer does on a CPU
        cls = engine_lib.TorchEngine
        state = SimpleNamespace(autocast=on == "cpu" and precision == "autocast-bf16")
    else:
        cls, state = vllm_engine.VLLMEngine, SimpleNamespace(cuda=on == "cuda")
    the_engine = SimpleNamespace(serves_as_old=lambda p: cls.serves_as_old(state, p))
    run = SimpleNamespace(settings=SimpleNamespace(loss=SimpleNamespace(tis_cap=tis)),
                          engine=the_engine, precision=precision,
                          hooks=SimpleNamespace(ratio=object() if ratio else None))
    assert train.recomputes_old(run) is recomputes


def test_gspos_and_pnpos_ratio_is_a_loss_hook_so_the_rule_sees_it():
    """The rule reads run.hooks.ratio: GSPO's and PNPO's presets fill it, GRPO's leaves it empty."""
    for preset, has_ratio in (("gspo", True), ("pnpo", True), ("grpo", False)):
        run = setup(flags.parse(["--preset", preset, "--steps", "1"]))
        assert (run.hooks.ratio is not None) is has_ratio


GSPO_BF16 = ["--preset", "gspo", "--precision", "bf16", "--allow-slow-bf16", "--steps", "1",
             "--prompts-per-step", "8", "--group-size", "4", "--eval-size", "8", "--threads", "1"]


def test_gspo_under_bf16_clips_nothing_at_its_first_update(tmp_path):
    """`--preset gspo --precision bf16` on the CPU (the trainer and TorchEngine's copy both under
    bf16 autocast, which round a KV-cache decode and a full forward differently): pi_old is the
    trainer's own forward in the update's micro-batches, so the first update's ratio is exactly 1
    and GSPO's 3e-4 clip fires on no token (19% before the rule followed the precision)."""
    from tiny import run_main
    rc, _, updates = run_main(GSPO_BF16, tmp_path / "run")
    first = updates[0]
    assert rc == 0 and first["loss/clip_frac"] <= 0.02
    assert first["ratio/min"] == first["ratio/max"] == 1.0


def test_a_methods_ratio_with_replay_under_bf16_is_refused_or_runs_decoupled(tmp_path, capsys):
    """GSPO's ratio with replay where pi_old is recomputed would hide the replayed rollouts' age
    from the ratio: refused in one line, or with --tis-cap the decoupled form runs, its weight
    logged (loss/tis_weight)."""
    import train
    rc = train.main([*GSPO_BF16, "--replay", "prioritized", "--out-dir", str(tmp_path / "a")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["error: a method's ratio with replay at autocast-bf16 needs "
                               "--tis-cap C (or --replay none, or fp32)"]
    from tiny import run_main
    rc, rows, _ = run_main([*GSPO_BF16, "--replay", "prioritized", "--tis-cap", "2",
                            "--steps", "2"], tmp_path / "b")
    assert rc == 0 and all(0 < r["loss/tis_weight"] <= 2 for r in rows)
