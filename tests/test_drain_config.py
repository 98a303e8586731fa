"""`drain_s` in servers.yaml: seconds from 0 to 3600, or a config error that names its line and the fix.

A YAML slip (`true`, `'30'`) is not seconds, and `.inf` or a huge number would hold a replica's stop
for longer than any orchestrator waits: each is refused before anything starts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcp_spec_proxy.config.schema import load_config
from mcp_spec_proxy.errors import ConfigError


@pytest.mark.parametrize("value", ["true", ".inf", ".nan", "'30'", "1.0e+308", "-1", "3601", "[30]"])
def test_a_drain_s_that_is_not_seconds_from_0_to_3600_is_refused_at_its_line(tmp_path: Path, value: str) -> None:
    config = tmp_path / "servers.yaml"
    config.write_text(f"servers: {{}}\ndrain_s: {value}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(config, os.environ)
    message = str(refused.value)
    assert f"{config}:2: drain_s: must be a number of seconds from 0 to 3600" in message
    assert "terminationGracePeriodSeconds" in message


@pytest.mark.parametrize(("value", "seconds"), [("0", 0.0), ("30", 30.0), ("2.5", 2.5), ("3600", 3600.0)])
def test_a_drain_s_of_seconds_from_0_to_3600_is_taken(tmp_path: Path, value: str, seconds: float) -> None:
    config = tmp_path / "servers.yaml"
    config.write_text(f"servers: {{}}\ndrain_s: {value}\n")
    assert load_config(config, os.environ).drain_s == seconds
