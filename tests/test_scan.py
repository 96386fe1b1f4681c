import os

import pytest

from conftest import run_script
from helpers import SCRIPTS, load_script

prepare_scan = load_script("prepare", "scan.py")


@pytest.fixture(scope="module")
def commands():
    return dict(prepare_scan.generate_commands())


def test_complete_command_set(commands):
    assert len(commands) == 20910
    assert len(prepare_scan.generate_commands()) == 20910  # no duplicate commands


@pytest.mark.parametrize("split", prepare_scan.SPLITS)
def test_published_split_sizes(split):
    train, test = prepare_scan.make_split(split)
    assert (len(train), len(test)) == {
        "simple": (16728, 4182),
        "length": (16990, 3920),
        "addprim_jump": (14670, 7706),
        "addprim_turn_left": (21890, 1208),
    }[split]


def test_interpretation_rules(commands):
    L, R = "I_TURN_LEFT", "I_TURN_RIGHT"
    assert commands["jump"] == ["I_JUMP"]
    assert commands["turn left"] == [L]
    assert commands["walk right"] == [R, "I_WALK"]
    assert commands["turn opposite right"] == [R, R]
    assert commands["look opposite left"] == [L, L, "I_LOOK"]
    assert commands["turn around right"] == [R] * 4
    assert commands["run around left"] == [L, "I_RUN"] * 4
    assert commands["look twice"] == ["I_LOOK"] * 2
    assert commands["walk left thrice"] == [L, "I_WALK"] * 3
    assert commands["jump and walk"] == ["I_JUMP", "I_WALK"]
    assert commands["jump after walk"] == ["I_WALK", "I_JUMP"]
    assert commands["jump around left twice after walk opposite right"] == (
        [R, R, "I_WALK"] + [L, "I_JUMP"] * 8)


def test_length_split_boundary():
    train, test = prepare_scan.make_split("length")
    assert max(len(a) for _, a in train) == 22
    assert min(len(a) for _, a in test) == 24


@pytest.mark.parametrize("split,primitive", [("addprim_jump", "jump"),
                                             ("addprim_turn_left", "turn left")])
def test_addprim_split_isolates_primitive(split, primitive):
    train, test = prepare_scan.make_split(split)
    train_cmds = [c for c, _ in train]
    assert all(primitive in c and c != primitive for c, _ in test)
    others = [c for c in train_cmds if c != primitive]
    assert not any(primitive in c for c in others)
    # the bare primitive makes up 10% of the training set, as in the release
    assert train_cmds.count(primitive) * 10 == len(train)


def test_simple_split_is_seeded_and_disjoint():
    a_train, a_test = prepare_scan.make_split("simple", seed=1)
    b_train, _ = prepare_scan.make_split("simple", seed=1)
    c_train, _ = prepare_scan.make_split("simple", seed=2)
    assert a_train == b_train and a_train != c_train
    assert not {c for c, _ in a_train} & {c for c, _ in a_test}


def _run(args, cwd):
    return run_script(os.path.join(SCRIPTS, "prepare_scan.py"), *args, cwd=cwd)


def test_text_output_format(tmp_path):
    proc = _run(["--split", "length", "--no-binarize", "--out-dir", str(tmp_path / "scan")],
                tmp_path)
    assert proc.returncode == 0, proc.stderr
    d = tmp_path / "scan" / "length"
    lines = (d / "tasks_train.txt").read_text().splitlines()
    assert len(lines) == 16990 and all(l.startswith("IN: ") and " OUT: " in l for l in lines)
    for subset, n in (("train", 16990), ("valid", 1000), ("test", 3920)):
        src = (d / f"{subset}.in").read_text().splitlines()
        tgt = (d / f"{subset}.out").read_text().splitlines()
        assert len(src) == len(tgt) == n
    first_in, first_out = lines[0][4:].split(" OUT: ")
    assert first_in == (d / "train.in").read_text().splitlines()[0]
    assert first_out == (d / "train.out").read_text().splitlines()[0]
    assert not [p for p in os.listdir(tmp_path / "scan") if p.startswith(".tmp")]


