"""The deeper depth of a longer comparison: the shallowest candidate depth whose baseline ends
below the shallow depth's baseline (test bits, the first seed), found from finished runs.

    python -m layerlab.depth_choice KEPT_RUNS --shallow 4 --candidates 8,12 [--row baseline]
        [--seed 1]

prints the depth (the deepest candidate when none beats the shallow baseline: the comparison
then says so); exits 2 with one line while a run it needs is unfinished or diverged.
"""
import argparse
import os
import sys

from .runs import read_json


def baseline_bits(kept, depth, row="baseline", seed=1):
    """The test bits of a finished, converged run in ``kept`` (``d<depth>/<row>/seed<seed>``),
    or None."""
    result = read_json(os.path.join(kept, f"d{depth}", row, f"seed{seed}", "result.json"))
    if result is None or result.get("diverged"):
        return None
    return result["test_bits"]


def deeper_depth(kept, shallow, candidates, row="baseline", seed=1):
    """(depth, {depth: test bits}, beats): the shallowest of ``candidates`` whose run ends below
    the ``shallow`` one (``beats`` True), else the deepest (``beats`` False). Raises ValueError
    naming the runs not finished."""
    bits = {d: baseline_bits(kept, d, row, seed) for d in [shallow, *candidates]}
    missing = [d for d, b in bits.items() if b is None]
    if missing:
        raise ValueError(f"{kept}: no finished {row} run at seed {seed} for "
                         f"{', '.join(map(str, missing))} blocks")
    for depth in sorted(candidates):
        if bits[depth] < bits[shallow]:
            return depth, bits, True
    return max(candidates), bits, False


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m layerlab.depth_choice",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("kept")
    p.add_argument("--shallow", type=int, required=True)
    p.add_argument("--candidates", required=True,
                   type=lambda t: [int(x) for x in t.split(",") if x])
    p.add_argument("--row", default="baseline")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    try:
        depth, bits, beats = deeper_depth(args.kept, args.shallow, args.candidates, args.row,
                                          args.seed)
    except ValueError as e:
        p.error(str(e))
    print(", ".join(f"{d} blocks {b:.4f}" for d, b in bits.items())
          + ("" if beats else f": no candidate beats {args.shallow} blocks"), file=sys.stderr)
    print(depth)
    return 0


if __name__ == "__main__":
    sys.exit(main())
