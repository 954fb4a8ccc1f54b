"""train.py's --tensorboard: the same numbers as metrics.jsonl, as TensorBoard scalars, and one
clear error line where the optional tensorboard package (requirements-bench.txt) is missing. The
scalar test skips without tensorboard, except under REQUIRE_BENCH=1 (.ci/run's stage with
requirements-bench.txt), where it fails."""
import io
import json
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

import train
from test_bench import needs

# train.main in process, on the CPU whatever the machine has (conftest's cpu_only): on CUDA it would
# run another precision and --engine auto would pick vLLM, not the runs these tests pin.
pytestmark = pytest.mark.usefixtures("cpu_only")

RUN = ["--tensorboard", "--steps", "2", "--eval-every", "1", "--eval-size", "50",
       "--prompts-per-step", "8", "--threads", "1"]


def main(argv) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        rc = train.main(argv)
    return rc, err.getvalue()


def test_tensorboard_missing_is_one_error_line(tmp_path, monkeypatch):
    """Without the package: exit status 2 at start-up, one `error:` line naming the flag and the
    fix, no traceback, nothing written."""
    # find_spec -> None, import -> ImportError
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    rc, err = main([*RUN, "--out-dir", str(tmp_path / "run")])
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "--tensorboard" in lines[0] and "requirements-bench.txt" in lines[0]
    assert not (tmp_path / "run").exists()


@needs("tensorboard")
def test_tensorboard_scalars_equal_metrics_jsonl(tmp_path):
    """A 2-step run of the built-in default: every number of each step's row of metrics.jsonl
    (step 0's eval too) is in the event file, key by key, at x = step (float32 values:
    TensorBoard's precision)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    rc, err = main([*RUN, "--out-dir", str(tmp_path / "run")])
    assert rc == 0, err
    rows = [json.loads(line)
            for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    logged = {}
    for key in acc.Tags()["scalars"]:
        for e in acc.Scalars(key):
            logged.setdefault(e.step, {})[key] = e.value
    assert [r["step"] for r in rows] == [0, 1, 2] and sorted(logged) == [0, 1, 2]
    for r in rows:
        expected = {k: v for k, v in r.items()          # every number (step 0's eval_on: words)
                    if k != "step" and isinstance(v, (int, float))}
        assert logged[r["step"]] == pytest.approx(expected, rel=1e-6, abs=1e-6), r["step"]
    assert "eval/accuracy" in logged[0] and "loss/policy" in logged[2]


def test_a_long_steps_status_shows_on_a_terminal_only():
    """metrics.status: on a terminal one line that the next overwrites ("\\r", cleared); nothing
    in a log file or a pipe, nothing on a rank other than 0."""
    import io

    import metrics

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    tty, pipe = Terminal(), io.StringIO()
    metrics.status("step 3: updating on 96 rollouts", 0, tty)
    metrics.status("step 3: updating on 96 rollouts", 0, pipe)
    metrics.status("step 3: generating", 1, tty)
    assert tty.getvalue() == "\r\x1b[Kstep 3: updating on 96 rollouts" and pipe.getvalue() == ""
    metrics.status("", 0, tty)
    assert tty.getvalue().endswith("\r\x1b[K")


def test_step_0_without_an_eval_prints_no_bare_step_line(tmp_path):
    """--eval-size 0: step 0 has nothing to show (no eval), so no line (metrics.jsonl keeps its
    row); the steps after it print theirs."""
    import metrics
    assert metrics.log_line({"step": 0}, ()) == ""
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        rc = train.main(["--steps", "1", "--eval-size", "0", "--prompts-per-step", "4",
                         "--group-size", "2", "--max-new-tokens", "4", "--threads", "1",
                         "--out-dir", str(tmp_path)])
    steps = [line for line in out.getvalue().splitlines() if line.startswith("step")]
    assert rc == 0 and len(steps) == 1 and steps[0].startswith("step    1 |"), steps
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [0, 1], rows
