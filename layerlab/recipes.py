"""The optimisation recipes of the quickstart and the seed comparisons, and the language-model
comparison's model sizes (one definition each)."""
import json


def adam_inverse_sqrt(lr, max_tokens, max_update, warmup=200):
    """fairseq-train flags: translation task, Adam (0.9, 0.98), inverse-sqrt schedule with
    ``warmup`` warm-up updates, no dropout, cross-entropy, no validation, last checkpoint only, a
    JSON record every 100 updates."""
    return ["--task", "translation", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
            "--lr", str(lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(warmup),
            "--dropout", "0", "--criterion", "cross_entropy", "--max-tokens", str(max_tokens),
            "--max-update", str(max_update), "--no-epoch-checkpoints", "--disable-validation",
            "--log-interval", "100"]


def flag_value(flags, name):
    """The value that follows ``name`` in a fairseq flag list (a ValueError names the flag when
    the list does not have it)."""
    try:
        return flags[list(flags).index(name) + 1]
    except (ValueError, IndexError):
        raise ValueError(f"no value for {name} in {' '.join(map(str, flags))}") from None


def lm_sizes(arch, blocks, embed_dim, heads, ffn=None):
    """Size flags of a language model with ``blocks`` blocks in all (``ar_encdec_lm``: two stacks
    of half, its cross-attention with ``heads`` heads too), as the WikiText-2 comparison trains
    and the depth bench measures it; ``ffn``: a FFN width other than the default."""
    two_stacks = arch == "ar_encdec_lm"
    out = ["--embed-dim", embed_dim, "--layers", blocks // 2 if two_stacks else blocks,
           "--attention-heads", heads]
    return (out + (["--cross-attention-heads", heads] if two_stacks else [])
            + (["--ffn-embed-dim", ffn] if ffn else []))


def lm_adam_inverse_sqrt(max_update, context, batch, lr="2e-3", warmup=None,
                         log_interval=None):
    """fairseq-train flags of the language-model comparison: ``language_modeling`` over
    ``context``-token blocks (no sentence breaks), ``batch`` blocks per update, Adam (0.9, 0.98),
    inverse-sqrt schedule warmed up over ``warmup`` updates (default: the first eighth of the
    run), gradient clipping at 1, dropout 0.1, weight decay 0.01 (the depth connections excluded
    by default), no validation, last checkpoint only, a JSON record every ``log_interval``
    updates (default: every twentieth of the run).

    fairseq's inverse-sqrt schedule does not depend on ``--max-update``: a longer run with the
    same ``warmup`` trains its first updates exactly as the shorter one (the 8,000-update
    comparison's warm-up of 100 is the 800-update one's)."""
    warmup = max(1, max_update // 8) if warmup is None else warmup
    log_interval = max(1, max_update // 20) if log_interval is None else log_interval
    return ["--task", "language_modeling", "--tokens-per-sample", context,
            "--sample-break-mode", "none", "--batch-size", batch, "--max-update", max_update,
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", lr,
            "--lr-scheduler", "inverse_sqrt", "--warmup-updates", warmup,
            "--clip-norm", "1.0", "--dropout", "0.1", "--weight-decay", "0.01",
            "--no-epoch-checkpoints", "--disable-validation", "--log-interval", log_interval]


def linear_decay_exact_match(lr, max_tokens, max_update, validate_every, warmup=200,
                             max_output_len=64):
    """fairseq-train flags for a fixed budget that ends converged: Adam (0.9, 0.98), the learning
    rate warmed up over ``warmup`` updates and then decayed linearly to 0 at ``max_update``
    (fairseq's ``polynomial_decay``, power 1), no dropout, cross-entropy; every
    ``validate_every`` updates greedy exact match on the valid subset (``seq2seq_eval``) and the
    best checkpoint kept (``checkpoint_best.pt``). Validation only at those updates and at the
    end (not at every epoch's end); one interval checkpoint kept besides best and last."""
    return ["--task", "seq2seq_eval", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
            "--lr", str(lr), "--lr-scheduler", "polynomial_decay", "--warmup-updates",
            str(warmup), "--total-num-update", str(max_update), "--end-learning-rate", "0",
            "--dropout", "0", "--criterion", "cross_entropy", "--max-tokens", str(max_tokens),
            "--max-update", str(max_update), "--log-interval", "100",
            "--eval-exact-match", "--eval-bleu-args",
            json.dumps({"beam": 1, "max_len_a": 0, "max_len_b": max_output_len}),
            "--best-checkpoint-metric", "exact_match", "--maximize-best-checkpoint-metric",
            "--validate-interval-updates", str(validate_every),
            "--save-interval-updates", str(validate_every), "--keep-interval-updates", "1",
            "--validate-interval", "1000000", "--save-interval", "1000000",
            "--no-epoch-checkpoints"]
