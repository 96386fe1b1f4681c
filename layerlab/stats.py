"""Mean and spread over seeds: the one place the experiment scripts compute them."""
import statistics


def mean_std(values):
    """(mean, sample standard deviation) of the values that are not None; (None, None) when
    there are none, std 0.0 for a single value."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return (statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt(mean, std=None, digits=2):
    """``mean ± std`` (``n/a`` for a missing mean; no spread shown when it is 0 or None)."""
    if mean is None:
        return "n/a"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std else "")


def summarise(runs, metric, key="arch"):
    """One summary per row (grouped by ``key``, in first-seen order) of per-seed run results:
    mean, sample std, every seed's value, parameters and the mean final training loss."""
    by_row = {}
    for r in runs:
        by_row.setdefault(r[key], []).append(r)
    out = []
    for row, group in by_row.items():
        mean, std = mean_std([r[metric] for r in group])
        losses = [r["train_loss_bits"] for r in group if r.get("train_loss_bits") is not None]
        out.append({key: row, "mean": round(mean, 2), "std": round(std, 2),
                    "values": [r[metric] for r in group], "seeds": [r["seed"] for r in group],
                    "params": group[0]["params"],
                    "train_loss_bits_mean": round(statistics.mean(losses), 3) if losses
                    else None})
    return out
