"""CPU time of building the catalog as backends connect one after another.

    .venv/bin/python -m bench.catalog_build [--servers 50] [--tools 100] [--against REV]

At start-up each backend's listing enters the catalog when it connects, and the catalog is
rebuilt each time. This lists `--servers` synthetic servers of `--tools` tools each (half
read-only, each with a one-property schema) into a fresh `Catalog`, one after another, and prints
the process CPU time it took, median of 3. With `--against REV`, `mcp_spec_proxy/tools/catalog.py` as
of that git revision is loaded beside today's and timed in the same run, in rotation.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import mcp_types as types

import mcp_spec_proxy.tools.catalog as today
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.tools.fingerprints import FingerprintStore

REPO = Path(__file__).resolve().parent.parent


def listings(servers: int, tools: int) -> dict[str, list[types.Tool]]:
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    return {
        f"s{i}": [
            types.Tool(
                name=f"tool_{j}",
                description=f"Tool {j} of server {i}: does one thing to one item.",
                input_schema=schema,
                annotations=types.ToolAnnotations(read_only_hint=j % 2 == 0),
            )
            for j in range(tools)
        ]
        for i in range(servers)
    }


def build_seconds(module: ModuleType, config: ProxyConfig, lists: dict[str, list[types.Tool]]) -> float:
    catalog = module.Catalog(config, FingerprintStore(None))
    started = time.process_time()
    for server, listing in lists.items():
        catalog.set_tools(server, listing)
    spent = time.process_time() - started
    assert len(catalog.tools()) == sum(len(listing) for listing in lists.values())
    return spent


def catalog_at(revision: str, folder: Path) -> ModuleType:
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{revision}:mcp_spec_proxy/tools/catalog.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = folder / "catalog_then.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("catalog_then", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["catalog_then"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=50)
    parser.add_argument("--tools", type=int, default=100, help="tools per server")
    parser.add_argument("--against", metavar="REV", help="also time tools/catalog.py as of this git revision")
    args = parser.parse_args()
    config = ProxyConfig.model_validate({"servers": {f"s{i}": {"command": "x"} for i in range(args.servers)}})
    lists = listings(args.servers, args.tools)
    with tempfile.TemporaryDirectory() as folder:
        modules = {"today": today}
        if args.against:
            modules[args.against] = catalog_at(args.against, Path(folder))
        samples: dict[str, list[float]] = {name: [] for name in modules}
        for _ in range(3):
            for name, module in modules.items():
                samples[name].append(build_seconds(module, config, lists))
    print(f"{args.servers} servers x {args.tools} tools, listed one after another (CPU s, median of 3):")
    for name, found in samples.items():
        print(f"  {name}: {statistics.median(found):.2f}")
    if args.against:
        ratio = statistics.median(samples["today"]) / statistics.median(samples[args.against])
        print(f"  today / {args.against}: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
