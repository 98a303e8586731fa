"""A tau2-bench checkout's retail folder made from the repository's data, with a split of our choosing.

tau2-bench keeps every task in `tasks.json` and names each split's ids in `split_tasks.json`; its
checkout has no TOOLS.md. The repository holds the 74 train tasks only, so tests that need a
held-out split name some of them `test` here (the tasks themselves are unchanged).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

RETAIL = Path("data") / "tau2" / "domains" / "retail"


def make_checkout(data: Path, root: Path, test_ids: Sequence[str]) -> Path:
    """`root` as a tau2-bench checkout whose retail test split is `test_ids`; its retail folder."""
    retail = root / RETAIL
    retail.mkdir(parents=True)
    for name in ("db.json", "policy.md", "tasks.json"):
        (retail / name).write_bytes((data / name).read_bytes())
    ids = [str(task["id"]) for task in json.loads((data / "tasks.json").read_text(encoding="utf-8"))]
    test = [task_id for task_id in ids if task_id in set(test_ids)]
    train = [task_id for task_id in ids if task_id not in set(test_ids)]
    split = {"train": train, "test": test, "train+test": train + test}
    (retail / "split_tasks.json").write_text(json.dumps(split, indent=4), encoding="utf-8")
    return retail
