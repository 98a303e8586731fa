"""LEASH's boundary with the main path: an advisory method's failure becomes "no evidence".

Every method of `Leash` and `LeashWatch` that the barrier, the gate and the engine call is wrapped
in `advisory(on_failure)`: an exception inside it is logged once (again only when it changes, and
once more when it clears) and becomes `on_failure()`, so the call it advises on goes the ordinary
way. A `strict` guard (operator commands) lets the exception through.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

if TYPE_CHECKING:
    from mcp_spec_proxy.leash.calibrate import Calibration

logger = logging.getLogger("mcp_spec_proxy.leash.layers")  # the name operators filter LEASH's warnings by


class Guard:
    """What the `advisory` methods of one Leash share: strictness, and which of them are failing now."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self._failing: dict[str, str] = {}  # operation -> the error it last failed with

    def failed(self, operation: str, exc: Exception) -> None:
        line = f"{type(exc).__name__}: {exc}"
        if self._failing.get(operation) == line:
            logger.debug("LEASH %s failed again: %s", operation, line)
            return
        self._failing[operation] = line
        logger.warning(
            "LEASH %s failed (%s); deciding without LEASH evidence, the ordinary way, until it works again",
            operation,
            line,
        )

    def worked(self, operation: str) -> None:
        if self._failing.pop(operation, None) is not None:
            logger.info("LEASH %s works again", operation)


class _Advised(Protocol):
    @property
    def _guard(self) -> Guard: ...


_S = TypeVar("_S", bound=_Advised)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def advisory(
    on_failure: Callable[[], _R],
) -> Callable[[Callable[Concatenate[_S, _P], Awaitable[_R]]], Callable[Concatenate[_S, _P], Coroutine[Any, Any, _R]]]:
    """The boundary between LEASH and the main path: a failure is logged once and becomes `on_failure()`."""

    def wrap(
        method: Callable[Concatenate[_S, _P], Awaitable[_R]],
    ) -> Callable[Concatenate[_S, _P], Coroutine[Any, Any, _R]]:
        operation = method.__qualname__

        @functools.wraps(method)
        async def advised(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
            guard = self._guard
            try:
                result = await method(self, *args, **kwargs)
            # Deliberately broad: FAISS raises RuntimeError, numpy ValueError, the disk OSError, our own
            # code LeashError, and a bug in advisory code must not cost a user's call either. Cancellation
            # is a BaseException and passes.
            except Exception as exc:
                if guard.strict:
                    raise
                guard.failed(operation, exc)
                return on_failure()
            guard.worked(operation)
            return result

        return advised

    return wrap


def nothing() -> None:
    return None


def no() -> bool:
    return False


def zero() -> int:
    return 0


def uncalibrated() -> Calibration | None:
    return None


__all__ = ["Guard", "advisory", "no", "nothing", "uncalibrated", "zero"]
