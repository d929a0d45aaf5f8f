"""A run's progress on stderr: tqdm's bar on a terminal, one line an epoch elsewhere.

Written to a file or a pipe (a batch job's log, a notebook's captured stream), tqdm's bar
is one line of carriage returns: a 20-epoch run wrote a 7 KB line of 79 states. There
the run says each epoch once, when its figures are final, and what it does before its
first epoch (compiling), each on a line of its own.
"""

from __future__ import annotations

import sys
import time
from numbers import Number

from tqdm.auto import tqdm


def epoch_progress(total: int, initial: int, enabled: bool):
    """The progress display of a run of `total` epochs resumed at `initial`: tqdm's bar
    where stderr is a terminal or a notebook's (its widget), else `EpochLines`; nothing
    shown unless `enabled`."""
    if enabled and not _is_terminal(sys.stderr):
        return EpochLines(total, initial, sys.stderr)
    return tqdm(total=total, initial=initial, desc="epochs", unit="epoch",
                disable=not enabled, file=sys.stderr, dynamic_ncols=True)


def _is_terminal(stream) -> bool:
    """Whether `stream` shows a bar as it is drawn: a terminal, or a Jupyter kernel's
    stream (which says it is no terminal, and where `tqdm.auto` draws a widget)."""
    if type(stream).__module__.startswith("ipykernel"):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def phase(bar, what: str) -> None:
    """Shows `what` the run is doing (compiling, evaluating) after the progress bar's
    figures until the next ones replace it: phases that take long show no steps."""
    shown = getattr(bar, "postfix", None) or ""  # (a disabled bar has none)
    bar.set_postfix_str(f"{shown}, {what}" if shown else what)


class EpochLines:
    """tqdm's methods that a run calls, as lines: `epochs: 3/20 [12.4 s] loss=0.5123,
    val_acc=0.782` once an epoch's figures are final (at the next epoch, or at the
    end), and the phases before the first epoch (`epochs: 0/20 [0.0 s] compiling`)."""

    def __init__(self, total: int, initial: int, stream):
        self.total, self.n, self.stream = total, initial, stream
        self.postfix, self._pending = "", False
        self._start = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self._flush()
        self.n += n
        self._pending = True

    def set_postfix(self, **shown) -> None:
        """As tqdm's: numbers shown as `tqdm.format_num` writes them."""
        self.postfix = ", ".join(
            f"{name}={tqdm.format_num(value) if isinstance(value, Number) else value}"
            for name, value in shown.items())

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text
        if not self._pending:  # a phase before the first epoch (one is pending after)
            self._line(text)

    def close(self) -> None:
        self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._line(self.postfix)
            self._pending = False

    def _line(self, text: str) -> None:
        seconds = time.perf_counter() - self._start
        print(f"epochs: {self.n}/{self.total} [{seconds:.1f} s] {text}".rstrip(),
              file=self.stream, flush=True)
