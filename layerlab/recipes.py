"""The optimisation recipe of the quickstart and the seed comparisons (one definition)."""


def adam_inverse_sqrt(lr, max_tokens, max_update):
    """fairseq-train flags: translation task, Adam (0.9, 0.98), inverse-sqrt schedule with 200
    warm-up updates, no dropout, cross-entropy, no validation, last checkpoint only, a JSON
    record every 100 updates."""
    return ["--task", "translation", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
            "--lr", str(lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "200",
            "--dropout", "0", "--criterion", "cross_entropy", "--max-tokens", str(max_tokens),
            "--max-update", str(max_update), "--no-epoch-checkpoints", "--disable-validation",
            "--log-interval", "100"]
