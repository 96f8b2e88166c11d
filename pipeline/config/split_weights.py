"""data.split, parsed once: the train, validation and test weights of each document's split.

Given as a string ('90,5,5') or a list ([90,5,5]), it is a `Split` from composition on: a
string (as the run's config.yaml and provenance record it) that holds its three weights.
"""

from __future__ import annotations

import math
from typing import Any

from pipeline.core.errors import ConfigError

KEY = "data.split"


class Split(str):
    """'90,5,5' with its `weights` (90.0, 5.0, 5.0) and `shares` (summing to 1)."""

    weights: tuple[float, float, float]

    def __new__(cls, text: str) -> Split:
        split = super().__new__(cls, text)
        try:
            weights = tuple(float(w) for w in text.split(","))
        except ValueError:
            raise ConfigError(f"{KEY}: {text!r} is not three comma-separated numbers") from None
        if len(weights) != 3 or not all(math.isfinite(w) and w >= 0 for w in weights):
            raise ConfigError(f"{KEY}: needs 3 weights >= 0")
        split.weights = weights  # type: ignore[assignment]
        return split

    @classmethod
    def of(cls, value: Any) -> Split:
        """A Split from the string or the list form; the string is kept as given, so that a
        run recorded with it reads back the same."""
        if isinstance(value, Split):
            return value
        if isinstance(value, (list, tuple)):
            if not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in value):
                raise ConfigError(f"{KEY}: {list(value)!r} is not three numbers")
            value = ",".join(str(w) for w in value)
        if not isinstance(value, str):
            raise ConfigError(f"{KEY}: {value!r} is not three comma-separated numbers")
        return cls(value)

    @property
    def shares(self) -> list[float]:
        total = sum(self.weights)
        return [w / total for w in self.weights]

    def __reduce__(self) -> tuple:  # pickled (to a job) as its text, parsed again
        return (Split, (str(self),))
