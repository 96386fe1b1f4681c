"""``python -m layerlab.cut_lines SRC DST --count N [--skip K]``: lines K+1 .. K+N of the text
file SRC into DST.

The data cuts of the table scripts' small scales (the first lines of a corpus, a validation and a
test part of one file) as a command, so that a table's ``--dry-run`` script runs the same step as
the table itself. DST is written to ``DST.tmp`` and renamed, so an interrupted cut never looks
finished; SRC with fewer than K+N lines is an error (exit 2), not a short file.
"""
import argparse
import os
import sys


class CutError(Exception):
    pass


def cut_lines(src, dst, count, skip=0):
    """Write lines ``skip+1 .. skip+count`` of ``src`` to ``dst`` (atomically); return ``dst``."""
    if count < 1 or skip < 0:
        raise CutError(f"--count must be >= 1 and --skip >= 0 (got {count}, {skip})")
    lines = []
    with open(src, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= skip + count:
                break
            if i >= skip:
                lines.append(line)
    if len(lines) < count:
        raise CutError(f"{src}: {skip + len(lines)} lines, fewer than the {skip + count} needed "
                       f"(--skip {skip} --count {count})")
    if os.path.dirname(dst):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(lines)
    os.replace(dst + ".tmp", dst)
    return dst


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--count", type=int, required=True, help="lines to copy")
    p.add_argument("--skip", type=int, default=0, help="lines to skip first")
    args = p.parse_args(argv)
    try:
        cut_lines(args.src, args.dst, args.count, args.skip)
    except (CutError, OSError) as e:
        print(f"cut_lines: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
