"""Data preparation: shared machinery on small local files, and every script on the real files
of ../shared/data where present (skipped cleanly otherwise). No test touches the network: the
download path is exercised with file:// URLs."""
import gzip
import json
import os
import subprocess
import sys

import pytest
from conftest import run_script
from helpers import SCRIPTS, SHARED_DATA, load_script

from layerlab import prepare as common

PREPARE = os.path.join(SCRIPTS, "prepare")


def _run(script, *args, cwd):
    return run_script(os.path.join(PREPARE, script), *args, cwd=cwd)


def _count(prefix, dictionary_path):
    from fairseq.data import Dictionary, data_utils

    dataset = data_utils.load_indexed_dataset(str(prefix), Dictionary.load(str(dictionary_path)))
    assert dataset is not None, prefix
    return len(dataset)


def test_read_lines_checks(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("a\nb\n")
    assert common.read_lines(str(good), expected=2) == ["a", "b"]
    with pytest.raises(common.PrepareError, match="good.txt: 2 lines, the release has 3"):
        common.read_lines(str(good), expected=3)
    empty = tmp_path / "empty.txt"
    empty.write_text("a\n \nc\n")
    with pytest.raises(common.PrepareError, match="empty.txt:2: empty line"):
        common.read_lines(str(empty))
    assert common.read_lines(str(empty), allow_empty=True) == ["a", " ", "c"]
    latin = tmp_path / "latin.txt"
    latin.write_bytes("ok\nstra\xdfe\n".encode("latin-1"))
    with pytest.raises(common.PrepareError, match="latin.txt:2: not UTF-8"):
        common.read_lines(str(latin))


def test_fetch_download_checksum_and_gzip(tmp_path):
    server = tmp_path / "server"
    server.mkdir()
    (server / "a.txt").write_text("hello\n")
    with gzip.open(server / "b.txt.gz", "wt") as f:
        f.write("x\ny\n")
    (server / "c.txt.gz").write_bytes(gzip.compress(b"x\ny\n")[:-6])  # truncated
    dest = tmp_path / "dest"
    dest.mkdir()
    url = (server / "a.txt").as_uri()
    assert open(common.fetch("a.txt", url, None, str(dest))).read() == "hello\n"
    import hashlib

    good = hashlib.sha256(b"hello\n").hexdigest()
    common.fetch("a.txt", url, None, str(dest), sha256=good)
    with pytest.raises(common.PrepareError, match="SHA-256 .* differs"):
        common.fetch("a.txt", url, None, str(dest), sha256="0" * 64)
    with pytest.raises(common.PrepareError, match="download of .* failed .* pass --from DIR"):
        common.fetch("a.txt", (server / "missing.txt").as_uri(), None, str(dest))
    path = common.fetch_maybe_gz("b.txt", (server / "b.txt.gz").as_uri(), None, str(dest))
    assert open(path).read() == "x\ny\n"
    with pytest.raises(common.PrepareError, match="corrupt or truncated gzip"):
        common.fetch_maybe_gz("c.txt", (server / "c.txt.gz").as_uri(), None, str(dest))
    with pytest.raises(common.PrepareError, match="not found"):
        common.fetch("nope.txt", None, str(server), str(dest))


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with common.atomic_dir(str(final)) as tmp:
            open(os.path.join(tmp, "half.txt"), "w").write("x")
            raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == []
    with common.atomic_dir(str(final)) as tmp:
        open(os.path.join(tmp, "done.txt"), "w").write("x")
    assert os.listdir(final) == ["done.txt"]


def test_lm_from_any_text_file(tmp_path):
    import random

    rng = random.Random(0)
    words = "the a cat dog sat ran on under mat rug quickly slowly big small".split()
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(600)]
    lines[10] = ""  # empty lines are dropped and counted
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n")
    proc = _run("lm.py", "--text", corpus, "--vocab-size", "30", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "corpus/train: 587 lines (1 empty lines dropped)" in proc.stdout
    out = tmp_path / "data-bin" / "corpus"
    counts = {s: _count(out / s, out / "dict.txt") for s in ("train", "valid", "test")}
    assert counts == {"train": 587, "valid": 6, "test": 6}
    assert (tmp_path / "data" / "corpus" / "spm.model").exists()
    again = _run("lm.py", "--text", corpus, "--vocab-size", "30", cwd=tmp_path)
    assert again.returncode == 0 and "already prepared" in again.stdout
    other = _run("lm.py", "--text", corpus, "--vocab-size", "34", cwd=tmp_path)
    assert other.returncode == 2 and "--force to rebuild" in other.stderr


def test_cogs_bad_inputs(tmp_path):
    src = tmp_path / "cogs"
    src.mkdir()
    (src / "train.tsv").write_text("a\tb\tc\n" * 10)
    proc = _run("cogs.py", "--from", src, "--splits", "train,dev", cwd=tmp_path)
    assert proc.returncode == 2 and "train.tsv: 10 lines, the release has 24155" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    proc = _run("cogs.py", "--splits", "train,bogus", cwd=tmp_path)
    assert proc.returncode == 2 and "unknown COGS split 'bogus'" in proc.stderr
    assert not (tmp_path / "data").exists() or os.listdir(tmp_path / "data") == []
    assert not (tmp_path / "data-bin").exists()


COGS = os.path.join(SHARED_DATA, "cogs")
MULTI30K = os.path.join(SHARED_DATA, "multi30k")
WIKITEXT2 = os.path.join(SHARED_DATA, "wikitext-2")


@pytest.mark.skipif(not os.path.isdir(COGS), reason="../shared/data/cogs not present")
def test_cogs_real_files_via_download_path(tmp_path):
    # the real release files, fetched through the download code (file:// URLs)
    cogs = load_script("prepare", "cogs.py")

    url = "file://" + os.path.abspath(COGS) + "/{}.tsv"
    argv = ["--splits", "train,dev,test", "--out-dir", str(tmp_path / "data" / "cogs"),
            "--dest-dir", str(tmp_path / "data-bin" / "cogs")]
    original, cogs.URL = cogs.URL, url
    try:
        assert cogs.main(argv) == 0
    finally:
        cogs.URL = original
    text, out = tmp_path / "data" / "cogs", tmp_path / "data-bin" / "cogs"
    sizes = {"train": 24155, "valid": 3000, "test": 3000}
    for subset, n in sizes.items():
        assert _count(out / f"{subset}.in-out.in", out / "dict.in.txt") == n
        assert len((text / f"{subset}.cat").read_text().splitlines()) == n
    assert (out / "dict.in.txt").read_text() == (out / "dict.out.txt").read_text()  # joined
    assert set((text / "test.cat").read_text().split()) == {"in_distribution"}
    assert json.loads((text / "prepared.json").read_text())["splits"] == ["train", "dev", "test"]


@pytest.mark.skipif(not os.path.isfile(os.path.join(COGS, "gen_dev.tsv")),
                    reason="../shared/data/cogs/gen_dev.tsv not present")
def test_cogs_gen_dev_from_the_shared_folder(tmp_path):
    """The default splits read gen_dev.tsv where --from has it: 143 of each of 21 categories,
    binarised as the subset after test (test1)."""
    proc = _run("cogs.py", "--from", COGS, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "test=test, test1=gen_dev" in proc.stdout
    text, out = tmp_path / "data" / "cogs", tmp_path / "data-bin" / "cogs"
    categories = (text / "gen_dev.cat").read_text().splitlines()
    assert len(categories) == 3003 and len(set(categories)) == 21
    assert all(categories.count(c) == 143 for c in set(categories))
    assert _count(out / "test1.in-out.in", out / "dict.in.txt") == 3003
    expected = [line.split("\t")[0] for line in
                open(os.path.join(COGS, "gen_dev.tsv"), encoding="utf-8").read().splitlines()]
    assert (text / "gen_dev.in").read_text().splitlines() == expected


def test_cogs_gen_dev_is_every_seventh_example_of_each_category_of_gen(tmp_path):
    """Without gen_dev.tsv, gen_dev is taken from the release's gen.tsv: each category's
    examples 0, 7, ..., 994 (143 of 1,000); a gen.tsv of other categories is refused."""
    cogs = load_script("prepare", "cogs.py")
    rows = [[f"s{c}_{i}", f"l{c}_{i}", f"cat{c}"] for i in range(1000) for c in range(21)]
    picked = cogs.gen_dev_rows(rows)
    assert len(picked) == 3003
    assert [r[0] for r in picked[:3]] == ["s0_0", "s0_7", "s0_14"]
    assert picked[143][0] == "s1_0" and picked[142][0] == "s0_994"
    cogs.check_gen_dev(picked, "x")
    with pytest.raises(cogs.common.PrepareError, match="expected 21 categories of 1000"):
        cogs.gen_dev_rows(rows[:-1])
    with pytest.raises(cogs.common.PrepareError, match="expected 21 categories of 143"):
        cogs.check_gen_dev(picked[1:], "gen_dev.tsv")


@pytest.mark.skipif(not os.path.isdir(MULTI30K), reason="../shared/data/multi30k not present")
def test_multi30k_real_files(multi30k_prepared):
    text, out, stdout = multi30k_prepared  # conftest: the script's run, shared with a table smoke
    assert "multi30k/test (test_2016_flickr): 1000 pairs" in stdout
    for subset, n in {"train": 29000, "valid": 1014, "test": 1000, "test1": 1000}.items():
        assert _count(out / f"{subset}.de-en.en", out / "dict.en.txt") == n
        assert len((text / f"{subset}.raw.en").read_text().splitlines()) == n
    assert (text / "test.raw.de").read_text() == open(
        os.path.join(MULTI30K, "test_2016_flickr.de"), encoding="utf-8").read()


@pytest.mark.skipif(not os.path.isdir(WIKITEXT2), reason="../shared/data/wikitext-2 not present")
def test_wikitext2_real_files(tmp_path):
    proc = _run("lm.py", "--dataset", "wikitext-2", "--from", WIKITEXT2, "--vocab-size", "2000",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "data-bin" / "wikitext-2"
    # the release's non-empty lines: 23,767 / 2,461 / 2,891
    assert [_count(out / s, out / "dict.txt") for s in ("train", "valid", "test")] == \
        [23767, 2461, 2891]


COGNITION = os.path.join(SHARED_DATA, "cognition")


@pytest.mark.skipif(not os.path.isdir(COGNITION), reason="../shared/data/cognition not present")
def test_cognition_small_scale_recipe_real_files(cognition_small_prepared):
    text, out, stdout = cognition_small_prepared  # conftest: shared with the CoGnition smoke
    assert "cognition/cg-test: 10800 pairs" in stdout and "[small-scale" in stdout
    sizes = {"train": 20000, "valid": 1000, "test": 10000, "test1": 10800}
    for subset, n in sizes.items():
        assert _count(out / f"{subset}.en-zh.zh", out / "dict.zh.txt") == n
    assert len((text / "bpe.code").read_text().splitlines()) == 3001  # header + 3,000 merges
    assert "@@" in (text / "train.zh").read_text() and "@@" not in (text / "train.en").read_text()
    # the files placed for the CTER scorer reproduce the official floor on the references
    score = subprocess.run(
        [sys.executable, os.path.join(SCRIPTS, "score_cter.py"), str(text / "cg-test.raw.zh"),
         "--compound", str(text / "cg-test.compound"), "--lexicon", str(text / "lexicon"),
         "--source", str(text / "cg-test.en"), "--json"], capture_output=True, text=True)
    assert score.returncode == 0, score.stderr
    assert f"{json.loads(score.stdout)['all']['instance']:.2f}" == "2.62"


def test_cognition_misaligned_compounds_are_an_error(tmp_path):
    src = tmp_path / "release"
    (src / "cg-test").mkdir(parents=True)
    for name in ("valid.en", "valid.zh", "test.en", "test.zh"):
        (src / name).write_text("x\n" * 10000)
    (src / "cg-test" / "cg-test.en").write_text("the dog barked .\n" * 10800)
    (src / "cg-test" / "cg-test.zh").write_text("狗叫了。\n" * 10800)
    (src / "cg-test" / "cg-test.compound").write_text("the dog\n" * 10799 + "every cat\n")
    (src / "lexicon").write_text("the\t/\n")
    proc = _run("cognition.py", "--from", src, "--train-on", "valid,test", cwd=tmp_path)
    assert proc.returncode == 2
    assert "cg-test.compound:10800: 'every cat' is not in its source sentence" in proc.stderr
    assert not (tmp_path / "data-bin").exists()


def test_wikitext_files_are_checked_against_the_release_sizes(tmp_path):
    src = tmp_path / "wikitext-2"
    src.mkdir()
    (src / "train.txt").write_text(" = Title = \n" * 6000)  # cut from 36,718 lines
    (src / "valid.txt").write_text("x\n" * 3760)
    (src / "test.txt").write_text("x\n" * 4358)
    proc = _run("lm.py", "--dataset", "wikitext-2", "--from", src, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == (f"lm.py: error: {src / 'train.txt'}: 6000 lines, the release has "
                           "36718 (ends at line 6000: truncated or wrong file?)\n")
    assert not (tmp_path / "data-bin").exists()
    assert not (tmp_path / "data").exists() or os.listdir(tmp_path / "data") == []


def test_truncated_files_are_reported_under_the_users_file_name(tmp_path):
    # COGS: the release's tsv, cut
    cogs_dir = tmp_path / "cogs"
    cogs_dir.mkdir()
    (cogs_dir / "train.tsv").write_text("a\tb\tin_distribution\n" * 24155)
    (cogs_dir / "dev.tsv").write_text("a\tb\tin_distribution\n" * 2999)
    proc = _run("cogs.py", "--from", cogs_dir, "--splits", "train,dev", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"cogs.py: error: {cogs_dir / 'dev.tsv'}: 2999 lines, the "
                                  "release has 3000 (ends at line 2999"), proc.stderr
    # Multi30k: a plain file and a gzipped one, each cut
    m30k = tmp_path / "multi30k"
    m30k.mkdir()
    (m30k / "train.de").write_text("ein hund\n" * 28990)
    (m30k / "train.en").write_text("a dog\n" * 29000)
    proc = _run("multi30k.py", "--from", m30k, cwd=tmp_path)
    assert proc.returncode == 2 and f"{m30k / 'train.de'}: 28990 lines, the release has 29000" \
        in proc.stderr, proc.stderr
    (m30k / "train.de").unlink()
    (m30k / "train.de.gz").write_bytes(gzip.compress(b"ein hund\n" * 28990))
    proc = _run("multi30k.py", "--from", m30k, cwd=tmp_path)
    assert proc.returncode == 2 and f"{m30k / 'train.de.gz'} (decompressed): 28990 lines" \
        in proc.stderr, proc.stderr
    # CoGnition: an empty line inside a file names the file and the line
    cog = tmp_path / "cognition"
    (cog / "cg-test").mkdir(parents=True)
    for name in ("valid.en", "valid.zh", "test.en", "test.zh"):
        (cog / name).write_text("x\n" * 10000)
    (cog / "test.zh").write_text("x\n" * 4999 + "\n" + "x\n" * 5000)
    for name in ("cg-test.en", "cg-test.zh", "cg-test.compound"):
        (cog / "cg-test" / name).write_text("x\n" * 10800)
    (cog / "lexicon").write_text("x\t/\n")
    proc = _run("cognition.py", "--from", cog, "--train-on", "valid,test", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == f"cognition.py: error: {cog / 'test.zh'}:5000: empty line\n"
    assert not (tmp_path / "data-bin").exists()
    assert not (tmp_path / "data").exists() or os.listdir(tmp_path / "data") == []


def test_finished_folders_get_the_users_umask(tmp_path):
    previous = os.umask(0o022)
    try:
        with common.atomic_dir(str(tmp_path / "out")) as tmp:
            open(os.path.join(tmp, "f"), "w").close()
        assert os.stat(tmp_path / "out").st_mode & 0o777 == 0o755
        os.umask(0o077)
        with common.atomic_dir(str(tmp_path / "private")):
            pass
        assert os.stat(tmp_path / "private").st_mode & 0o777 == 0o700
    finally:
        os.umask(previous)


def test_prepared_data_folders_are_readable_by_others_under_umask_022(tmp_path):
    _write_corpus(tmp_path)
    proc = subprocess.run(["bash", "-c", f"umask 022 && {sys.executable} "
                           f"{os.path.join(PREPARE, 'lm.py')} --text corpus.txt --vocab-size 20"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for folder in (tmp_path / "data" / "corpus", tmp_path / "data-bin" / "corpus"):
        assert os.stat(folder).st_mode & 0o777 == 0o755, folder


def _write_corpus(root):
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"]
    lines = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(4 + i % 5))
             for i in range(400)]
    (root / "corpus.txt").write_text("\n".join(lines) + "\n")


def _cfq_release(root, examples, split_indices, corrupt=False):
    """A CFQ-shaped cfq1.1.tar.gz (dataset.json + splits/mcd1.json) in root."""
    import io
    import tarfile

    path = root / "cfq1.1.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, obj in (("cfq/dataset.json", examples), ("cfq/splits/mcd1.json", split_indices)):
            data = json.dumps(obj).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    if corrupt:
        path.write_bytes(path.read_bytes()[:60])
    return path


CFQ_EXAMPLES = [
    {"questionPatternModEntities": "Did M0 marry M1's sibling?",
     "sparqlPatternModEntities": "SELECT count(*) WHERE {\nM0 ns:people.person.spouse_s M1 .\n"
                                 "?x0 ns:people.person.gender m.05zppz\n}"},
    {"questionPatternModEntities": "Who directed M0",
     "sparqlPatternModEntities": "SELECT DISTINCT ?x0 WHERE {\n?x0 ns:film.director.film M0\n}"},
    {"questionPatternModEntities": "Was M1 produced by M0",
     "sparqlPatternModEntities": "SELECT count(*) WHERE {\nM1 ns:film.film.produced_by M0\n}"},
]


def test_cfq_from_release_archive(tmp_path):
    _cfq_release(tmp_path, CFQ_EXAMPLES, {"trainIdxs": [0, 1], "devIdxs": [2], "testIdxs": [1]})
    proc = _run("cfq.py", "--from", tmp_path, "--split", "mcd1", "--no-check-sizes", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = tmp_path / "data" / "cfq-mcd1"
    assert (text / "train.in").read_text().splitlines() == [
        "Did M0 marry M1 ' s sibling ?", "Who directed M0"]
    assert (text / "train.out").read_text().splitlines()[0] == (
        "SELECT count ( * ) WHERE { M0 people.person.spouse_s M1 . "
        "?x0 people.person.gender m_05zppz }")
    assert (text / "test.in").read_text() == "Who directed M0\n"
    dest = tmp_path / "data-bin" / "cfq-mcd1"
    assert _count(dest / "train.in-out.in", dest / "dict.in.txt") == 2
    assert _count(dest / "valid.in-out.out", dest / "dict.out.txt") == 1
    # the published sizes are checked unless told otherwise
    proc = _run("cfq.py", "--from", tmp_path, "--split", "mcd1", "--force", cwd=tmp_path)
    assert proc.returncode == 2 and "2 examples, the release has 95743" in proc.stderr


def test_cfq_bad_inputs(tmp_path):
    _cfq_release(tmp_path, CFQ_EXAMPLES, {"trainIdxs": [0], "devIdxs": [1]}, corrupt=True)
    proc = _run("cfq.py", "--from", tmp_path, "--no-check-sizes", cwd=tmp_path)
    assert proc.returncode == 2 and "cfq1.1.tar.gz" in proc.stderr and "corrupt" in proc.stderr
    _cfq_release(tmp_path, CFQ_EXAMPLES, {"trainIdxs": [0], "devIdxs": [1]})
    proc = _run("cfq.py", "--from", tmp_path, "--no-check-sizes", cwd=tmp_path)
    assert proc.returncode == 2 and "has no testIdxs" in proc.stderr
    _cfq_release(tmp_path, CFQ_EXAMPLES, {"trainIdxs": [0], "devIdxs": [7], "testIdxs": [1]})
    proc = _run("cfq.py", "--from", tmp_path, "--no-check-sizes", cwd=tmp_path)
    assert proc.returncode == 2 and "index 7 outside dataset.json" in proc.stderr
    assert not (tmp_path / "data-bin").exists()


CFQ_MCD1 = os.path.join(SHARED_DATA, "cfq_mcd1")


@pytest.mark.skipif(not os.path.isdir(CFQ_MCD1), reason="../shared/data/cfq_mcd1 not present")
def test_cfq_mcd1_real_preprocessed_files(tmp_path):
    proc = _run("cfq.py", "--split", "mcd1", "--preprocessed-from", CFQ_MCD1, "--workers", "2",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "cfq-mcd1/train: 95743 examples" in proc.stdout
    assert "cfq-mcd1/dev: 11968 examples" in proc.stdout and "no test subset" in proc.stdout
    dest = tmp_path / "data-bin" / "cfq-mcd1"
    assert _count(dest / "train.in-out.out", dest / "dict.out.txt") == 95743
    assert _count(dest / "valid.in-out.in", dest / "dict.in.txt") == 11968


NEWSTEST = os.path.join(SHARED_DATA, "newstest")


def _tgz(path, members):
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.skipif(not os.path.isdir(NEWSTEST), reason="../shared/data/newstest not present")
def test_wmt16_release_order_max_pairs_and_newstest(tmp_path):
    import shutil

    src = tmp_path / "release"
    src.mkdir()
    for year in (2015, 2016):
        for lang in ("de", "en"):
            shutil.copy(os.path.join(NEWSTEST, f"newstest{year}.{lang}"), src)
    # three release archives (real newstest lines standing in for the training text)
    lines = {lang: open(os.path.join(NEWSTEST, f"newstest2013.{lang}")).read().splitlines()
             for lang in ("de", "en")}
    parts = [("training-parallel-europarl-v7.tgz", "training/europarl-v7.de-en", 0, 120),
             ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en", 120, 240),
             ("training-parallel-nc-v11.tgz", "training-parallel-nc-v11/news-commentary-v11.de-en",
              240, 400)]
    for archive, member, a, b in parts:
        de = lines["de"][a:b]
        if a == 0:
            de[5] = ""  # an empty side: dropped and counted
        _tgz(src / archive, {f"{member}.de": "\n".join(de) + "\n",
                             f"{member}.en": "\n".join(lines["en"][a:b]) + "\n"})
    proc = _run("wmt16.py", "--from", src, "--max-pairs", "200", "--vocab-size", "500",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "train: 200 pairs (1 with an empty side dropped)" in proc.stdout
    assert "valid (newstest2015): 2169 pairs" in proc.stdout
    assert "test (newstest2016): 2999 pairs" in proc.stdout
    text = tmp_path / "data" / "wmt16-de-en"
    train_en = (text / "train.raw.en").read_text().splitlines()
    # release order: all of Europarl (minus the empty pair), then Common Crawl from its start
    assert train_en == lines["en"][:5] + lines["en"][6:201]
    dest = tmp_path / "data-bin" / "wmt16-de-en"
    assert _count(dest / "train.de-en.de", dest / "dict.de.txt") == 200
    assert _count(dest / "test.de-en.en", dest / "dict.en.txt") == 2999
    # a truncated archive is a clear error naming it
    (src / "training-parallel-europarl-v7.tgz").write_bytes(
        (src / "training-parallel-europarl-v7.tgz").read_bytes()[:100])
    proc = _run("wmt16.py", "--from", src, "--max-pairs", "200", "--force", cwd=tmp_path)
    assert proc.returncode == 2 and "training-parallel-europarl-v7.tgz" in proc.stderr


def test_wmt16_opus_mt_dir_must_be_complete(tmp_path):
    (tmp_path / "opus").mkdir()
    (tmp_path / "opus" / "source.spm").write_text("x")
    proc = _run("wmt16.py", "--opus-mt-dir", tmp_path / "opus", cwd=tmp_path)
    assert proc.returncode == 2 and "missing target.spm, dict.de.txt, dict.en.txt" in proc.stderr


@pytest.mark.skipif(not os.path.isdir(NEWSTEST), reason="../shared/data/newstest not present")
def test_wmt16_with_opus_mt_pieces_and_dictionaries(tmp_path):
    """--opus-mt-dir: the converted model's SentencePiece models and dictionaries are used as is
    (here two small models trained on the spot stand in for opus-mt's)."""
    import shutil

    import sentencepiece as spm

    src, opus = tmp_path / "release", tmp_path / "opus"
    src.mkdir(), opus.mkdir()
    for year in (2013, 2015, 2016):
        for lang in ("de", "en"):
            name = f"newstest{year}.{lang}"
            shutil.copy(os.path.join(NEWSTEST, name),
                        src / (f"train.{lang}" if year == 2013 else name))
    for lang, side in (("de", "source"), ("en", "target")):
        spm.SentencePieceTrainer.train(input=str(src / f"train.{lang}"),
                                       model_prefix=str(opus / side), vocab_size=400,
                                       minloglevel=2)
        (opus / f"{side}.model").rename(opus / f"{side}.spm")
        pieces = [line.split("\t")[0] for line in (opus / f"{side}.vocab").read_text().splitlines()]
        (opus / f"dict.{lang}.txt").write_text("".join(f"{p} 1\n" for p in pieces[3:]))
    proc = _run("wmt16.py", "--from", src, "--max-pairs", "100", "--opus-mt-dir", opus,
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    dest = tmp_path / "data-bin" / "wmt16-de-en"
    for lang in ("de", "en"):  # the model's dictionaries, unchanged
        assert (dest / f"dict.{lang}.txt").read_text() == (opus / f"dict.{lang}.txt").read_text()
    processor = spm.SentencePieceProcessor(model_file=str(opus / "source.spm"))
    first = open(os.path.join(NEWSTEST, "newstest2013.de")).readline().strip()
    encoded = (tmp_path / "data" / "wmt16-de-en" / "train.de").read_text().splitlines()[0]
    assert encoded == " ".join(processor.encode(first, out_type=str))
    assert _count(dest / "train.de-en.en", dest / "dict.en.txt") == 100
