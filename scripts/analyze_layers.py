#!/usr/bin/env python3
"""What every encoder and decoder layer holds: CKA between layers, the logit lens, where each
layer's update comes from, cross-attention entropy, and the model's own layer weights.

    python scripts/analyze_layers.py checkpoint.pt --data data-bin/multi30k [--subset valid] \\
        [--max-sentences 2000] [--batch-size 64] [--compare other.pt ...] [--out-dir DIR]

Works on this package's checkpoints and on plain fairseq ``transformer`` checkpoints (the
control), and on the language models (logit lens, CKA and updates of their blocks). Runs
teacher-forced forward passes (no gradient) over the first ``--max-sentences`` sentences of the
subset and writes ``analysis.json`` (one entry per checkpoint) and ``analysis.png`` (one row per
checkpoint) in ``--out-dir``; see docs/analysis.md for how to read them.
"""
import argparse
import json
import logging
import os
import resource
import sys

# fairseq's text_to_speech task calls logging.basicConfig(level=INFO) when fairseq is imported;
# configuring logging first keeps errors one line on stderr
logging.basicConfig(level=logging.WARNING, format="%(message)s")


class InputError(Exception):
    """A checkpoint or data directory that cannot be analysed (one line, naming the file)."""


def _first_line(error) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def read_checkpoint(checkpoint, data):
    """The checkpoint's state with ``data`` as its data directory, or InputError when it is not
    a readable checkpoint."""
    from fairseq import checkpoint_utils

    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint, arg_overrides={"data": data})
    except Exception as e:  # truncated, corrupt or not a checkpoint: torch says which, at length
        raise InputError(f"{checkpoint}: not a readable fairseq checkpoint (truncated or "
                         f"corrupt?): {_first_line(e)}") from None
    if not isinstance(state, dict) or "model" not in state:
        raise InputError(f"{checkpoint}: not a fairseq checkpoint (no model state)")
    return state


def load(checkpoint, data, cpu):
    import torch
    from fairseq import checkpoint_utils

    import fairseq_plugins  # noqa: F401  (registers the architectures)

    if not os.path.isdir(data):
        raise InputError(f"--data {data}: no such directory (the data-bin the model was "
                         "trained on)")
    state = read_checkpoint(checkpoint, data)
    try:  # (the state read above already holds --data: fairseq applies no overrides to it)
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint],
                                                                          state=state)
    except FileNotFoundError as e:
        raise InputError(f"--data {data}: {_first_line(e)} (not the data-bin {checkpoint} was "
                         "trained on?)") from None
    except RuntimeError as e:
        mismatch = [line.strip() for line in str(e).splitlines() if "size mismatch" in line]
        if not mismatch:
            raise
        raise InputError(f"--data {data}: its dictionaries do not match {checkpoint} "
                         f"({mismatch[0]})") from None
    except Exception as e:
        if "language pair" not in str(e):
            raise
        raise InputError(f"--data {data}: no dictionaries of a language pair (dict.SRC.txt, "
                         f"dict.TGT.txt) for {checkpoint}") from None
    model = models[0]
    if torch.cuda.is_available() and not cpu:
        model = model.cuda()
    return model.eval(), task


def batches(task, model, subset, batch_size, max_sentences):
    """The subset's batches in order until ``max_sentences`` sentences (fairseq's iterator)."""
    from fairseq import utils

    task.load_dataset(subset)
    dataset = task.dataset(subset)
    iterator = task.get_batch_iterator(
        dataset, max_sentences=batch_size, ignore_invalid_inputs=True,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        required_batch_size_multiple=1, num_workers=0).next_epoch_itr(shuffle=False)
    seen = 0
    for sample in iterator:
        if seen >= max_sentences:
            break
        take = min(sample["nsentences"], max_sentences - seen)
        if take < sample["nsentences"]:
            sample = _first(sample, take)
        seen += take
        yield sample


def _first(sample, n):
    """The first ``n`` sentences of a batch."""
    import torch

    def cut(value):
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.size(0) == \
                sample["nsentences"]:
            return value[:n]
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        return value

    return dict(cut(sample), nsentences=n)


def analyze(checkpoint, args):
    from fairseq import utils

    from fairseq_plugins.analysis.layers import LayerAnalysis

    model, task = load(checkpoint, args.data, args.cpu)
    analysis = LayerAnalysis(model, task.target_dictionary.pad())
    for sample in batches(task, model, args.subset, args.batch_size, args.max_sentences):
        if next(model.parameters()).is_cuda:
            sample = utils.move_to_cuda(sample)
        analysis.add(sample)
    result = analysis.result()
    result.update(checkpoint=checkpoint, data=args.data, subset=args.subset,
                  model_class=model.__class__.__name__)
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("--data", required=True, help="the data-bin the model was trained on")
    p.add_argument("--subset", default="valid")
    p.add_argument("--max-sentences", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=64, help="sentences per forward pass")
    p.add_argument("--compare", nargs="+", default=[], metavar="CHECKPOINT",
                   help="more checkpoints, analysed on the same sentences, one row each")
    p.add_argument("--labels", help="comma-separated row labels (default: the run folders)")
    p.add_argument("--out-dir", default=".")
    p.add_argument("--cpu", action="store_true", help="stay on the CPU even with a GPU")
    args = p.parse_args(argv)
    checkpoints = [args.checkpoint, *args.compare]
    labels = (args.labels.split(",") if args.labels else
              [os.path.basename(os.path.dirname(os.path.abspath(c))) or c for c in checkpoints])
    if len(labels) != len(checkpoints):
        p.error(f"--labels has {len(labels)} names for {len(checkpoints)} checkpoints")
    try:
        for c in checkpoints:
            if not os.path.isfile(c):
                raise FileNotFoundError(f"{c}: no such checkpoint")
        results = [analyze(c, args) for c in checkpoints]
    except (InputError, OSError, ValueError, KeyError) as e:
        print(f"analyze_layers.py: error: {e}", file=sys.stderr)
        return 2
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "analysis.json"), "w") as f:
        json.dump({"analyses": dict(zip(labels, results)), "peak_memory_mb": round(peak_mb, 1)},
                  f, indent=1)
    from fairseq_plugins.analysis.figure import plot

    plot(results, labels, os.path.join(args.out_dir, "analysis.png"))
    done = ", ".join(f"{r['sentences']} sentences of {label}" for label, r in zip(labels, results))
    print(f"analysed {done}; peak memory {peak_mb:.0f} MB -> {args.out_dir}/analysis.{{json,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
