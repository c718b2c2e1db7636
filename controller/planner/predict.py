"""Next-interval load predictors: constant (the last observation) and Holt's linear trend
(double exponential smoothing), which follows a ramp instead of lagging it.

A predictor sees one load value per planner interval and predicts the next; the planner keeps
one per quantity (request rate, prompt length, output length)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pdctl_api.schema import PredictorName


class Predictor(Protocol):
    def update(self, value: float) -> None: ...

    def predict(self) -> float | None: ...


@dataclass
class Constant:
    """The next interval looks like the last one."""

    last: float | None = None

    def update(self, value: float) -> None:
        self.last = value

    def predict(self) -> float | None:
        return self.last


@dataclass
class Holt:
    """Level and trend, each exponentially smoothed; the prediction is one step ahead
    (level + trend), never below zero. ``alpha`` weighs new values into the level, ``beta``
    new slopes into the trend."""

    alpha: float = 0.6
    beta: float = 0.4
    level: float | None = None
    trend: float = 0.0

    def update(self, value: float) -> None:
        if self.level is None:
            self.level = value
            return
        prev = self.level
        self.level = self.alpha * value + (1 - self.alpha) * (prev + self.trend)
        self.trend = self.beta * (self.level - prev) + (1 - self.beta) * self.trend

    def predict(self) -> float | None:
        if self.level is None:
            return None
        return max(0.0, self.level + self.trend)


def make(name: PredictorName) -> Predictor:
    return Holt() if name == "holt" else Constant()


@dataclass(frozen=True)
class Traffic:
    """A load over one interval (modelled time): requests/s and mean tokens per request."""

    request_rate: float
    prompt_tokens: float
    output_tokens: float

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.request_rate * self.prompt_tokens

    @property
    def output_tokens_per_s(self) -> float:
        return self.request_rate * self.output_tokens


class LoadPredictor:
    """One predictor per quantity of ``Traffic``."""

    def __init__(self, name: PredictorName) -> None:
        self.name = name
        self._rate, self._isl, self._osl = make(name), make(name), make(name)

    def update(self, load: Traffic) -> None:
        self._rate.update(load.request_rate)
        self._isl.update(load.prompt_tokens)
        self._osl.update(load.output_tokens)

    def predict(self) -> Traffic | None:
        rate, isl, osl = self._rate.predict(), self._isl.predict(), self._osl.predict()
        if rate is None or isl is None or osl is None:
            return None
        return Traffic(rate, isl, osl)
