"""The tau2-bench retail domain, rebuilt from its behavioural spec (`TOOLS.md` in the data folder).

A runner uses it like this, one task at a time:

1. Start the retail MCP server for the task: `server_command(state_out, db=...)`, or put it
   behind the proxy with `proxy_config(state_out, db=...)`. Each process works on its own fresh
   copy of `db.json` and keeps the DB hash in `state_out`.
2. Let the agent work; when it is done, `read_state(state_out).hash` is the end-state hash.
3. `score_task(task, load_db(folder / "db.json"), end_hash)` replays the gold actions on a fresh
   copy and compares hashes (`Score.reward`; see `scoring.py` for the other components).

`run_oracle(task, client)` replays the gold actions through a proxy client: every train task
scores 1 that way (the tests check it). The data is never downloaded: `data_dir(os.environ)`
finds it (`TAU2_RETAIL_DATA`, else the repository's own `data/tau2-retail`).
"""

from bench.tau2_retail.catalogue import TOOLS, call_tool
from bench.tau2_retail.db import DATA_ENV, Db, data_dir, db_hash, fresh_db, load_db
from bench.tau2_retail.oracle import OracleCall, proxy_config, run_oracle, server_command
from bench.tau2_retail.scoring import (
    Score,
    Task,
    agent_hash,
    communicate_reward,
    gold_db,
    gold_hash,
    load_tasks,
    score_task,
)
from bench.tau2_retail.server import EndState, RetailServer, read_state
from bench.tau2_retail.tools import ToolError

__all__ = [
    "DATA_ENV",
    "TOOLS",
    "Db",
    "EndState",
    "OracleCall",
    "RetailServer",
    "Score",
    "Task",
    "ToolError",
    "agent_hash",
    "call_tool",
    "communicate_reward",
    "data_dir",
    "db_hash",
    "fresh_db",
    "gold_db",
    "gold_hash",
    "load_db",
    "load_tasks",
    "proxy_config",
    "read_state",
    "run_oracle",
    "score_task",
    "server_command",
]
