"""What a reader opens to follow one loop step: the project functions one default step of
train.py calls, within --depth calls of train() as the loop is read (train_step's body inline: its
calls count as the loop's own), in first-call order, and how often that order switches files.

    python bench/trace_step.py               # the 2nd of 3 steps of the built-in default, depth 3
    python bench/trace_step.py --depth 4     # one call further: grpo.py's loss under
                                             # micro_batch_loss
    python bench/trace_step.py --depth 99    # every project function the step reaches

It traces a real run (sys.setprofile), so what it lists is what runs, not what a reading guesses.
The step is the second one (the first pays for a canary check every --check-every steps);
eval is off. train_step itself is not listed (read inline), every function it calls is one call
below the loop, as a function train() calls directly is. It also counts every call of a project
function in that step, at any depth, and the verifier's share of them (verify.py, mathparse.py,
mathcheck.py) and the full grader's (verify.grade and all it calls: extraction, normalisation,
the parser, the comparison), and prints the lines of the spine's four algorithm files
(tests/test_layout.py pins them under 1,900).
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPINE = ("train.py", "rollout.py", "grpo.py", "buffer.py")    # GRPO with rollout replay, whole
VERIFIER = ("verify.py", "mathparse.py", "mathcheck.py")      # the verifier and its insides
INLINE = "train_step"                                          # read as the loop's own body


def in_full_grader(frame) -> bool:
    """Whether verify.grade is `frame`'s function or one of its callers."""
    while frame is not None:
        if frame.f_code.co_name == "grade" and frame.f_code.co_filename.endswith("verify.py"):
            return True
        frame = frame.f_back
    return False


def trace(depth: int, out_dir: str) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """((file, function) of every project function called within `depth` calls of train() during
    the second loop step, train_step's body inline, in first-call order; {file: calls of its
    functions in that step, at any depth, and "verify.grade": the calls within the full
    grader})."""
    sys.path.insert(0, ROOT)
    import train
    state = {"train_depth": None, "stats_calls": 0, "recording": False}
    order: list[tuple[str, str]] = []
    calls: dict[str, int] = {}

    def stack_depth(frame) -> int:
        """The frames below `frame`, itself included, train_step's not counted (read inline)."""
        d = 0
        while frame is not None:
            code = frame.f_code
            if not (code.co_name == INLINE and code.co_filename.endswith("train.py")):
                d += 1
            frame = frame.f_back
        return d

    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(ROOT) or code.co_name.startswith("<"):
            return
        if os.sep + "tests" + os.sep in code.co_filename:
            return
        if state["train_depth"] is None:
            if code.co_name == "train" and code.co_filename.endswith("train.py"):
                state["train_depth"] = stack_depth(frame)
            return
        rel = stack_depth(frame) - state["train_depth"]
        if rel == 1 and code.co_name == "stats" and code.co_filename.endswith("verify.py"):
            state["stats_calls"] += 1            # once a step, at its start
            state["recording"] = state["stats_calls"] == 2
        if not state["recording"]:
            return
        name = os.path.relpath(code.co_filename, ROOT)
        calls[name] = calls.get(name, 0) + 1
        if in_full_grader(frame):
            calls["verify.grade"] = calls.get("verify.grade", 0) + 1
        key = (name, code.co_name)
        if 1 <= rel <= depth and code.co_name != INLINE and key not in order:
            order.append(key)

    sys.setprofile(profile)
    try:
        train.main(["--steps", "3", "--threads", "1", "--eval-every", "0", "--eval-size", "8",
                    "--save-every", "0", "--out-dir", out_dir, "--overwrite"])
    finally:
        sys.setprofile(None)
    return order, calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depth", type=int, default=3,
                    help="calls below train() to follow, train_step inline (default: 3)")
    ap.add_argument("--out-dir", default="runs/trace_step",
                    help="the traced run's output directory")
    args = ap.parse_args(argv)
    order, calls = trace(args.depth, args.out_dir)
    switches = sum(a[0] != b[0] for a, b in zip(order, order[1:]))
    files = len({f for f, _ in order})
    print(f"{len(order)} functions in {files} files, {switches} file switches (depth {args.depth},"
          f" train_step inline)")
    grader = calls.pop("verify.grade", 0)
    total, verifier = sum(calls.values()), sum(calls.get(f, 0) for f in VERIFIER)
    print(f"the step's project-function calls: {total}; in the verifier's files "
          f"({', '.join(VERIFIER)}) {verifier} ({100 * verifier / max(total, 1):.0f}%), "
          f"in the full grader (verify.grade and below) {grader} "
          f"({100 * grader / max(total, 1):.0f}%)")
    spine = {name: len(open(os.path.join(ROOT, name)).read().splitlines()) for name in SPINE}
    print(f"the spine's algorithm files: {sum(spine.values())} lines ("
          + ", ".join(f"{name} {n}" for name, n in spine.items()) + ")")
    for f, name in order:
        print(f"  {f}:{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
