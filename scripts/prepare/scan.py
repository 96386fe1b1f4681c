#!/usr/bin/env python3
"""SCAN (Lake & Baroni, 2018) for fairseq: generated from its grammar (default, offline) or read
from the original release (``--from DIR``), then binarised.

By default nothing is downloaded: the complete command set (20,910 command/action pairs) is
produced from the phrase-structure grammar and interpretation rules of the paper, then split as
the original release does:

  simple             seeded random 80/20                        16,728 / 4,182
  length             train: action length <= 22, test: >= 24    16,990 / 3,920
  addprim_jump       test: every command containing "jump" except "jump" itself;
                     train: the rest plus "jump" repeated n/9 times (10% of train)
                                                                14,670 / 7,706
  addprim_turn_left  the same for "turn left"                   21,890 / 1,208

The generated ``length`` and ``addprim_*`` splits follow deterministic rules and hold the same
pairs as the release; ``simple`` is a random split, so its generated version is *a* random
80/20 split, not the release's. To compare with published numbers, use the release's files:
``--from DIR`` reads them from a checkout of github.com/brendenlake/SCAN (its layout:
``simple_split/tasks_{train,test}_simple.txt``, ``length_split/tasks_{train,test}_length.txt``,
``add_prim_split/tasks_{train,test}_addprim_{jump,turn_left}.txt``), checked against the
published sizes; nothing else changes.

Outputs per split, under ``--out-dir`` (default ``data/scan``):
  <split>/tasks_train.txt, tasks_test.txt    SCAN's own ``IN: ... OUT: ...`` lines
  <split>/{train,valid,test}.{in,out}        fairseq raw text (one example per line)
and, unless ``--no-binarize``, ``fairseq-preprocess`` output in ``--dest-dir``
(default ``data-bin/scan-<split>``). SCAN has no validation set: ``valid`` is a seeded sample
of ``--valid-size`` training examples (they stay in train), for checkpoint selection only.

Every directory is written under a temporary name and renamed when complete, so an interrupted
run never leaves something that looks finished.
"""
import argparse
import itertools
import os
import random
import sys

from layerlab import prepare as common

SPLITS = ("simple", "length", "addprim_jump", "addprim_turn_left")

# Published sizes (train, test); checked after generation so a grammar slip cannot go unnoticed.
PUBLISHED_SIZES = {
    "simple": (16728, 4182),
    "length": (16990, 3920),
    "addprim_jump": (14670, 7706),
    "addprim_turn_left": (21890, 1208),
}

PRIMITIVES = {"walk": "I_WALK", "look": "I_LOOK", "run": "I_RUN", "jump": "I_JUMP"}
TURN = {"left": "I_TURN_LEFT", "right": "I_TURN_RIGHT"}


def _verb_phrases():
    """All V of the grammar with their meanings: V -> D opposite D | D around D | D | U."""
    phrases = []
    for u, act in PRIMITIVES.items():
        phrases.append((u, [act]))
    for direction, turn in TURN.items():
        phrases.append((f"turn {direction}", [turn]))
        phrases.append((f"turn opposite {direction}", [turn, turn]))
        phrases.append((f"turn around {direction}", [turn] * 4))
        for u, act in PRIMITIVES.items():
            phrases.append((f"{u} {direction}", [turn, act]))
            phrases.append((f"{u} opposite {direction}", [turn, turn, act]))
            phrases.append((f"{u} around {direction}", [turn, act] * 4))
    return phrases


def generate_commands():
    """The complete SCAN set as a list of (command, action list), in a fixed order."""
    simple = []
    for cmd, act in _verb_phrases():
        simple.append((cmd, act))
        simple.append((f"{cmd} twice", act * 2))
        simple.append((f"{cmd} thrice", act * 3))
    pairs = list(simple)
    for (c1, a1), (c2, a2) in itertools.product(simple, repeat=2):
        pairs.append((f"{c1} and {c2}", a1 + a2))
        pairs.append((f"{c1} after {c2}", a2 + a1))
    return pairs


