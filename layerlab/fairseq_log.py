"""Reading fairseq-train's ``--log-format json`` logs (stdout or ``--log-file``).

Every record is one line ``<date> | <level> | <tag> | {json}``; the tags read here are
``train_inner`` (every ``--log-interval`` updates), ``train`` (end of an epoch) and ``valid``.
fairseq logs losses in bits (base 2).
"""
import json
import math


def records(path, tag):
    """The JSON records of one kind (``train_inner``, ``train``, ``valid``) in log order; a
    truncated or malformed line (a run killed mid-write) is skipped."""
    marker = f"| {tag} | "
    with open(path, errors="replace") as f:
        for line in f:
            if marker in line:
                try:
                    yield json.loads(line.split(marker, 1)[1])
                except ValueError:
                    pass


def last_record(path, tag):
    """The last record of a kind, or None."""
    record = None
    for record in records(path, tag):
        pass
    return record


def last_train_loss(path):
    """Training loss (bits per target token) of the last ``train_inner`` record, or of the
    end-of-epoch ``train`` record when the run was shorter than one log interval."""
    inner = last_record(path, "train_inner")
    if inner is not None:
        return float(inner["loss"])
    final = last_record(path, "train")
    return None if final is None else float(final["train_loss"])


def last_epoch_nll(path, subsets=None):
    """{'train': the last end-of-epoch ``train`` record's cross-entropy, and for each
    ``label: subset`` of ``subsets`` (default ``{'valid': 'valid'}``) the last record's of that
    validation subset}, bits per target token (the ``nll_loss`` the label-smoothed criterion
    logs beside its loss, else ``loss``); None for a kind the log lacks. The training figure
    is the epoch's mean with dropout on, as fairseq logs it; the validation's has none: their
    difference is how much better the model fits what it trained on."""
    out = {}
    for kind, tag in (("train", "train"), *(subsets or {"valid": "valid"}).items()):
        record = last_record(path, tag)
        value = None if record is None else record.get(f"{tag}_nll_loss",
                                                        record.get(f"{tag}_loss"))
        out[kind] = None if value is None else float(value)
    return out


def final_attempt(logged, update_key="num_updates"):
    """``[(update, record)]``: the records of one kind (``records(path, tag)``) that the
    attempt a run finished with logged, in update order; records without ``update_key`` are
    skipped.

    A resumed run appends to its log: the killed attempt's records past its last checkpoint
    are followed by the resumed attempt's from that checkpoint on. fairseq logs each kind at
    strictly increasing updates within one attempt, so a record at an update no later than the
    one before it starts a resumed attempt, and the earlier records at its update and beyond
    (the killed attempt's, which the finished model does not descend from) are dropped."""
    kept = []
    for record in logged:
        try:
            update = int(float(record[update_key]))
        except (ValueError, KeyError, TypeError):
            continue
        while kept and kept[-1][0] >= update:
            kept.pop()
        kept.append((update, record))
    return kept


def read_curves(path, metric="loss", subset="valid"):
    """{'train': [(update, value)], 'valid': [(update, value)]} from one log; ``subset``: the
    validation subset whose records make the 'valid' curve (fairseq tags each subset's records
    with its name: ``--valid-subset valid,test1`` logs both).

    ``metric``: ``loss`` (what the criterion optimises: label-smoothed, or cross-entropy plus
    an embedding loss) or ``nll_loss`` (the cross-entropy alone, where the criterion logs it;
    records without it fall back to ``loss``, as fairseq's cross_entropy logs only that).

    A resumed run's curves are those of the attempt it finished with (:func:`final_attempt`)."""
    curves = {}
    for kind, tag, prefix, update_key in (("train", "train_inner", "", "num_updates"),
                                          ("valid", subset, f"{subset}_",
                                           f"{subset}_num_updates")):
        curves[kind] = []
        for update, record in final_attempt(records(path, tag), update_key):
            try:
                curves[kind].append((update, float(record[prefix + metric]
                                                   if prefix + metric in record
                                                   else record[prefix + "loss"])))
            except (ValueError, KeyError):
                continue  # a record without the metric
    return curves


def bits_to_nats(x):
    return None if x is None else x * math.log(2)
