"""Who produced a LEASH label: kept with every row of both bank stores (files and pgvector).

A label is evidence only as far as its author can be trusted: the agent under review can make
harmless look-alikes of a harmful call and have them labelled `success`, so `review: leash`
(`review/leash.py`) counts a success only from sources the operator trusts. For that every row
records:

* `source` — `verdict` (a reviewer's verdict labelled the step), `outcome` (a task outcome was
  reported), `import` (`bank import`), or `unknown`;
* `reviewer` — the verdict's reviewer as audited (`strong`, `human`, `strong→human`, ...);
* `reporter` — who told the bank: `proxy` (a verdict it audited itself), `agent` (a client's
  `report_outcome`: the party under review), `operator` (the CLI), or `unknown`;
* `session` — the session whose call (or task) was labelled; `client` — its client identity,
  where the front authenticated one; `at` — when it was labelled (unix seconds).

Rows stored before provenance existed (old bank files, rows an older replica wrote to pgvector)
read as `UNKNOWN`: no reporter, no session, so nothing vouches for them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Reporter = Literal["proxy", "agent", "operator", "unknown"]
REPORTERS: tuple[Reporter, ...] = ("proxy", "agent", "operator", "unknown")
_TEXT_CAP = 200  # a session id or reviewer name is short; a longer one is cut, never stored whole


@dataclass(frozen=True)
class Provenance:
    source: str
    reviewer: str | None = None
    reporter: Reporter = "unknown"
    session: str | None = None
    client: str | None = None
    at: float | None = None

    @classmethod
    def of(cls, source: str) -> Provenance:
        """What a row stored without an explicit provenance says: an import is the operator's act."""
        return cls(source, reporter="operator" if source == "import" else "unknown", at=time.time())

    def as_json(self) -> dict[str, Any]:
        found = {
            "source": self.source,
            "reviewer": self.reviewer,
            "reporter": self.reporter,
            "session": self.session,
            "client": self.client,
            "at": None if self.at is None else round(self.at, 3),
        }
        return {key: value for key, value in found.items() if value is not None}

    @classmethod
    def from_json(cls, data: Any) -> Provenance:
        """A stored provenance; anything missing or garbled reads as unknown (never as trusted)."""
        if not isinstance(data, Mapping):
            return UNKNOWN
        reporter = data.get("reporter")
        at = data.get("at")
        return cls(
            _text(data.get("source")) or "unknown",
            _text(data.get("reviewer")),
            reporter if reporter in REPORTERS else "unknown",
            _text(data.get("session")),
            _text(data.get("client")),
            float(at) if isinstance(at, int | float) and math.isfinite(at) else None,
        )


UNKNOWN = Provenance("unknown")


def _text(value: Any) -> str | None:
    return value[:_TEXT_CAP] if isinstance(value, str) and value else None


__all__ = ["REPORTERS", "UNKNOWN", "Provenance", "Reporter"]
