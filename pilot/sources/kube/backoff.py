"""Exponential backoff with full jitter, so many replicas never retry in lockstep."""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, initial: float = 0.5, maximum: float = 30.0, factor: float = 2.0) -> None:
        self.initial, self.maximum, self.factor = initial, maximum, factor
        self._next = initial

    def next(self) -> float:
        delay = random.uniform(self._next / 2, self._next)
        self._next = min(self.maximum, self._next * self.factor)
        return delay

    def reset(self) -> None:
        self._next = self.initial
