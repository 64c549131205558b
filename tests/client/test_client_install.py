"""`pip install ./claw_client` from the repository root installs the trainer-side package alone:
in a fresh virtual environment (no system site-packages), it brings numpy, httpx and msgspec
and nothing of the server, and every claw_client module imports there, except the
integration that needs an extra (verl's DataProto, which imports torch), with Django absent.

The package folder is copied to a scratch "repository root" first, so the build writes nothing
into the working tree and nothing outside claw_client/ is needed. pip uses the machine's
package index (and its cache); only when it reaches none is the test skipped, with the reason.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live import ROOT

# pip may have to fetch numpy, httpx and msgspec wheels and setuptools for the build.
pytestmark = [pytest.mark.timeout(900), pytest.mark.backend_independent]  # no server, no database

CLIENT = ROOT / "claw_client"
# Modules that import an extra's package at import time, with the extra that brings it (the
# Claw-R1 DataPool imports Ray and verl only when used, so it imports without them).
NEED_EXTRAS = {"claw_client.integrations.verl": "verl"}
CORE = {"numpy", "httpx", "msgspec"}


def modules() -> list[str]:
    return sorted(
        ".".join(("claw_client", *p.relative_to(CLIENT).with_suffix("").parts)).removesuffix(".__init__")
        for p in CLIENT.rglob("*.py")
        if "build" not in p.relative_to(CLIENT).parts
    )


def run(args: list, cwd: Path, timeout: float = 800) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_claw_client_installs_alone_and_imports_without_django(tmp_path: Path):
    # given a fresh venv without system site-packages, and a copy of the package at ./claw_client
    venv = tmp_path / "venv"
    made = run([sys.executable, "-m", "venv", venv], tmp_path, timeout=300)
    assert made.returncode == 0, made.stderr
    py = venv / "bin" / "python"
    assert run([py, "-c", "import sys; assert sys.prefix != sys.base_prefix"], tmp_path).returncode == 0
    repo = tmp_path / "repo"
    shutil.copytree(
        CLIENT, repo / "claw_client", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    # when `pip install ./claw_client` runs there, from the root
    out = run([py, "-m", "pip", "install", "-q", "./claw_client"], repo)
    if out.returncode != 0:
        probe = run([py, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp_path / "probe", "httpx"], repo)
        if probe.returncode != 0:
            pytest.skip(f"pip reaches no package index here: {probe.stderr.strip()[-300:]}")
    assert out.returncode == 0, out.stdout + out.stderr
    # then claw-client requires exactly the three core packages, and Django is not installed
    check = (
        "import importlib, importlib.metadata as md, importlib.util, json, re, sys\n"
        "requires = [r for r in md.requires('claw-client') if 'extra ==' not in r]\n"
        "names = sorted(re.split(r'[<>=!~ \\[;]', r)[0].lower() for r in requires)\n"
        "installed = sorted(d.metadata['Name'].lower() for d in md.distributions())\n"
        "absent = [m for m in ('django', 'rest_framework', 'torch', 'pool', 'gateway', 'curation', 'claw_kit',"
        " 'claw_site') if importlib.util.find_spec(m) is not None]\n"
        "imported, failed = [], {}\n"
        f"for m in {[m for m in modules() if m not in NEED_EXTRAS]!r}:\n"
        "    try:\n"
        "        importlib.import_module(m); imported.append(m)\n"
        "    except Exception as e:\n"
        "        failed[m] = repr(e)\n"
        "extras = {}\n"
        f"for m in {sorted(NEED_EXTRAS)!r}:\n"
        "    try:\n"
        "        importlib.import_module(m); extras[m] = 'imported'\n"
        "    except ModuleNotFoundError as e:\n"
        "        extras[m] = e.name\n"
        "import claw_client\n"
        "print(json.dumps({'requires': names, 'installed': installed, 'present': absent, 'imported': imported,"
        " 'failed': failed, 'extras': extras, 'file': claw_client.__file__}))\n"
    )
    got = run([py, "-c", check], tmp_path, timeout=300)
    assert got.returncode == 0, got.stderr
    import json

    result = json.loads(got.stdout.strip().splitlines()[-1])
    assert set(result["requires"]) == CORE, result["requires"]
    assert "django" not in result["installed"] and "djangorestframework" not in result["installed"]
    assert result["present"] == [], result["present"]
    # and every module imports from the installed package (not from the repository)
    assert result["failed"] == {}, result["failed"]
    assert set(result["imported"]) == set(modules()) - set(NEED_EXTRAS)
    assert str(venv) in result["file"], result["file"]
    # and the one left out needs its extra indeed: torch is not there
    assert result["extras"] == {"claw_client.integrations.verl": "torch"}, result["extras"]
