"""CTER: compound translation error rate of CoGnition (Li et al., ACL 2021), as its tool defines it.

Input: the cg-test set in its original order (2,160 compounds x 5 consecutive contexts; NP, VP and
PP blocks of 720 compounds), one compound per line (``cg-test.compound``), the lexicon
(``english<TAB>chinese/alternatives``) and one Chinese hypothesis per line.

Every word of the compound is an atom with a class (preposition, verb, determiner, adjective,
noun, modifier; the cg-test compounds are ``[verb | preposition] determiner [adjective] noun
[modifier]``), the modifiers "he liked", "at the store", "on the floor" being single atoms
(lexicon ``mod0/1/2``). An instance is correct when, in the hypothesis with BPE markers and all
spaces removed,

1. every atom is found: one of its lexicon alternatives occurs (an entry of only ``/``, as
   ``the\t/``, is an untranslated function word: always found, no position);
2. the word order holds: determiner before noun, adjective before noun, and modifier before noun
   for compounds without a verb (with a verb the modifier may attach to the verb). Each check is
   lenient: the first match start of the first atom must be before the last match start of the
   second (matches are the non-overlapping occurrences of every alternative).

Instance CTER = wrong instances / instances; aggregate CTER = compounds with any wrong context /
compounds. Both overall and per NP / VP / PP block.

Two quirks of the official tool are kept by default, so that numbers compare with published ones;
``read_lexicon(path, strict=True)`` fixes them:
- ``liked\t喜欢/`` has an empty alternative, which matches everywhere: "liked" is always found
  (strict: empty alternatives are dropped);
- ``building`` is listed twice and the second line replaces the first (strict: the alternatives of
  both lines count).
Scoring the references themselves gives instance 2.620% and aggregate 9.815% (283 and 212 errors;
rounded: 2.62% / 9.82%), in both modes.
"""
import re
from typing import Dict, List, Optional, Sequence

MODIFIERS = {"he liked": "mod0", "at the store": "mod1", "on the floor": "mod2"}
CONTEXTS_PER_COMPOUND = 5
CG_TEST_SIZE = 10800  # NP, VP, PP blocks of 3,600 lines each, in this order
CATEGORIES = ("NP", "VP", "PP")
VERBS = frozenset("asked caught chose found gave hated heard invited left liked lost met saw "
                  "stopped told took visited watched woke".split())
PREPOSITIONS = frozenset("about around before behind except for from inside like near on to "
                         "toward towards under with without".split())


class CterInputError(ValueError):
    pass


def read_lexicon(path: str, strict: bool = False) -> Dict[str, List[str]]:
    """english -> Chinese alternatives. Non-strict: a repeated entry replaces the earlier one."""
    lexicon: Dict[str, List[str]] = {}
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise CterInputError(f"cannot read lexicon {path}: {e.strerror}") from None
    with f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            word, sep, alts = line.partition("\t")
            if not sep:
                raise CterInputError(f"{path}:{lineno}: expected 'english<TAB>chinese/...', "
                                     f"got {line!r}")
            alternatives = alts.split("/")
            if strict:
                # '/' alone marks an untranslated function word: keep it; drop stray empties
                alternatives = [a for a in alternatives if a] or [""]
                alternatives = lexicon.get(word, []) + [a for a in alternatives
                                                        if a not in lexicon.get(word, [])]
            lexicon[word] = alternatives
    return lexicon


def normalise_hypothesis(text: str) -> str:
    """Remove subword-nmt markers ("@@ ") and every space: Chinese is scored unsegmented."""
    return text.strip().replace("@@ ", "").replace(" ", "")


# The official tool's word classes (facts about the benchmark's vocabulary).
WORD_CLASSES = {
    "P": PREPOSITIONS,
    "V": VERBS,
    "DET": frozenset("the every any another each".split()),
    "ADJ": frozenset("small red dirty lazy smart large special silly quiet empty fake".split()),
    "N": frozenset("dog doctor sandwich hat waiter lawyer peanut farmer car girl boyfriend child "
                   "chair building clown bee apartment farm airplane".split()),
    "MOD": frozenset(MODIFIERS.values()),
}


