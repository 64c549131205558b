"""claw_client is for trainers: it must import and work without Django (or torch).

README: "claw_client (no Django dependency) builds the same tree trainer-side, turns it into a
boolean SDPA mask or a FlexAttention BlockMask, and recovers per-step response logprobs from
the packed logits; a test shows they match the flat per-step forward of a small transformer
to 1e-4 in fp32." (the Django part; the rest: tests/client/test_tree_attention.py)"""

import hashlib
import subprocess
import sys

import pytest

from tests.live import ROOT

pytestmark = pytest.mark.backend_independent  # the client package alone, no server


def test_claw_client_imports_without_django_or_torch():
    # given a fresh interpreter where importing django or torch fails
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('django', 'torch', 'rest_framework'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import numpy as np\n"
        "import claw_client\n"
        "tree = claw_client.build_prefix_tree([np.array([1, 2, 3, 4], dtype='<i4'), np.array([1, 2, 5], dtype='<i4')], [2, 2])\n"
        "assert tree.stats.unique_tokens == 5, tree.stats\n"
        "body = claw_client.encode_step_batch([{'trajectory_uid': 't', 'step_index': 0, 'prompt_ids': [1], 'response_ids': [2]}])\n"
        "assert isinstance(body, bytes)\n"
        "assert 'httpx' not in sys.modules  # the HTTP client is imported on first use\n"
        "assert claw_client.ClawClient.__name__ == 'ClawClient' and claw_client.steps_to_numpy\n"
        "print('ok')\n"
    )
    # when claw_client is imported and used there
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    # then it works
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


CLIENT = ROOT / "claw_client"


def _pyproject(path):
    import tomllib

    return tomllib.loads(path.read_text())


def test_every_claw_client_module_imports_with_django_unimportable():
    """claw_client/pyproject.toml: the package `pip install ./claw_client` installs alone."""
    # given every module of the package, and an interpreter where django cannot be imported
    modules = sorted(
        ".".join(("claw_client", *p.relative_to(CLIENT).with_suffix("").parts)).removesuffix(".__init__")
        for p in CLIENT.rglob("*.py")
        if "build" not in p.relative_to(CLIENT).parts
    )
    assert "claw_client.integrations.trl" in modules
    code = (
        "import importlib, sys\n"
        "for name in ('django', 'rest_framework', 'pool', 'gateway', 'curation', 'claw_kit', 'claw_site'):\n"
        "    sys.modules[name] = None\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "print(len([m for m in sys.modules if m.startswith('claw_client')]))\n"
    )
    # when each is imported there
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    # then all import
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) >= len(modules)


def test_the_client_package_lists_its_subpackages_and_the_server_has_its_dependencies():
    # given the two pyprojects
    client, server = _pyproject(CLIENT / "pyproject.toml"), _pyproject(ROOT / "pyproject.toml")
    # then claw-client installs every folder of claw_client that is a package
    folders = {
        ".".join(("claw_client", *p.parent.relative_to(CLIENT).parts))
        for p in CLIENT.rglob("__init__.py")
        if "build" not in p.relative_to(CLIENT).parts
    }
    assert client["project"]["name"] == "claw-client"
    assert set(client["tool"]["setuptools"]["packages"]) == folders
    # and the server's package ships claw_client with every core dependency of claw-client
    find = server["tool"]["setuptools"]["packages"]["find"]
    assert "claw_client*" in find["include"]
    assert "claw_client.build*" in find["exclude"]  # where `pip install ./claw_client` builds

    def names(reqs):
        return {r.split(">")[0].split("=")[0].split("[")[0].strip() for r in reqs}

    assert names(client["project"]["dependencies"]) == {"numpy", "httpx", "msgspec"}
    assert names(client["project"]["dependencies"]) <= names(server["project"]["dependencies"])
    # and no Django anywhere in claw-client, extras included
    extras = [r for reqs in client["project"]["optional-dependencies"].values() for r in reqs]
    assert not {"django", "djangorestframework"} & names(client["project"]["dependencies"] + extras)
    assert set(client["project"]["optional-dependencies"]) == {"torch", "verl", "trl", "images"}
    assert names(client["project"]["optional-dependencies"]["images"]) == {"Pillow"}  # ClawClient.images


def test_the_media_cache_works_without_pillow(tmp_path):
    # given a fresh interpreter where importing PIL (and django) fails
    code = (
        "import hashlib, sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('django', 'PIL'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import claw_client\n"
        f"cache = claw_client.MediaCache({str(tmp_path)!r})\n"
        "data = b'not an image, just bytes'\n"
        "h = hashlib.sha256(data).hexdigest()\n"
        "assert cache.get(h) is None\n"
        "cache.put(h, data)\n"
        "assert cache.get(h) == data\n"
        "print('ok')\n"
    )
    # when bytes are cached and read back by their sha256 there
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    # then it works, and the file is named by its hash
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    digest = hashlib.sha256(b"not an image, just bytes").hexdigest()
    assert [p.relative_to(tmp_path).parts for p in tmp_path.rglob("*") if p.is_file()] == [
        (digest[:2], digest)
    ]
