"""The retail database: where the data lives, its canonical form, fresh copies and the DB hash.

Promises (TOOLS.md sections 1.4 and 1.5):

- `load_db(path)` returns the *canonical* database: every order carries the seven optional keys
  (null when unset) and every `price`, `amount` and `balance` is a float.
- `fresh_db(original)` is a deep copy, sharing no sub-object with `original`: tools mutate it in
  place, the original never changes.
- `db_hash(db)` is the SHA-256 hex digest of `json.dumps(db, sort_keys=True)` with default
  separators, so two databases hash equal iff their canonical values are equal, float bit for
  float bit.

The data folder is the repository's `data/tau2-retail` (MIT, from tau2-bench: see its NOTICE.md),
or whatever the caller passes (the runner's `--data`, or `TAU2_RETAIL_DATA` that the runner and
tests read and hand in, e.g. a tau2-bench checkout's `data/tau2/domains/retail`; where that folder
has no TOOLS.md, ours is the tools' spec: `tools_spec`). Nothing is ever downloaded.
"""

from __future__ import annotations

import hashlib
import json
import marshal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

Db = dict[str, Any]

DATA_ENV = "TAU2_RETAIL_DATA"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = REPO_ROOT / "data" / "tau2-retail"

ORDER_OPTIONAL_KEYS = (
    "cancel_reason",
    "exchange_items",
    "exchange_new_items",
    "exchange_payment_method_id",
    "exchange_price_difference",
    "return_items",
    "return_payment_method_id",
)


class DataNotFound(FileNotFoundError):
    """The retail data folder or one of its files is missing."""


def data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The data folder: `$TAU2_RETAIL_DATA` if set in `environ`, else the repository's own."""
    override = (environ or {}).get(DATA_ENV)
    folder = Path(override) if override else DEFAULT_DATA_DIR
    if not (folder / "db.json").is_file():
        raise DataNotFound(
            f"tau2 retail data not found in {folder} (no db.json) — set {DATA_ENV} to the folder "
            "holding db.json, tasks.json and TOOLS.md"
        )
    return folder.resolve()


def tools_spec(folder: Path) -> Path:
    """The tools' behavioural spec for a data folder: its own TOOLS.md, else the repository's."""
    own = folder / "TOOLS.md"
    return own if own.is_file() else DEFAULT_DATA_DIR / "TOOLS.md"


def canonicalize(raw: Mapping[str, Any]) -> Db:
    """The canonical form of a database read from JSON (a new object; `raw` is not changed)."""
    if set(raw) != {"products", "users", "orders"}:
        raise ValueError(f"a retail DB has exactly the keys products, users, orders; got {sorted(raw)}")
    # A JSON round trip, not deepcopy: it also undoes any sharing of sub-objects in `raw`, which
    # would let one in-place change show up in two places.
    db: Db = json.loads(json.dumps(raw))
    for product in db["products"].values():
        for variant in product["variants"].values():
            variant["price"] = float(variant["price"])
    for user in db["users"].values():
        for method in user["payment_methods"].values():
            if "balance" in method:
                method["balance"] = float(method["balance"])
    for order in db["orders"].values():
        for line in order["items"]:
            line["price"] = float(line["price"])
        for transaction in order["payment_history"]:
            transaction["amount"] = float(transaction["amount"])
        for key in ORDER_OPTIONAL_KEYS:
            order.setdefault(key, None)
    return db


def load_db(path: Path) -> Db:
    """Read `db.json` and return its canonical form."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise DataNotFound(f"retail DB not found: {path}") from exc
    return canonicalize(json.loads(text))


def fresh_db(original: Db) -> Db:
    """A private copy of `original` for one task run; tools mutate the copy in place."""
    # marshal copies plain JSON values exactly (floats bit for bit, dict order kept) at a third
    # of deepcopy's cost; it is never written anywhere, so its format's instability is moot.
    copied: Db = marshal.loads(marshal.dumps(original))
    return copied


def canonical_json(db: Db) -> str:
    """The text the DB hash is taken over: `json.dumps(db, sort_keys=True)`, default separators."""
    return json.dumps(db, sort_keys=True)


def hash_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def db_hash(db: Db) -> str:
    """The DB hash of TOOLS.md 1.5: equal iff the canonical states are equal."""
    return hash_text(canonical_json(db))
