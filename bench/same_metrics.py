"""Do two runs log the same numbers? Compares metrics.jsonl of run directories pairwise,
every key but time/*.

    python bench/same_metrics.py RUNS_A RUNS_B           # each holds run directories of the
                                                         # same names
    python bench/same_metrics.py runs/a runs/b --single  # two run directories
    python bench/same_metrics.py runs/a runs/b --dropped ratio/far_prefix_frac,loss/veto_frac
    python bench/same_metrics.py runs/a runs/b --added replay/sampled_nonzero
    python bench/same_metrics.py runs/a runs/b --resummed ratio/mean,loss/ppo_kl

A refactor that must not change what any run computes is checked this way (same flags, same
--threads, same machine; bench/same_runs.py makes the runs): it prints, per run, the lines
compared and the keys that differ, and exits 1 on any difference. `--dropped`: keys that B may
lack (a diagnostic the change stopped logging on purpose); each one B lacks is counted and
printed, never compared, and any other key is compared as always. `--resummed`: keys the change
sums in another order on purpose (a float32 mean over a padded matrix, not over its compacted
valid entries): equal within RESUMMED, and the largest gap is printed.
"""
import argparse
import json
import os
import sys


# a float32 sum of the same terms in another order: a few units of float32's 1.2e-7 on values of
# order 1 (ratio/mean) and less on smaller ones (loss/ppo_kl, ~1e-2): 1e-6 absolute, relative past 1
RESUMMED = 1e-6


def close(x, y) -> bool:
    return (isinstance(x, float) and isinstance(y, float)
            and abs(x - y) <= RESUMMED * max(1.0, abs(x), abs(y)))


def rows(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def differences(a: list[dict], b: list[dict], dropped: tuple = (),
                added: tuple = (), resummed: tuple = ()) -> list[str]:
    """'step S key: A != B' for each key (time/* aside) whose values differ, and for missing steps;
    a key of `dropped` that B lacks, or of `added` that A lacks, is not a difference, nor is a key
    of `resummed` whose values are `close`."""
    out = [] if len(a) == len(b) else [f"{len(a)} lines != {len(b)} lines"]
    for ra, rb in zip(a, b):
        for key in sorted(set(ra) | set(rb)):
            if (key.startswith("time/") or (key in dropped and key not in rb)
                    or (key in added and key not in ra)):
                continue
            if key in resummed and close(ra.get(key), rb.get(key)):
                continue
            if ra.get(key, "<absent>") != rb.get(key, "<absent>"):
                out.append(f"step {ra.get('step')} {key}: {ra.get(key, '<absent>')} != "
                           f"{rb.get(key, '<absent>')}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--single", action="store_true", help="a and b are run directories themselves")
    ap.add_argument("--dropped", default="",
                    help="comma-separated metrics keys B may lack (counted, not compared)")
    ap.add_argument("--added", default="",
                    help="comma-separated metrics keys B may add (counted, not compared)")
    ap.add_argument("--resummed", default="",
                    help="comma-separated metrics keys summed in another order (within RESUMMED)")
    args = ap.parse_args(argv)
    resummed = tuple(filter(None, args.resummed.split(",")))
    dropped = tuple(filter(None, args.dropped.split(",")))
    added = tuple(filter(None, args.added.split(",")))
    names = [""] if args.single else sorted(
        n for n in os.listdir(args.a) if os.path.isfile(os.path.join(args.a, n, "metrics.jsonl")))
    bad = 0
    for name in names:
        a, b = os.path.join(args.a, name), os.path.join(args.b, name)
        if not os.path.isfile(os.path.join(b, "metrics.jsonl")):
            print(f"{name}: missing in {args.b}")
            bad += 1
            continue
        diff = differences(rows(a), rows(b), dropped, added, resummed)
        gap = max((abs(ra[k] - rb[k]) for ra, rb in zip(rows(a), rows(b)) for k in resummed
                   if isinstance(ra.get(k), float) and isinstance(rb.get(k), float)), default=0.0)
        gone = sorted({k for ra, rb in zip(rows(a), rows(b)) for k in dropped
                       if k in ra and k not in rb})
        new = sorted({k for ra, rb in zip(rows(a), rows(b)) for k in added
                      if k in rb and k not in ra})
        print(f"{name or a}: {len(rows(a))} lines, {len(diff)} differences"
              + (f" (B no longer logs {', '.join(gone)})" if gone else "")
              + (f" (B also logs {', '.join(new)})" if new else "")
              + (f" (resummed: at most {gap:.1e} apart)" if resummed else ""))
        for line in diff[:10]:
            print("   ", line)
        bad += bool(diff)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
