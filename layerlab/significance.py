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
DIGITS = {"exact_match": 2, "bleu": 2, "bits": 4}  # what the differences are rounded to


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


def hierarchical_bootstrap(metric, row_runs, base_runs, replicates=1000, seed=0):
    """The difference (row - base) of the seed-mean scores and its 95% bootstrap interval.

    ``row_runs`` / ``base_runs``: one statistics array per seed (same sentences in the same
    order). Returns {difference, low, high, larger_than_noise, replicates}; ``larger_than_noise``
    when the interval excludes 0.
    """
    n = row_runs[0].shape[0]
    if any(r.shape[0] != n for r in list(row_runs) + list(base_runs)):
        raise ValueError("every run must be scored on the same test sentences")
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
    low, high = np.percentile(diffs, [2.5, 97.5])
    digits = DIGITS[metric]
    return {"difference": round(float(observed), digits), "low": round(float(low), digits),
            "high": round(float(high), digits), "larger_than_noise": bool(low > 0 or high < 0),
            "replicates": replicates}
