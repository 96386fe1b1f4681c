"""What every data preparation script (``scripts/prepare/``) shares: fetching (download or ``--from DIR``), checks,
atomic output directories, and binarisation with the real ``fairseq-preprocess``.

Conventions (every script under scripts/prepare/):
- ``--from DIR`` reads already-downloaded files in DIR (same file names as the release);
  without it the files are downloaded (urllib; ``file://`` URLs work too, which is how the
  download path is tested offline). Downloads are checked against the expected line counts of
  the release (and a SHA-256 where one is pinned).
- Outputs (``data/<name>/`` raw text, ``data-bin/<name>`` binaries) are written under temporary
  names and renamed when complete: a directory that exists is complete, so re-running does
  nothing (``--force`` rebuilds), and an interrupted run leaves nothing that looks finished.
- Bad input (missing split, wrong line count, source/target length mismatch, an empty line,
  text that is not UTF-8) stops with a one-line error naming the file and line, exit code 2.
"""
import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import urllib.request

from . import paths, warm

# fairseq's text_to_speech task calls logging.basicConfig(level=INFO) when fairseq is imported;
# configuring logging first makes that a no-op, so errors stay one line on stderr
logging.basicConfig(level=logging.WARNING, format="%(message)s")


class PrepareError(Exception):
    pass


def base_parser(description, name):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--from", dest="from_dir", metavar="DIR",
                   help="use already-downloaded files from DIR instead of downloading")
    p.add_argument("--out-dir", default=os.path.join("data", name), help="raw text output")
    p.add_argument("--dest-dir", default=os.path.join("data-bin", name),
                   help="fairseq-preprocess output")
    p.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers")
    p.add_argument("--force", action="store_true", help="rebuild even if the output exists")
    return p


