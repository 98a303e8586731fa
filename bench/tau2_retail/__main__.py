"""`python -m bench.tau2_retail [--db PATH] [--state-out PATH]`: the retail MCP server.

Serves the 16 tools over stdio on a fresh copy of the DB (default: `db.json` of the data folder,
`$TAU2_RETAIL_DATA` or the repository's `data/tau2-retail`). One process per task
run. With `--state-out`, the DB's hash and full canonical state are kept in that file (see
`server.py`), so a runner can score the run after the process ends.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import anyio

from bench.tau2_retail.db import DataNotFound, data_dir, load_db
from bench.tau2_retail.server import RetailServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tau2_retail", description=__doc__)
    parser.add_argument("--db", type=Path, help="the retail db.json (default: db.json of the data folder)")
    parser.add_argument("--state-out", type=Path, help="keep the DB hash and state in this JSON file")
    args = parser.parse_args(argv)
    try:
        db_path = args.db if args.db is not None else data_dir(os.environ) / "db.json"
        db = load_db(db_path)  # read from the file: this process's own fresh copy
    except DataNotFound as exc:
        print(f"tau2-retail: {exc}", file=sys.stderr)
        return 2
    anyio.run(RetailServer(db, args.state_out).serve_stdio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
