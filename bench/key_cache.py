"""bench.key_cache: the API-key cache's hit path, the project's dict vs cachetools.TTLCache, in one run.

    python -m bench.key_cache [--lookups 1000000]

The gateway checks the cache on its event loop for every call (api_key_cached), while
request threads fill it (api_key_verify). The project's cache is a plain dict of
(expiry, verdict): a get and a compare, safe across threads because each dict operation is
atomic. cachetools.TTLCache is not thread-safe (its reads reorder an internal OrderedDict
and its timer keeps a shared nesting counter), so it is measured the way its documentation
asks for shared use: each access under a threading.Lock. 100 keys cached, lookups cycling
through them; blocks in the order dict, TTLCache, TTLCache, dict; process CPU time. Prints
one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import django
from cachetools import TTLCache

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "claw_site.settings.test")
django.setup()

from pool.services import api_keys  # noqa: E402 - needs the settings above
from pool.services.api_keys import VerifiedKey, api_key_cached  # noqa: E402

KEYS = [f"claw_{i:012x}_{'x' * 43}" for i in range(100)]
TTL = 60.0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lookups", type=int, default=1_000_000, help="per cache, split over its blocks")
    args = p.parse_args(argv)
    verdict = VerifiedKey(key_id=1, source_id=1, source_name="bench", scopes=frozenset({"ingest"}))
    for key in KEYS:
        api_keys._cache[key] = (time.monotonic() + TTL, verdict)
    ttl_cache: TTLCache = TTLCache(maxsize=10_000, ttl=TTL)
    lock = threading.Lock()
    for key in KEYS:
        ttl_cache[key] = verdict

    def ttl_cached(clear: str) -> object:
        with lock:
            return ttl_cache.get(clear, api_keys.MISS)

    lookups = {"dict": api_key_cached, "ttlcache_locked": ttl_cached}
    for name, lookup in lookups.items():
        assert all(lookup(k) is verdict for k in KEYS), name
        assert lookup("claw_unknown_key") is api_keys.MISS, name
    per_block = args.lookups // 2
    cpu = {name: 0.0 for name in lookups}
    for name in ("dict", "ttlcache_locked", "ttlcache_locked", "dict"):
        lookup = lookups[name]
        keys = KEYS * (per_block // len(KEYS))
        t0 = time.process_time()
        for k in keys:
            lookup(k)
        cpu[name] += time.process_time() - t0
    n = per_block // len(KEYS) * len(KEYS) * 2
    ns = {name: cpu[name] / n * 1e9 for name in lookups}
    print(
        json.dumps(
            {
                "ns_per_hit_dict": round(ns["dict"]),
                "ns_per_hit_ttlcache_locked": round(ns["ttlcache_locked"]),
                "ratio_ttlcache_over_dict": round(ns["ttlcache_locked"] / ns["dict"], 2),
                "lookups_per_cache": n,
                "workload": "hit lookups cycling over 100 cached keys, one thread",
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
