"""Early stopping as a small state machine that saves the best checkpoint atomically.

::

    stopper = EarlyStopping(5, min_delta=1e-3, path="best.pt", save=torch.save)
    for epoch in range(max_epochs):
        ...
        stopper.step(val_loss, model.state_dict())   # saves when val_loss improved
        if stopper.should_stop:
            break

A checkpoint is written to ``path + ".partial"``, fsynced and renamed over ``path``
(:func:`stoker._core.atomic.atomic_write`): a crash or an exception inside ``save`` leaves the
previous best checkpoint untouched, and ``best``/``best_epoch`` are only updated after the new
checkpoint is in place. ``save(obj, file)`` gets an open binary file (``torch.save`` accepts
one).

Differences from the usual recipe (seed 001): ``min_delta`` is honoured in both modes, an
equal value is not an improvement, ``NaN`` never is, and the state round-trips through JSON
(``state_dict()``/``load_state_dict()``) so a resumed run keeps its patience counter.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

from stoker._core.atomic import atomic_write

__all__ = ["EarlyStopping"]

_STATE_KEYS = ("best", "best_epoch", "counter", "steps", "should_stop")


class EarlyStopping:
    """Stop after ``patience`` steps without an improvement of more than ``min_delta``.

    ``mode="min"`` for a loss, ``"max"`` for an accuracy. ``step()`` returns whether the value
    improved; ``should_stop``, ``best``, ``best_epoch`` (the step's ``epoch`` argument, by
    default the 0-based count of ``step`` calls) and ``counter`` (steps since the last
    improvement) describe the state.
    """

    def __init__(
        self,
        patience: int,
        *,
        min_delta: float = 0.0,
        mode: str = "min",
        path: str | os.PathLike[str] | None = None,
        save: Callable[[Any, Any], object] | None = None,
    ) -> None:
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"patience must be an int >= 1, got {patience!r}")
        if not isinstance(min_delta, (int, float)) or not math.isfinite(min_delta) or min_delta < 0:
            raise ValueError(f"min_delta must be a finite number >= 0, got {min_delta!r}")
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        if (path is None) != (save is None):
            raise ValueError("give both path= and save= (e.g. save=torch.save), or neither")
        if save is not None and not callable(save):
            raise TypeError(f"save must be callable as save(obj, file), got {save!r}")
        self.patience = patience
        self.min_delta = float(min_delta)
        self.mode = mode
        self.path = None if path is None else os.fspath(path)
        self.save = save
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.counter = 0
        self.steps = 0
        self.should_stop = False

    def is_improvement(self, value: float) -> bool:
        """Whether ``value`` beats ``best`` by more than ``min_delta`` (always true at first)."""
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def step(self, value: float, state: Any = None, *, epoch: int | None = None) -> bool:
        """Record one validation ``value``; save ``state`` when it improved. Returns improved."""
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"value must be a number, got {value!r}") from None
        if self.path is not None and state is None:
            raise ValueError(
                "path= is set: pass the object to save, e.g. step(loss, model.state_dict())"
            )
        epoch = self.steps if epoch is None else int(epoch)
        improved = self.is_improvement(value)
        if improved:
            if self.save is not None and self.path is not None:
                with atomic_write(self.path, "wb") as f:
                    self.save(state, f)
            self.best = value
            self.best_epoch = epoch
            self.counter = 0
        else:
            self.counter += 1
            if self.counter >= self.patience:
                self.should_stop = True
        self.steps += 1
        return improved

    __call__ = step

    def state_dict(self) -> dict:
        """JSON-safe state (the configuration is included so a mismatch is caught on load)."""
        return {k: getattr(self, k) for k in ("patience", "min_delta", "mode", *_STATE_KEYS)}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        missing = [k for k in (*_STATE_KEYS, "mode") if k not in state]
        if missing:
            raise ValueError(f"EarlyStopping state is missing {missing}")
        if state["mode"] != self.mode:
            raise ValueError(f"state is for mode={state['mode']!r}, this one is mode={self.mode!r}")
        for key in ("counter", "steps"):
            v = state[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(
                    f"EarlyStopping state field {key!r} must be an int >= 0, got {v!r}"
                )
        best, best_epoch = state["best"], state["best_epoch"]
        if best is not None and (isinstance(best, bool) or not isinstance(best, (int, float))):
            raise ValueError(
                f"EarlyStopping state field 'best' must be a number or None, got {best!r}"
            )
        if best_epoch is not None and (
            isinstance(best_epoch, bool) or not isinstance(best_epoch, int)
        ):
            raise ValueError(
                f"EarlyStopping state field 'best_epoch' must be an int or None, got {best_epoch!r}"
            )
        self.best = None if best is None else float(best)
        self.best_epoch = best_epoch
        self.counter = state["counter"]
        self.steps = state["steps"]
        self.should_stop = bool(state["should_stop"]) or self.counter >= self.patience

    def __repr__(self) -> str:
        return (
            f"EarlyStopping(patience={self.patience}, mode={self.mode!r}, best={self.best}, "
            f"best_epoch={self.best_epoch}, counter={self.counter}, should_stop={self.should_stop})"
        )
