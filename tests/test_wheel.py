"""The package as a user installs it: a wheel built from this tree, in a fresh virtual environment.

The wheel is built the way an index upload is (`python -m build`: an sdist first, the wheel from the
unpacked sdist) with the PEP 517 hooks of the build backend this environment has (no network: no
build isolation). It goes into a fresh venv with `pip install --no-index --find-links`, which
resolves its declared dependencies against this environment's (a folder of links to them, less this
checkout's own install), and its console script runs from a folder outside the repository, with no
PYTHONPATH: `--help`, `shipped-config`, `check` on the shipped servers.yaml, and serving a write
that waits on the approval console until it is approved there. One test: it is slow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path

import anyio
import httpx
import pytest
import yaml
from mcp import Client, StdioServerParameters
from mcp.client.stdio import get_default_environment

import mcp_spec_proxy
from tests.backends import PY_MODERN
from tests.harness import recorded, text_of, toy

pytestmark = pytest.mark.real_install

REPO = Path(__file__).resolve().parent.parent


def image_sources() -> list[str]:
    """What the Containerfile's build stage copies from the context (`COPY` without `--from`)."""
    lines = (REPO / "Containerfile").read_text(encoding="utf-8").splitlines()
    return [name for line in lines if line.startswith("COPY ") and "--from" not in line for name in line.split()[1:-1]]


# What the build reads, as the image build has it: the rest of the checkout (its venv, data) stays behind.
SOURCES = image_sources()
HOOK = "import sys; from setuptools import build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"
# Not carried into the fresh venv: this checkout's own install of the package (and .pth hooks).
OWN = ("mcp_spec_proxy", "__editable__", "_virtualenv", "__pycache__")


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def build_wheel(tmp: Path) -> Path:
    """sdist, then the wheel from the unpacked sdist (as `python -m build`): the wheel's path."""
    backend = version("setuptools")
    if int(backend.split(".")[0]) < 77:  # the pyproject's [build-system] floor
        pytest.fail(f"setuptools {backend} here; the build needs >=77: reinstall the test extra (scripts/test.sh does)")
    source, dist = tmp / "source", tmp / "dist"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name, follow_symlinks=False)
    sdist = dist / run([sys.executable, "-c", HOOK, "build_sdist", str(dist)], source).stdout.split()[-1]
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp / "unpacked", filter="data")
    (unpacked,) = (tmp / "unpacked").iterdir()
    return dist / run([sys.executable, "-c", HOOK, "build_wheel", str(dist)], unpacked).stdout.split()[-1]


def fresh_venv(tmp: Path, wheel: Path) -> Path:
    """A new venv with the wheel installed from `wheel`'s folder only: its bin folder."""
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp)
    python = venv / "bin" / "python"
    # The dependencies: links to what this environment has installed, where the new venv's pip finds them.
    deps = tmp / "deps"
    deps.mkdir()
    for folder in (Path(entry) for entry in sys.path if Path(entry).name == "site-packages"):
        for item in folder.iterdir() if folder.is_dir() else ():
            if not item.name.startswith(OWN) and item.suffix != ".pth" and not (deps / item.name).exists():
                (deps / item.name).symlink_to(item)
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp).stdout
    (Path(purelib.strip()) / "dependencies.pth").write_text(f"{deps}\n")
    quiet = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    install = [str(python), "-m", "pip", "install", "--no-index", "--find-links", str(wheel.parent), "mcp-spec-proxy"]
    run(install, tmp, quiet)
    return venv / "bin"


@pytest.mark.anyio
async def test_the_built_wheel_runs_in_a_fresh_venv_from_outside_the_repository(tmp_path: Path) -> None:
    wheel = await anyio.to_thread.run_sync(build_wheel, tmp_path)
    assert wheel.name == f"mcp_spec_proxy-{mcp_spec_proxy.__version__}-py3-none-any.whl"
    bin_dir = await anyio.to_thread.run_sync(fresh_venv, tmp_path, wheel)
    command = str(bin_dir / "mcp-spec-proxy")
    home = tmp_path / "elsewhere"
    home.mkdir()
    # The shipped config's servers: git and time as the `servers` extra would put them, fs through npx.
    path = os.pathsep.join([str(PY_MODERN / "bin"), get_default_environment()["PATH"]])
    env = {**get_default_environment(), "PATH": path, "XDG_STATE_HOME": str(tmp_path / "state")}
    assert "PYTHONPATH" not in env

    where = run([str(bin_dir / "python"), "-c", "import mcp_spec_proxy as m; print(m.__file__)"], home, env).stdout
    assert Path(where.strip()).is_relative_to(tmp_path / "venv")  # the installed copy, not this checkout
    assert "shipped-config" in run([command, "--help"], home, env).stdout
    assert run([command, "--version"], home, env).stdout.split()[-1] == mcp_spec_proxy.__version__

    shipped = run([command, "shipped-config"], home, env).stdout
    assert shipped == (REPO / "servers.yaml").read_text(encoding="utf-8")
    (home / "servers.yaml").write_text(shipped)
    checked = run([command, "check"], home, env)  # the default --config: ./servers.yaml
    assert "servers.yaml: ok (3 servers enabled)" in checked.stdout

    # Serving: the shipped review (a client that cannot ask: the console) in front of a toy ledger.
    ledger = tmp_path / "ledger"
    config = {"servers": {"toy": toy(ledger)}, "review": yaml.safe_load(shipped)["review"]}
    (home / "desk.yaml").write_text(yaml.safe_dump(config))
    state = ["--state-dir", str(tmp_path / "proxy-state")]
    params = StdioServerParameters(command=command, args=["--config", "desk.yaml", *state], env=env, cwd=home)
    result: list[str] = []
    with anyio.fail_after(120):
        async with Client(params) as client, anyio.create_task_group() as tg:

            async def call() -> None:
                answer = await client.call_tool("toy__record", {"value": "from the wheel", "intent": "note it"})
                result.append(("error: " if answer.is_error else "") + text_of(answer))

            tg.start_soon(call)
            printed = await anyio.to_thread.run_sync(run, [command, "console-url", *state], home, env)
            url = printed.stdout.strip()
            origin = url.split("/?", 1)[0]
            async with httpx.AsyncClient(base_url=origin, follow_redirects=True) as browser:
                page = await browser.get(url)
                assert page.status_code == 200 and "<html" in page.text.lower()
                async with browser.stream("GET", "/events") as events:
                    async for line in events.aiter_lines():
                        if line.startswith("data:") and (ids := json.loads(line[5:])["ids"]):
                            break
                card = (await browser.get(f"/pending/{ids[0]}")).text
                item = card.split('data-id="', 1)[1].split('"', 1)[0]
                digest = card.split('data-digest="', 1)[1].split('"', 1)[0]
                answer = await browser.post(
                    f"/decide/{item}",
                    content=json.dumps({"action": "approve", "digest": digest}),
                    headers={"origin": origin, "content-type": "application/json"},
                )
                assert answer.status_code == 200, answer.text
    assert result and not result[0].startswith("error"), result
    assert [json.loads(line)["value"] for line in recorded(ledger)] == ["from the wheel"]
