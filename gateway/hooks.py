"""An event with subscribers: what the namespace tells the layers beside and above it, without knowing them.

Why not a plain callable attribute: a second subscriber assigning its own function would silently replace the
first (the peers' sender and anything else that wants to hear of changed bytes or paths). A `Hook` keeps every
subscriber and calls each in order; a hook nobody subscribed to costs one empty loop.
"""

from __future__ import annotations

from typing import Callable, Generic, ParamSpec

P = ParamSpec("P")


class Hook(Generic[P]):
    """Subscribers called in the order they subscribed, on the caller's thread; they must not raise."""

    def __init__(self) -> None:
        self._subscribers: list[Callable[P, None]] = []

    def subscribe(self, fn: Callable[P, None]) -> None:
        self._subscribers.append(fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for fn in self._subscribers:
            fn(*args, **kwargs)
