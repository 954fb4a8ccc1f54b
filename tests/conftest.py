"""What every test module shares: the import paths (the repository's flat modules, assets/ for
make_tiny_model, bench/ for the benchmark scripts, tests/ for tiny.py) and the built-in tiny model.

    def test_something(tiny_model):
        model, tok = tiny_model          # a fresh copy of assets/tiny-arith, fp32, on the CPU

Also what lets the suite run on any machine (a copy of the repository alone, a GPU image):
  * ../shared (golden values, benchmark files, verifier tables) is optional: `require_shared(...)`
    and the `shared_data` fixture skip, with the missing path in the reason, where it is absent.
  * `cpu_env()` is the environment of every subprocess that runs train.py or torchrun: CUDA
    hidden, so 2 ranks are gloo on the CPU even on a one-GPU machine (not rank 1 on cuda:1).
  * the `cpu_only` fixture does the same in process for train.main / run_setup.setup.

And what keeps the suite short on 2 cores: its slowest subprocess work (a module's `BESIDE`
jobs) runs beside the other tests (`Beside`), and the tests that read it run last:

    BESIDE = {"quick_runs": every_quick_protocol}     # job(folder) -> value, run via Beside.run
    @pytest.fixture(scope="module")
    def quick_runs(request, tmp_path_factory):
        return beside(request, "quick_runs", tmp_path_factory)
"""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_MODEL = os.path.join(ROOT, "assets", "tiny-arith")

for path in (os.path.join(ROOT, "tests"), os.path.join(ROOT, "bench"), os.path.join(ROOT, "assets"),
             ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "paths: compares two computation paths (batchings, ranks, engines, resume, "
        "threads): bitwise where the inputs are equal, else with a margin whose reason is written "
        "beside it; `pytest -m paths` runs the group")


@pytest.fixture
def tiny_model():
    """(model, tokenizer) of the shipped tiny model, loaded anew for each test (0.8M parameters:
    a test may train it)."""
    from checkpoint import load_model
    return load_model(TINY_MODEL)


# ---- ../shared: next to the repository, not in it ----------------------------------------------

# SHARED_DIR (a path) stands in for it: SHARED_DIR=/nonexistent runs the suite as a fresh clone
# without ../shared does
SHARED = Path(os.environ.get("SHARED_DIR") or Path(ROOT).parent / "shared")


def require_shared(*parts: str) -> Path:
    """../shared/<parts> (golden/, data/, data/math500.jsonl, ...); where it does not exist, skip
    the calling test, or the whole module when called at import, with the missing path in the
    reason."""
    __tracebackhide__ = True               # pytest reports the skip at the caller's line, not here
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"needs {path}, which does not exist: the shared data (../shared) is not next "
                    f"to this copy of the repository", allow_module_level=True)
    return path


@pytest.fixture
def shared_data() -> Path:
    """../shared/data (the benchmark files, verifier_cases.jsonl); the test skips where it is
    missing."""
    return require_shared("data")


# ---- the CPU, whatever devices the machine has ---------------------------------------------------

def cpu_env(**extra: str) -> dict:
    """os.environ with CUDA hidden (CUDA_VISIBLE_DEVICES=""), plus `extra`: for every subprocess
    that runs train.py or torchrun. Under torchrun train.py puts rank r on cuda:r when CUDA is
    there, so a 2-rank test on a one-GPU machine would fail; hidden, the ranks use gloo on the CPU,
    as in CI (and plain `python train.py` runs on the CPU too, engine TorchEngine)."""
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", **extra}


@pytest.fixture
def cpu_only(monkeypatch):
    """In process, CUDA looks absent for the test (torch.cuda.is_available() is False), so
    train.main and run_setup.setup pick the CPU and --engine auto picks TorchEngine, as in CI. Tests
    that compare such a run with CPU computations bit for bit (a checkpoint loaded by transformers
    on the CPU, straight vs resumed runs) hold on the CPU only: CUDA kernels round differently, and
    some (embedding backward's atomics) are not even deterministic run to run."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


# ---- slow work beside the suite ------------------------------------------------------------------

class Beside:
    """The suite's slowest work, subprocesses whose results tests read (a test module's `BESIDE`:
    {fixture name: job(folder) -> value}, e.g. every experiment's quick protocol), started as soon
    as the tests are collected and run one job after another on a thread beside the rest of the
    suite, while the tests that read them run last: the two cores work together instead of one
    after the other. A job runs its commands with `Beside.run` (subprocess.run's arguments), so
    that a suite stopped early stops them too."""

    running: dict = {}                      # {thread id: the Popens it runs now}

    def __init__(self, jobs: dict, base: Path):
        self.futures = {name: Future() for name in jobs}
        self.stopped = False
        self.thread = threading.Thread(target=self._every, args=(jobs, base), daemon=True)
        self.thread.start()

    def _every(self, jobs: dict, base: Path) -> None:
        for name, job in jobs.items():
            try:
                if self.stopped:
                    raise RuntimeError("the suite stopped before this job ran")
                folder = base / name
                folder.mkdir()
                self.futures[name].set_result(job(folder))
            except BaseException as e:               # the tests that read it fail with it
                self.futures[name].set_exception(e)

    @staticmethod
    def run(cmd: list, timeout: float = 900, **kw) -> subprocess.CompletedProcess:
        """subprocess.run(cmd, capture_output=True, text=True, ...), stopped with its jobs."""
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                **kw)
        mine = Beside.running.setdefault(threading.get_ident(), [])
        mine.append(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        finally:
            mine.remove(proc)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def running_now(self) -> list:
        """The Popens this one's jobs run now."""
        return list(Beside.running.get(self.thread.ident, []))

    def stop(self) -> None:
        self.stopped = True
        for proc in self.running_now():
            if proc.poll() is None:
                proc.kill()


BESIDE = pytest.StashKey()


@pytest.hookimpl(trylast=True)      # after -m and -k have deselected: the tests that will run
def pytest_collection_modifyitems(session, config, items):
    """Start the collected tests' `BESIDE` jobs (Beside) and run the tests that read them last.
    This process then computes on one thread, as every subprocess of the suite does, so that the
    two never contend for one core."""
    jobs, late = {}, []
    for item in items:
        used = set(getattr(item.module, "BESIDE", {})) & set(getattr(item, "fixturenames", ()))
        for name in sorted(used):
            jobs.setdefault(name, item.module.BESIDE[name])
        if used:
            late.append(item)
    if not jobs or config.option.collectonly:
        return
    items[:] = [item for item in items if item not in late] + late
    import torch
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    base = Path(tempfile.mkdtemp(prefix="pytest-beside-"))
    beside = config.stash[BESIDE] = Beside(jobs, base)
    config.add_cleanup(lambda: (beside.stop(), shutil.rmtree(base, ignore_errors=True)))


def beside(request, name: str, tmp_path_factory):
    """The value of the calling module's BESIDE job `name`: the one started at collection, else
    run now into a fresh folder (a test run without the collection hook's start)."""
    started = request.config.stash.get(BESIDE, None)
    if started is not None and name in started.futures:
        return started.futures[name].result()
    return request.module.BESIDE[name](tmp_path_factory.mktemp(name))
