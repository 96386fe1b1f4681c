"""Progress of running trainings, read from their fairseq logs (``--log-format json``).

:class:`TrainingProgress` watches the ``train.log`` of every run it is given, from a background
thread. In a terminal it keeps one status line up to date (``\\r``: updates done of the total
and the latest validation score of each running run); anywhere else (a log file, a pipe) it
prints a plain line whenever a run has a new validation score, so that a log gets a few lines
per run and no control characters. Lines the caller prints go through :meth:`print`, which
clears the status line first.
"""
import os
import sys
import threading
import time
from typing import Dict, Optional

from .fairseq_log import last_record


def run_state(log: str, metric: str) -> Optional[Dict]:
    """{'updates': int, 'valid': float or None} of a fairseq-train log so far (None before its
    first record)."""
    if not os.path.isfile(log):
        return None
    inner = last_record(log, "train_inner")
    valid = last_record(log, "valid")
    updates = [int(float(r[k])) for r, k in ((inner, "num_updates"), (valid, "valid_num_updates"))
               if r is not None and k in r]
    if not updates:
        return None
    score = valid.get(f"valid_{metric}") if valid is not None else None
    return {"updates": max(updates), "valid": None if score is None else float(score),
            "valid_updates": None if valid is None else int(float(valid["valid_num_updates"]))}


class TrainingProgress:
    """Shows the progress of the runs ``logs`` ({label: path of its train.log}) of
    ``total_updates`` updates each, every ``interval`` seconds, until :meth:`stop`; ``metric``
    is the validation statistic shown (``exact_match``: ``valid_exact_match`` in the log)."""

    def __init__(self, logs: Dict[str, str], total_updates: int, metric: str = "exact_match",
                 stream=None, interval: float = 2.0, tty: Optional[bool] = None):
        self.logs, self.total, self.metric = dict(logs), total_updates, metric
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval = interval
        # a log older than this is a previous run's (not yet replaced by the one it will run)
        self.started = time.time()
        self.finished = set()
        self._shown_valid = {}  # label -> the validation update last printed (plain mode)
        self._status_width = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            self._clear()

    def done(self, label: str):
        """``label`` has finished: no longer shown."""
        with self._lock:
            self.finished.add(label)

    def print(self, line: str):
        """Print ``line`` (clearing the status line first; it is redrawn at the next tick)."""
        with self._lock:
            self._clear()
            self.stream.write(line + "\n")
            self.stream.flush()

    def _clear(self):
        if self.tty and self._status_width:
            self.stream.write("\r" + " " * self._status_width + "\r")
            self.stream.flush()
            self._status_width = 0

    def _loop(self):
        while not self._stop.wait(self.interval):
            self.tick()

    def _describe(self, state) -> str:
        text = f"{state['updates']}/{self.total}"
        if state["valid"] is not None:
            text += f", valid {self.metric.replace('_', ' ')} {state['valid']:.1f}"
        return text

    def tick(self):
        """Read the logs once and show what changed."""
        states = {label: run_state(log, self.metric) for label, log in self.logs.items()
                  if label not in self.finished and os.path.isfile(log)
                  and os.path.getmtime(log) >= self.started}
        states = {label: s for label, s in states.items() if s is not None}
        with self._lock:
            if self.tty:
                self._clear()
                if states:
                    line = "      training: " + "; ".join(
                        f"{label} {self._describe(s)}" for label, s in states.items())
                    self.stream.write(line)
                    self.stream.flush()
                    self._status_width = len(line)
                return
            for label, state in states.items():
                if (state["valid_updates"] is not None
                        and self._shown_valid.get(label) != state["valid_updates"]):
                    self._shown_valid[label] = state["valid_updates"]
                    self.stream.write(f"      {label}: {self._describe(state)}\n")
                    self.stream.flush()
