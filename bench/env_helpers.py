"""bench.env_helpers: the settings' env helpers (claw_site/settings/base.py) vs environs and
django-environ, in one run.

    python -m bench.env_helpers [--starts 10]

Behaviour: each library reads the same probe values the way the settings use them (a bool
with default True, an int with default 3); a probe is right when it gives the expected
value, or, for a malformed value, an error whose message names the variable.

Start-up cost: the time to import each library in a fresh interpreter that has already set
Django up with the project's settings (what every process would add: uvicorn workers, Celery
workers, each manage.py command; the hand-written helpers add nothing), median of
``--starts`` alternated starts. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable

from tests.live import ROOT

VAR = "CLAW_BENCH_PROBE"
# (kind, raw value or None for unset, expected value, or "error" for an error naming VAR)
PROBES: list[tuple[str, str | None, object]] = [
    ("bool", None, True),
    ("bool", "", True),
    ("bool", "0", False),
    ("bool", "off", False),
    ("bool", "Yes", True),
    ("bool", " true ", True),
    ("bool", "ture", "error"),
    ("int", None, 3),
    ("int", "", 3),
    ("int", "12", 12),
    ("int", " 7 ", 7),
    ("int", "12k", "error"),
]


def readers() -> dict[str, dict[str, Callable[[], object]]]:
    from claw_site.settings.base import env_bool, env_int

    out = {"hand_written": {"bool": lambda: env_bool(VAR, True), "int": lambda: env_int(VAR, 3)}}
    try:
        import environs

        env = environs.Env()
        out["environs"] = {"bool": lambda: env.bool(VAR, True), "int": lambda: env.int(VAR, 3)}
    except ImportError:  # pragma: no cover - a dev dependency
        pass
    try:
        import environ

        e = environ.Env()
        out["django_environ"] = {
            "bool": lambda: e.bool(VAR, default=True),
            "int": lambda: e.int(VAR, default=3),
        }
    except ImportError:  # pragma: no cover - a dev dependency
        pass
    return out


def probe(read: dict[str, Callable[[], object]]) -> list[str]:
    """The probes ``read`` gets wrong, as 'kind=value -> got'."""
    wrong = []
    for kind, raw, expected in PROBES:
        if raw is None:
            os.environ.pop(VAR, None)
        else:
            os.environ[VAR] = raw
        try:
            got: object = read[kind]()
            ok = got == expected and type(got) is type(expected)
        except Exception as exc:  # noqa: BLE001 - any error counts if it names the variable
            ok = expected == "error" and VAR in str(exc)
            got = type(exc).__name__ + ("" if VAR in str(exc) else " (not naming the variable)")
        if not ok:
            wrong.append(f"{kind}={raw!r} -> {got}, expected {expected}")
    os.environ.pop(VAR, None)
    return wrong


def import_ms(module: str) -> float:
    """Wall time of ``import module`` in a fresh interpreter, after django.setup()."""
    code = (
        "import django, time; django.setup(); t = time.perf_counter(); "
        f"import {module}; print((time.perf_counter() - t) * 1000)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "claw_site.settings.local"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, capture_output=True)
    return float(out.stdout)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--starts", type=int, default=10)
    args = p.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "claw_site.settings.local")
    libs = readers()
    result: dict[str, object] = {"probes": len(PROBES)}
    for name, read in libs.items():
        wrong = probe(read)
        result[f"probes_right_{name}"] = len(PROBES) - len(wrong)
        result[f"probes_wrong_{name}"] = wrong
    modules = {"environs": "environs", "django_environ": "environ"}
    times: dict[str, list[float]] = {name: [] for name in libs if name in modules}
    for name in times:
        import_ms(modules[name])  # warm the file cache and the bytecode
    for _ in range(args.starts):
        for name in times:
            times[name].append(import_ms(modules[name]))
    for name, values in times.items():
        result[f"import_ms_{name}"] = round(statistics.median(values), 1)
    result["starts"] = args.starts
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
