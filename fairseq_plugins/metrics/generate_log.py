"""Read fairseq-generate output back into the original sample order.

fairseq-generate prints batches in length order; each line carries its sample id:
``S-<id>`` source, ``T-<id>`` reference, ``H-<id>\t<score>\t<tokens>`` hypothesis and, after
detokenisation/BPE removal, ``D-<id>\t<score>\t<text>``. Scorers need every sample exactly once,
in id order: a missing or repeated id is an error that names the file, line and id.
"""
import re
from typing import Dict, List, Optional

FORMATS = ("auto", "log", "plain")
# what makes a fairseq-generate / fairseq-interactive log: scored hypothesis lines,
# H-<id><TAB><score><TAB><tokens> (and D-<id><TAB><score><TAB><text> after detokenisation)
_SCORED_HYPOTHESIS = re.compile(r"^[HD]-\d+\t[-+]?(\d+\.?\d*|\.\d+|inf|nan)([eE][-+]?\d+)?\t")


class GenerateLogError(ValueError):
    pass


def read_generate_log(path: str, expected: Optional[int] = None) -> Dict[str, List[str]]:
    """Return {'hypotheses': [...], 'references': [...], 'sources': [...]} ordered by sample id.

    Hypotheses come from ``D-`` lines (detokenised) when the log has them, else ``H-`` lines.
    Only the best hypothesis per id is kept (``--nbest`` > 1 prints several, best first).
    ``references`` / ``sources`` are empty lists when the log has no ``T-`` / ``S-`` lines.
    """
    fields = {"S": {}, "T": {}, "H": {}, "D": {}}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            tag, sep, rest = line.rstrip("\n").partition("-")
            if tag not in fields or not sep or (tag in "HD"
                                                and not _SCORED_HYPOTHESIS.match(line)):
                continue  # not a tagged line of fairseq-generate (hypotheses carry a score)
            parts = rest.split("\t", 2 if tag in "HD" else 1)  # the text may hold tabs
            try:
                sample_id = int(parts[0])
            except ValueError:
                continue
            text = parts[-1] if len(parts) > (2 if tag in "HD" else 1) else ""
            if tag in "HD" and sample_id in fields[tag]:
                continue  # nbest: keep the first (best) hypothesis
            if tag in "ST" and sample_id in fields[tag]:
                raise GenerateLogError(f"{path}:{lineno}: sample id {sample_id} appears twice")
            fields[tag][sample_id] = text
    hyps = fields["D"] or fields["H"]
    if not hyps:
        raise GenerateLogError(f"{path}: no H-/D- hypothesis lines (is this fairseq-generate "
                               "output?)")
    n = expected if expected is not None else max(hyps) + 1
    missing = [i for i in range(n) if i not in hyps]
    if missing:
        raise GenerateLogError(
            f"{path}: {len(missing)} of {n} sample ids have no hypothesis (first missing: "
            f"{missing[0]}); fairseq-generate drops a final partial batch unless "
            "--required-batch-size-multiple 1 is given")
    if max(hyps) >= n:
        raise GenerateLogError(f"{path}: sample id {max(hyps)} beyond the expected {n} samples")

    def ordered(d):
        return [d[i] for i in range(n)] if d else []

    return {"hypotheses": ordered(hyps), "references": ordered(fields["T"]),
            "sources": ordered(fields["S"])}


def read_lines(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def is_generate_log(path: str) -> bool:
    """True when the file has fairseq-generate's structure: at least one scored hypothesis line
    (``H-<id>\\t<score>\\t...`` or ``D-...``). A plain file of hypotheses (one per line) is
    not taken for one even where its lines start with ``H-<n>\\t``: a log's second field is
    the score."""
    with open(path, encoding="utf-8") as f:
        return any(_SCORED_HYPOTHESIS.match(line) for line in f)


def resolve_format(path: str, fmt: str) -> str:
    """'log' or 'plain': ``fmt`` itself, or for 'auto' what :func:`is_generate_log` says."""
    if fmt not in FORMATS:
        raise GenerateLogError(f"unknown hypothesis format {fmt!r}; choose from {FORMATS}")
    if fmt != "auto":
        return fmt
    return "log" if is_generate_log(path) else "plain"


def read_hypotheses(path: str, expected: int, what: str, fmt: str = "auto") -> List[str]:
    """Hypotheses in original order from a fairseq-generate log or a plain file (one per line),
    as ``fmt`` says ('auto': :func:`resolve_format`).

    ``expected`` lines are required; ``what`` names the file they must align with in errors.
    """
    if resolve_format(path, fmt) == "log":
        return read_generate_log(path, expected=expected)["hypotheses"]
    hyps = read_lines(path)
    if len(hyps) != expected:
        raise GenerateLogError(f"{path}: {len(hyps)} hypothesis lines, but {what} has {expected} "
                               f"(first unmatched line: {min(len(hyps), expected) + 1})")
    return hyps


def add_format_arg(parser) -> None:
    """The scorers' ``--format`` flag."""
    parser.add_argument("--format", choices=FORMATS, default="auto",
                        help="how to read the hypotheses: a fairseq-generate log (recognised "
                        "by its scored H-/D- lines), a plain file (one hypothesis per line, in "
                        "reference order), or auto (default): decide by the file's structure")