def _addprim_split(pairs, primitive, rng):
    words = primitive.split()

    def contains(cmd):
        toks = cmd.split()
        return any(toks[i:i + len(words)] == words for i in range(len(toks)))

    prim = [p for p in pairs if p[0] == primitive]
    rest = [p for p in pairs if not contains(p[0])]
    test = [p for p in pairs if contains(p[0]) and p[0] != primitive]
    # The release repeats the bare primitive until it is 10% of the training set.
    train = rest + prim * (len(rest) // 9)
    rng.shuffle(train)
    rng.shuffle(test)
    return train, test


def make_split(name, seed=1):
    """Return (train, test) lists of (command, actions) for one SCAN split."""
    if name not in SPLITS:
        raise ValueError(f"unknown SCAN split {name!r}; choose from {', '.join(SPLITS)}")
    pairs = generate_commands()
    rng = random.Random(seed)
    if name == "simple":
        shuffled = list(pairs)
        rng.shuffle(shuffled)
        n_train = int(round(0.8 * len(shuffled)))
        return shuffled[:n_train], shuffled[n_train:]
    if name == "length":
        train = [p for p in pairs if len(p[1]) <= 22]
        test = [p for p in pairs if len(p[1]) >= 24]
        rng.shuffle(train)
        rng.shuffle(test)
        return train, test
    return _addprim_split(pairs, name[len("addprim_"):].replace("_", " "), rng)


def write_split_text(directory, train, test, valid_size, seed):
    """Write SCAN-format and fairseq raw-text files of one split into ``directory``."""
    common.write_lines(os.path.join(directory, "tasks_train.txt"),
                       [f"IN: {c} OUT: {' '.join(a)}" for c, a in train])
    common.write_lines(os.path.join(directory, "tasks_test.txt"),
                       [f"IN: {c} OUT: {' '.join(a)}" for c, a in test])
    valid = random.Random(seed + 1).sample(train, min(valid_size, len(train)))
    for subset, data in (("train", train), ("valid", valid), ("test", test)):
        common.write_lines(os.path.join(directory, f"{subset}.in"), [c for c, _ in data])
        common.write_lines(os.path.join(directory, f"{subset}.out"),
                           [" ".join(a) for _, a in data])


# where each split's files are in the release (the README links the length split under
# simple_split/, the repository keeps it in length_split/: both are looked for)
RELEASE_FOLDERS = {"simple": ("simple_split",), "length": ("length_split", "simple_split"),
                   "addprim_jump": ("add_prim_split",), "addprim_turn_left": ("add_prim_split",)}


def read_release(split, from_dir):
    """(train, test) lists of (command, actions) from the release's files of ``split``."""
    pairs = {}
    for subset in ("train", "test"):
        name = f"tasks_{subset}_{split}.txt"
        candidates = [os.path.join(from_dir, folder, name) for folder in RELEASE_FOLDERS[split]]
        path = next((c for c in candidates if os.path.isfile(c)), None)
        if path is None:
            raise common.PrepareError(f"{candidates[0]}: not found (--from {from_dir}: a checkout "
                                      "of the SCAN release)")
        expected = PUBLISHED_SIZES[split][subset == "test"]
        rows = []
        for i, line in enumerate(common.read_lines(path, expected=expected), 1):
            if not line.startswith("IN: ") or " OUT: " not in line:
                raise common.PrepareError(f"{path}:{i}: expected 'IN: <command> OUT: <actions>'")
            command, actions = line[len("IN: "):].split(" OUT: ", 1)
            rows.append((command.strip(), actions.split()))
        pairs[subset] = rows
    return pairs["train"], pairs["test"]


def binarize(text_dir, dest_dir, workers=1):
    """Run the real ``fairseq-preprocess`` on ``text_dir`` into ``dest_dir`` (atomically)."""
    common.binarize_translation(dest_dir, "in", "out", os.path.join(text_dir, "train"),
                                os.path.join(text_dir, "valid"), [os.path.join(text_dir, "test")],
                                workers=workers)


def prepare(split, out_dir, dest_dir=None, valid_size=1000, seed=1, binarize_data=True,
            force=False, from_dir=None):
    """One split: text into ``<out_dir>/<split>``, binaries into ``dest_dir`` (default
    ``data-bin/scan-<split>``), generated or read from the release in ``from_dir``; nothing to
    do when an earlier run with the same options is complete, an error when it had other
    options (unless ``force``)."""
    final = os.path.join(out_dir, split)
    dest = dest_dir or os.path.join("data-bin", f"scan-{split}")
    config = {"dataset": "scan", "split": split, "valid_size": valid_size, "seed": seed}
    if from_dir:  # (generated outputs keep the marker they had before --from existed)
        config["source"] = "release"
    if common.already_prepared(final, dest if binarize_data else final, config, force):
        return final
    if from_dir:
        train, test = read_release(split, from_dir)
    else:
        train, test = make_split(split, seed)
        expected = PUBLISHED_SIZES[split]
        if (len(train), len(test)) != expected:  # pragma: no cover - guards the grammar itself
            raise AssertionError(f"SCAN {split}: generated {len(train)}/{len(test)}, "
                                 f"published {expected}")
    with common.preparing(final, config) as (text, _):
        write_split_text(text, train, test, valid_size, seed)
    print(f"scan/{split}: train {len(train)}, valid {min(valid_size, len(train))}, "
          f"test {len(test)} -> {final}")
    if binarize_data:
        binarize(final, dest)
        print(f"scan/{split}: fairseq binaries -> {dest}")
    return final


def _check_writable(path):
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(os.path.abspath(probe))
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK):
        raise common.PrepareError(f"output directory {path!r} is not writable")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--split", default="simple",
                   help=f"one of {', '.join(SPLITS)}, comma-separated, or 'all' (default: simple)")
    p.add_argument("--out-dir", default=os.path.join("data", "scan"), help="raw text output root")
    p.add_argument("--dest-dir", default=None,
                   help="fairseq-preprocess output (one split only; default data-bin/scan-<split>)")
    p.add_argument("--valid-size", type=int, default=1000,
                   help="training examples sampled (with the seed) as the validation set")
    p.add_argument("--seed", type=int, default=1, help="seed for shuffling and the simple split")
    p.add_argument("--from", dest="from_dir", metavar="DIR",
                   help="read the splits from the original release (a checkout of "
                        "github.com/brendenlake/SCAN) instead of generating them")
    p.add_argument("--no-binarize", action="store_true", help="write text only")
    p.add_argument("--force", action="store_true", help="rebuild even if the output exists")
    args = p.parse_args(argv)

    splits = SPLITS if args.split == "all" else tuple(s.strip() for s in args.split.split(","))
    for s in splits:
        if s not in SPLITS:
            raise common.PrepareError(f"unknown SCAN split {s!r}; choose from "
                                      f"{', '.join(SPLITS)} or all")
    if args.dest_dir and len(splits) > 1:
        raise common.PrepareError("--dest-dir takes a single --split")
    if args.from_dir and not os.path.isdir(args.from_dir):
        raise common.PrepareError(f"--from {args.from_dir}: no such directory")
    _check_writable(args.out_dir)
    if not args.no_binarize:
        _check_writable(args.dest_dir or "data-bin")
    for s in splits:
        prepare(s, args.out_dir, args.dest_dir, args.valid_size, args.seed, not args.no_binarize,
                force=args.force, from_dir=args.from_dir)
    return 0


if __name__ == "__main__":
    sys.exit(common.run_main(main, "scan.py"))
