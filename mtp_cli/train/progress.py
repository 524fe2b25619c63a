"""What one training run reports (TrainProgress while it runs, TrainResult at its end) and its clock."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class TrainProgress:
    step: int
    elapsed_s: float  # this run
    loss: float  # running mean of the last steps
    heldout_top1: float | None  # held-out draft-step-1 top-1 agreement with the trunk (last evaluation)
    heldout_top1_step2: float | None  # held-out step 2, where step 1's token is the trunk's
    steps_per_s: float
    rows_per_s: float
    budget_s: float
    final: bool = False


@dataclass
class TrainResult:
    steps: int
    seconds: float
    steps_per_s: float
    rows_per_s: float
    initial: tuple[float, float]  # held-out (step 1, step 2) top-1 before this run's first step
    final: tuple[float, float]
    history: list[dict] = field(default_factory=list)
    fit: tuple[float, float] | None = None  # the same on training rows: far above `final`, more data beats more steps
    heldout_rows: int = 0  # rows `initial` and `final` were measured on (0: nothing held out, nothing measured)


@dataclass
class RunClock:
    """One run's clock and counts."""

    t0: float
    budget: float
    init: tuple[float, float]  # held-out top-1 (step 1, step 2) at the start
    reserve: float = 0.0  # seconds kept for the end (_end_cost): steps stop that long before the budget
    last: tuple[float, float] = (0.0, 0.0)
    losses: list[float] = field(default_factory=list)
    steps: int = 0
    rows: int = 0
    t_train: float = 0.0  # seconds inside optimiser steps

    def __post_init__(self) -> None:
        self.last = self.init

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self, t_save: float) -> float:
        """Seconds of the budget left for steps, after the end's evaluations and checkpoint."""
        return self.budget - self.elapsed() - self.reserve - t_save

    def per_s(self, n: int) -> float:
        return n / self.t_train if self.t_train else 0.0

    def add(self, loss: float, rows: int, secs: float) -> None:
        self.losses.append(loss)
        self.steps += 1
        self.rows += rows
        self.t_train += secs


__all__ = ["TrainProgress", "TrainResult", "RunClock"]