def compound_atoms(compound: str):
    """(class, atom) pairs of a compound, the multi-word modifiers merged into mod0/1/2."""
    text = compound.strip()
    for phrase, atom in MODIFIERS.items():
        text = text.replace(phrase, atom)
    atoms = []
    for word in text.split():
        cls = next((c for c, words in WORD_CLASSES.items() if word in words), None)
        if cls is None:
            raise CterInputError(f"compound {compound!r}: {word!r} is not a CoGnition atom")
        atoms.append((cls, word))
    return atoms


def _match_span(hyp: str, alternatives: Sequence[str]):
    """(found, [first, last] match start) of any alternative; span [] for '/'-only entries."""
    if all(a == "" for a in alternatives):
        return True, []
    starts = [m.start() for a in alternatives for m in re.finditer(re.escape(a), hyp)]
    return bool(starts), ([min(starts), max(starts)] if starts else [])


def instance_correct(compound: str, hypothesis: str, lexicon: Dict[str, List[str]]) -> bool:
    hyp = normalise_hypothesis(hypothesis)
    spans = {}
    for cls, atom in compound_atoms(compound):
        if atom not in lexicon:
            raise CterInputError(f"compound {compound!r}: {atom!r} is not in the lexicon")
        found, span = _match_span(hyp, lexicon[atom])
        if not found:
            return False
        spans[cls] = span  # a later atom of the same class replaces an earlier one
    order = [("DET", "N"), ("ADJ", "N")]
    if not spans.get("V"):
        # with a verb, the modifier may attach to the verb ("bought the car at the store")
        order.append(("MOD", "N"))
    for first, second in order:
        a, b = spans.get(first), spans.get(second)
        if a and b and not a[0] < b[1]:
            return False
    return True


def cter(compounds: Sequence[str], hypotheses: Sequence[str], lexicon: Dict[str, List[str]],
         categories: Optional[Sequence[str]] = None) -> Dict:
    """Instance and aggregate CTER (percent), overall and per category.

    ``compounds`` and ``hypotheses`` are aligned line by line in cg-test order (5 consecutive
    contexts per compound). ``categories`` (one label per line, each label one block of whole
    compounds) defaults, for the full 10,800-line cg-test, to its NP, VP, PP blocks.
    """
    n = len(compounds)
    if len(hypotheses) != n:
        raise CterInputError(f"{len(hypotheses)} hypotheses for {n} compound lines")
    if n == 0 or n % CONTEXTS_PER_COMPOUND:
        raise CterInputError(f"{n} lines is not a positive multiple of {CONTEXTS_PER_COMPOUND} "
                             "(cg-test has 5 consecutive contexts per compound)")
    for start in range(0, n, CONTEXTS_PER_COMPOUND):
        group = {c.strip() for c in compounds[start:start + CONTEXTS_PER_COMPOUND]}
        if len(group) != 1:
            raise CterInputError(f"compound lines {start + 1}-{start + CONTEXTS_PER_COMPOUND} "
                                 "differ: the input is not in cg-test order")
    if categories is None and n == CG_TEST_SIZE:
        block = n // len(CATEGORIES)
        categories = [CATEGORIES[i // block] for i in range(n)]
    correct = [instance_correct(c, h, lexicon) for c, h in zip(compounds, hypotheses)]

    def rates(indices):
        wrong = sum(not correct[i] for i in indices)
        groups = range(indices[0] // CONTEXTS_PER_COMPOUND,
                       indices[-1] // CONTEXTS_PER_COMPOUND + 1)
        wrong_groups = sum(
            not all(correct[g * CONTEXTS_PER_COMPOUND:(g + 1) * CONTEXTS_PER_COMPOUND])
            for g in groups)
        return {"instance": 100.0 * wrong / len(indices),
                "aggregate": 100.0 * wrong_groups / len(groups),
                "instances": len(indices), "compounds": len(groups)}

    result = {"all": rates(list(range(n)))}
    for cat in dict.fromkeys(categories or []):
        idx = [i for i in range(n) if categories[i] == cat]
        if any(b - a != 1 for a, b in zip(idx, idx[1:])) or idx[0] % CONTEXTS_PER_COMPOUND:
            raise CterInputError(f"category {cat!r} is not one block of whole compounds")
        result[cat] = rates(idx)
    return result
