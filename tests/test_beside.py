"""conftest.Beside, the suite's slow work run beside its other tests: jobs run one after another
on their own thread, each test reads its job's value or its error, and a suite stopped early stops
the command running."""
import subprocess
import sys
import threading
import time

import pytest

from conftest import Beside


def test_jobs_run_in_order_and_give_their_value_or_their_error(tmp_path):
    order = []

    def first(folder):
        order.append(("first", folder.name))
        return Beside.run([sys.executable, "-c", "print(6 * 7)"]).stdout.strip()

    def second(folder):
        order.append(("second", folder.name))
        raise ValueError("a job's own error")

    jobs = Beside({"first": first, "second": second}, tmp_path)
    assert jobs.futures["first"].result(timeout=60) == "42"
    with pytest.raises(ValueError, match="a job's own error"):
        jobs.futures["second"].result(timeout=60)
    assert order == [("first", "first"), ("second", "second")]       # each in its own folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first", "second"]


def test_a_suite_stopped_early_stops_the_command_running(tmp_path):
    def slow(folder):
        return Beside.run([sys.executable, "-c", "import time; time.sleep(60)"])

    def after(folder):
        return "never"

    jobs = Beside({"slow": slow, "after": after}, tmp_path)
    for _ in range(200):                      # until the command is running
        if jobs.running_now():
            break
        time.sleep(0.05)
    t0 = time.perf_counter()
    jobs.stop()
    assert jobs.futures["slow"].result(timeout=30).returncode != 0      # killed
    assert time.perf_counter() - t0 < 30
    with pytest.raises(RuntimeError, match="stopped"):
        jobs.futures["after"].result(timeout=30)
    assert not jobs.running_now()


def test_a_command_past_its_timeout_is_killed():
    with pytest.raises(subprocess.TimeoutExpired):
        Beside.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
    assert not Beside.running.get(threading.get_ident())
