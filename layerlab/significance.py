"""Is a difference between two rows of a seed comparison larger than the noise?

Two sources of noise make a row's score uncertain: which test sentences were drawn (the test set
is a sample) and which seed the model was trained with. :func:`hierarchical_bootstrap` resamples
both at once: in every replicate it draws the test sentences with replacement (the same draw for
every run, so the comparison stays paired over sentences) and, independently for each row, the
seeds with replacement, and scores every drawn run on the drawn sentences. The 95% interval of
the difference of the rows' seed means says whether the difference is larger than both noises
together; with 3 seeds the seed part is coarse (a resample holds 1 to 3 distinct seeds), which
makes the interval wide rather than falsely narrow.

Scores are recomputed from per-sentence sufficient statistics: exact match (1 per correct
sentence), BLEU (sacreBLEU's n-gram matches and totals and the lengths, summed over the drawn
sentences and turned into corpus BLEU exactly as sacreBLEU's own paired bootstrap does) or, for
language models, bits per token (per test block: its negative log-likelihood in bits and its
token count; the score of a set of blocks is the sum of the one over the sum of the other, lower
is better).
"""
import numpy as np

METRICS = ("exact_match", "bleu", "bits")
# What a bootstrap's difference and interval are rounded to (the printed precision for BLEU and
# exact match), and for bits the precisions they are read at: the tables print four decimals,
# the docs quote three (see rounded()).
DIGITS = {"exact_match": 2, "bleu": 2, "bits": 6}
READ_AT = {"exact_match": (2,), "bleu": (2,), "bits": (3, 4)}


def rounded(metric, value):
    """``value`` rounded to ``DIGITS[metric]`` decimals, or to more where that many would make a
    reading at one of ``READ_AT[metric]`` differ from the unrounded value's: 0.0545499 is kept
    as 0.0545499, not 0.05455, which read to four decimals would give 0.0546 (rounded twice).
    So a table or a text that rounds the stored number rounds once."""
    value = float(value)
    for digits in range(DIGITS[metric], 16):
        stored = round(value, digits)
        if all(round(stored, k) == round(value, k) for k in READ_AT[metric]):
            return stored
    return value


def sentence_stats(metric, hypotheses, references):
    """Per-sentence statistics, n_sentences x k, whose sum over any subset gives that subset's
    corpus score through :func:`score`."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if metric == "exact_match":
        from fairseq_plugins.metrics.exact_match import normalise  # the scorer's own matching

        return np.array([[float(normalise(h) == normalise(r))]
                         for h, r in zip(hypotheses, references)])
    if metric == "bleu":
        from sacrebleu.metrics import BLEU

        # the statistics sacreBLEU's corpus_score and its own bootstrap are computed from
        return np.array(BLEU()._extract_corpus_statistics(list(hypotheses), [list(references)]),
                        dtype=np.int64)
    raise ValueError(f"unknown metric {metric!r}; choose from {', '.join(METRICS)}")


def score(metric, stats):
    """The corpus score of the sentences whose statistics are the rows of ``stats``."""
    if metric == "exact_match":
        return 100.0 * stats[:, 0].mean()
    if metric == "bits":
        return float(stats[:, 0].sum() / stats[:, 1].sum())
    from sacrebleu.metrics import BLEU

    return BLEU()._compute_score_from_stats([int(x) for x in stats.sum(axis=0)]).score


def _sentences(row_runs, base_runs):
    """The number of test sentences every run was scored on (the same for all, or an error)."""
    n = row_runs[0].shape[0]
    if any(r.shape[0] != n for r in list(row_runs) + list(base_runs)):
        raise ValueError("every run must be scored on the same test sentences")
    return n


def _interval(metric, observed, diffs):
    """A bootstrap's result: the observed difference and the 95% interval of ``diffs``."""
    low, high = np.percentile(diffs, [2.5, 97.5])
    return {"difference": rounded(metric, observed), "low": rounded(metric, low),
            "high": rounded(metric, high), "larger_than_noise": bool(low > 0 or high < 0),
            "replicates": len(diffs)}


def hierarchical_bootstrap(metric, row_runs, base_runs, replicates=1000, seed=0):
    """The difference (row - base) of the seed-mean scores and its 95% bootstrap interval.

    ``row_runs`` / ``base_runs``: one statistics array per seed (same sentences in the same
    order). Returns {difference, low, high, larger_than_noise, replicates}; ``larger_than_noise``
    when the interval excludes 0.
    """
    n = _sentences(row_runs, base_runs)
    observed = (np.mean([score(metric, r) for r in row_runs])
                - np.mean([score(metric, r) for r in base_runs]))
    rng = np.random.default_rng(seed)
    diffs = np.empty(replicates)
    for b in range(replicates):
        sentences = rng.integers(0, n, n)
        row = [row_runs[s] for s in rng.integers(0, len(row_runs), len(row_runs))]
        base = [base_runs[s] for s in rng.integers(0, len(base_runs), len(base_runs))]
        diffs[b] = (np.mean([score(metric, r[sentences]) for r in row])
                    - np.mean([score(metric, r[sentences]) for r in base]))
    return _interval(metric, observed, diffs)


def paired_hierarchical_bootstrap(metric, row_runs, base_runs, replicates=1000, seed=0):
    """As :func:`hierarchical_bootstrap`, but paired over seeds: ``row_runs[i]`` and
    ``base_runs[i]`` were trained with the same seed, and every replicate draws one set of seeds
    for both rows (and one set of sentences for every run), so that it resamples the per-seed
    differences rather than each row's seeds independently.

    Why it may pair: in the comparisons here a seed fixes the data order (fairseq shuffles each
    epoch with the seed) and the per-update random state (seed + update number), so the part of
    a score that comes from the seed's draw of data is shared by the two rows and cancels in
    their difference. The unpaired test counts that shared part twice (conservative); this one
    measures how much the difference itself varies from seed to seed. With few seeds the
    bootstrap of a mean of n values narrows its spread by (n - 1) / n: a verdict still needs
    three seeds on each side (the callers' rule)."""
    if len(row_runs) != len(base_runs):
        raise ValueError(f"a paired test needs the same seeds on both sides ({len(row_runs)} "
                         f"against {len(base_runs)} runs)")
    n = _sentences(row_runs, base_runs)
    observed = np.mean([score(metric, r) - score(metric, b) for r, b in zip(row_runs, base_runs)])
    rng = np.random.default_rng(seed)
    diffs = np.empty(replicates)
    for i in range(replicates):
        sentences = rng.integers(0, n, n)
        drawn = rng.integers(0, len(row_runs), len(row_runs))
        diffs[i] = np.mean([score(metric, row_runs[s][sentences])
                            - score(metric, base_runs[s][sentences]) for s in drawn])
    return _interval(metric, observed, diffs)