def run_main(main_fn, prog, argv=None):
    try:
        return main_fn(argv) or 0
    except (PrepareError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2


class Fetched(str):
    """The path of a file the script made (a download, a decompressed copy) in a scratch
    directory that is deleted afterwards, with ``origin``: what to name in error messages
    instead (the URL, or the user's archive)."""

    def __new__(cls, path, origin):
        obj = super().__new__(cls, path)
        obj.origin = origin
        return obj


def origin(path):
    """The name of ``path`` for the user: the file it was fetched from (:class:`Fetched`)."""
    return getattr(path, "origin", path)


def fetch(name, url, from_dir, dest_dir, sha256=None):
    """``name`` from ``from_dir`` (the user's file itself, read in place, so that errors name
    it) or downloaded from ``url`` into ``dest_dir`` (a :class:`Fetched` path); return its path."""
    if from_dir:
        dest = os.path.join(from_dir, name)
        if not os.path.isfile(dest):
            raise PrepareError(f"{dest}: not found (--from {from_dir})")
    else:
        dest = Fetched(os.path.join(dest_dir, name), url)
        try:
            with urllib.request.urlopen(url, timeout=60) as r, open(dest, "wb") as f:
                shutil.copyfileobj(r, f)
        except OSError as e:
            raise PrepareError(f"download of {url} failed ({e}); download it yourself and "
                               "pass --from DIR") from None
    if sha256:
        digest = hashlib.sha256(open(dest, "rb").read()).hexdigest()
        if digest != sha256:
            raise PrepareError(f"{origin(dest)}: SHA-256 {digest} differs from the release's "
                               f"{sha256} (truncated or corrupt download?)")
    return dest


def read_lines(path, expected=None, allow_empty=False):
    """UTF-8 lines without newlines; checks the count and (unless allowed) empty lines.
    Errors name the file by :func:`origin` (the user's file, not a scratch copy) and line."""
    with open(path, "rb") as f:
        raw = f.read()
    name = origin(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise PrepareError(f"{name}:{line}: not UTF-8 text ({e.reason})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line.rstrip("\r") for line in lines]
    if expected is not None and len(lines) != expected:
        where = (f"ends at line {len(lines)}" if len(lines) < expected
                 else f"line {expected + 1} is one too many")
        raise PrepareError(f"{name}: {len(lines)} lines, the release has {expected} "
                           f"({where}: truncated or wrong file?)")
    if not allow_empty:
        for i, line in enumerate(lines, 1):
            if not line.strip():
                raise PrepareError(f"{name}:{i}: empty line")
    return lines


def check_parallel(src_path, src_lines, tgt_path, tgt_lines):
    if len(src_lines) != len(tgt_lines):
        raise PrepareError(f"{origin(src_path)} has {len(src_lines)} lines but "
                           f"{origin(tgt_path)} has "
                           f"{len(tgt_lines)} (first unmatched line: "
                           f"{min(len(src_lines), len(tgt_lines)) + 1})")


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")


@contextlib.contextmanager
def atomic_dir(final):
    """Yield a temporary directory next to ``final``; rename it to ``final`` on success, with the
    mode a plain ``mkdir`` would give it (``mkdtemp`` makes it 0700: private to the user)."""
    parent = os.path.dirname(os.path.abspath(final))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(final)}-", dir=parent)
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~current_umask())
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def current_umask():
    mask = os.umask(0)  # the only way to read it is to set it: put it back at once
    os.umask(mask)
    return mask


def already_prepared(out_dir, dest_dir, config, force):
    """True when a complete earlier run with the same ``config`` exists (nothing to do).

    Every run records its config in ``<out_dir>/prepared.json``; an existing output prepared
    with another config is an error unless ``--force`` (silently keeping it would be wrong).
    """
    marker = os.path.join(out_dir, "prepared.json")
    if force or not (os.path.isfile(marker) and os.path.isdir(dest_dir)):
        return False
    with open(marker) as f:
        previous = json.load(f)
    if previous != config:
        raise PrepareError(f"{out_dir} was prepared with {previous}, not {config}: "
                           "--force to rebuild")
    print(f"already prepared ({out_dir}, {dest_dir}); --force to rebuild")
    return True


@contextlib.contextmanager
def preparing(out_dir, config):
    """Yield (text_dir, download_dir): the temporary output directory, with ``config`` recorded
    in its prepared.json, and a scratch directory inside it for the fetched files (removed)."""
    with atomic_dir(out_dir) as text:
        with open(os.path.join(text, "prepared.json"), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        download = os.path.join(text, ".download")
        os.makedirs(download)
        yield text, download
        shutil.rmtree(download, ignore_errors=True)


def preprocess_command():
    return paths.fairseq_command("fairseq-preprocess")


def binarize(dest, args, workers=1):
    """Run the real ``fairseq-preprocess ARGS --destdir`` into ``dest`` (atomically)."""
    with atomic_dir(dest) as tmp:
        cmd = preprocess_command() + [*map(str, args), "--destdir", tmp, "--workers", str(workers)]
        proc = warm.run(cmd, merge_stderr=True)
        if proc.returncode != 0:
            raise PrepareError(f"fairseq-preprocess failed: {proc.stdout.strip()[-1500:]}")


def binarize_translation(dest, src, tgt, train, valid=None, tests=(), joined=False, workers=1,
                         extra=()):
    """fairseq-preprocess of ``<prefix>.<src>`` / ``<prefix>.<tgt>`` text files into ``dest``.

    ``tests`` are prefixes binarised as fairseq's ``test``, ``test1``, ``test2``, ... in order.
    """
    args = ["--source-lang", src, "--target-lang", tgt, "--trainpref", train]
    if valid:
        args += ["--validpref", valid]
    if tests:
        args += ["--testpref", ",".join(tests)]
    if joined:
        args.append("--joined-dictionary")
    binarize(dest, args + list(extra), workers)


def fetch_maybe_gz(name, url_gz, from_dir, dest_dir):
    """``name`` from ``from_dir`` (plain or ``name.gz``), or downloaded as ``url_gz``; returns
    the path of the plain file."""
    import gzip

    if from_dir and os.path.isfile(os.path.join(from_dir, name)):
        return fetch(name, None, from_dir, dest_dir)
    if from_dir and not os.path.isfile(os.path.join(from_dir, name + ".gz")):
        raise PrepareError(f"{os.path.join(from_dir, name)}(.gz): not found (--from {from_dir})")
    packed = fetch(name + ".gz", url_gz, from_dir, dest_dir)
    plain = Fetched(os.path.join(dest_dir, name), f"{origin(packed)} (decompressed)")
    try:
        with gzip.open(packed, "rb") as f, open(plain, "wb") as out:
            shutil.copyfileobj(f, out)
    except (OSError, EOFError) as e:
        raise PrepareError(f"{origin(packed)}: corrupt or truncated gzip ({e})") from None
    return plain


def train_sentencepiece(lines, model_prefix, vocab_size, model_type="unigram"):
    """Train a SentencePiece model on ``lines``; return a processor for it."""
    import sentencepiece as spm

    corpus = model_prefix + ".train.txt"
    write_lines(corpus, lines)
    try:
        spm.SentencePieceTrainer.train(
            input=corpus, model_prefix=model_prefix, vocab_size=vocab_size,
            model_type=model_type, character_coverage=1.0, input_sentence_size=2_000_000,
            shuffle_input_sentence=True, minloglevel=2)
    except RuntimeError as e:
        raise PrepareError(f"SentencePiece training failed: {e} (try a smaller --vocab-size)") \
            from None
    finally:
        os.remove(corpus)
    return spm.SentencePieceProcessor(model_file=model_prefix + ".model")


def encode_pieces(processor, lines):
    return [" ".join(processor.encode(line, out_type=str)) for line in lines]