def test_unknown_split_is_one_line_error(tmp_path):
    proc = _run(["--split", "bogus", "--out-dir", str(tmp_path / "out")], tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0 and "bogus" in proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "data-bin").exists()


def test_unwritable_output_is_one_line_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = _run(["--split", "simple", "--out-dir", str(blocker / "scan")], tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0 and "not writable" in proc.stderr


def test_failed_binarization_leaves_nothing(tmp_path, monkeypatch):
    text_dir = tmp_path / "text"
    text_dir.mkdir()
    prepare_scan.write_split_text(str(text_dir), *prepare_scan.make_split("simple"), 10, 1)
    monkeypatch.setattr(prepare_scan.common, "preprocess_command", lambda: ["false"])
    dest = tmp_path / "bin" / "scan-simple"
    with pytest.raises(prepare_scan.common.PrepareError, match="fairseq-preprocess failed"):
        prepare_scan.binarize(str(text_dir), str(dest))
    assert not dest.exists() and os.listdir(tmp_path / "bin") == []


def _write_release(root, seed=7):
    """Files in the layout of the SCAN release (github.com/brendenlake/SCAN), from splits made
    here; ``simple`` with another seed, as the release's random split differs from ours."""
    folders = {"simple": "simple_split", "length": "length_split",
               "addprim_jump": "add_prim_split", "addprim_turn_left": "add_prim_split"}
    for split, folder in folders.items():
        os.makedirs(root / folder, exist_ok=True)
        train, test = prepare_scan.make_split(split, seed)
        for subset, pairs in (("train", train), ("test", test)):
            (root / folder / f"tasks_{subset}_{split}.txt").write_text(
                "".join(f"IN: {c} OUT: {' '.join(a)}\n" for c, a in pairs))
    return prepare_scan.make_split("simple", seed)


def test_release_files_are_used_with_from(tmp_path):
    release = tmp_path / "SCAN"
    train, test = _write_release(release)
    proc = _run(["--split", "simple,addprim_turn_left", "--from", str(release), "--no-binarize",
                 "--out-dir", str(tmp_path / "scan")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    d = tmp_path / "scan" / "simple"
    assert (d / "train.in").read_text().splitlines() == [c for c, _ in train]
    assert (d / "test.out").read_text().splitlines() == [" ".join(a) for _, a in test]
    generated, _ = prepare_scan.make_split("simple", 1)
    assert [c for c, _ in generated] != [c for c, _ in train]  # not the generated split
    assert len((tmp_path / "scan" / "addprim_turn_left" / "test.in").read_text().splitlines()) \
        == 1208
    # the same options again: nothing to do; other options on that output: an error
    again = _run(["--split", "simple", "--from", str(release), "--no-binarize", "--out-dir",
                  str(tmp_path / "scan")], tmp_path)
    assert again.returncode == 0 and "already prepared" in again.stdout
    other = _run(["--split", "simple", "--no-binarize", "--out-dir", str(tmp_path / "scan")],
                 tmp_path)
    assert other.returncode == 2 and "--force" in other.stderr


def test_release_files_are_checked(tmp_path):
    release = tmp_path / "SCAN"
    _write_release(release)
    test_file = release / "length_split" / "tasks_test_length.txt"
    test_file.write_text("".join(test_file.read_text().splitlines(keepends=True)[:-5]))
    proc = _run(["--split", "length", "--from", str(release), "--no-binarize", "--out-dir",
                 str(tmp_path / "scan")], tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "tasks_test_length.txt: 3915 lines, the release has 3920" in proc.stderr
    missing = _run(["--split", "addprim_jump", "--from", str(tmp_path / "nowhere"),
                    "--no-binarize", "--out-dir", str(tmp_path / "scan")], tmp_path)
    assert missing.returncode == 2 and "no such directory" in missing.stderr
    (release / "add_prim_split" / "tasks_train_addprim_jump.txt").unlink()
    gone = _run(["--split", "addprim_jump", "--from", str(release), "--no-binarize",
                 "--out-dir", str(tmp_path / "scan")], tmp_path)
    assert gone.returncode == 2 and "tasks_train_addprim_jump.txt: not found" in gone.stderr
    assert not (tmp_path / "scan" / "length").exists()
