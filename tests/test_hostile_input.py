"""Hostile input at every door (tests/hostile/cases.py): deep nesting, NaN and Infinity, NUL
and control characters in identifiers and text, MessagePack bin/ext values, containers over
the size limits. Each is a JSON 4xx in the door's own error shape, writes nothing, and never
reaches the upstream; the doors' valid bodies, sent the same way, go through (so what is
refused is the hostile part).

One live server (the project's ASGI app, the gateway's lean handler included) forwarding to
the recording upstream (tests/fidelity/recording_upstream.py), which logs every completion
request it receives: "never called" is its log not growing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from tests.fidelity import recording_upstream
from tests.hostile.cases import CASES, PROXY_DOORS, Case
from tests.live import LiveServer, live_server, stop_process

pytestmark = pytest.mark.live

COUNTED = ("steps", "trajectories", "groups", "events", "feedback")
LISTED = ("runs", "datasets")  # counted by their list (GET /api/v1/<name>)


@dataclass
class Site:
    server: LiveServer
    key: str
    record: Path
    http: httpx.Client

    def counts(self) -> dict[str, int]:
        r = self.http.get("/api/v1/stats")
        r.raise_for_status()
        stats = r.json()
        versions = self.http.get("/api/v1/policy-versions").json()
        listed = {}
        for name in LISTED:
            page = self.http.get(f"/api/v1/{name}" + ("?page_size=1000" if name == "runs" else "")).json()
            listed[name] = len(page if isinstance(page, list) else page["results"])
        return {
            **{k: stats[k] for k in COUNTED},
            **listed,
            "policy_versions": len(versions if isinstance(versions, list) else versions["results"]),
        }

    def upstream_calls(self) -> int:
        return len(recording_upstream.recorded(self.record))

    def send(self, case: Case) -> httpx.Response:
        headers = {"Content-Type": case.content_type}
        if not case.path.startswith("/compat/claw-r1/k/"):
            headers["Authorization"] = f"Bearer {self.key}"
        headers.update({k: v.format(key=self.key) for k, v in case.headers.items()})
        # The path goes as written (percent escapes included): httpx would not re-quote it.
        url = httpx.URL(self.server.url + case.path.format(key=self.key))
        if case.method == "GET":
            return self.http.get(url, headers=headers)
        return self.http.post(url, content=case.body, headers=headers)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[Site]:
    var = tmp_path_factory.mktemp("hostile")
    record = var / "upstream.jsonl"
    upstream, proc = recording_upstream.start(record)
    try:
        # the corpus sends hundreds of requests with one key: its rate limit is not under test here
        with live_server(var, {"CLAW_UPSTREAM_URL": upstream, "CLAW_RATE_LIMIT_PER_SECOND": "0"}) as server:
            key = server.make_key("admin")
            with httpx.Client(
                base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=60
            ) as http:
                seed = {
                    "trajectory_uid": "hostile-seed",
                    "step_index": 0,
                    "prompt_ids": [1],
                    "response_ids": [2],
                }
                http.post("/api/v1/steps", json={"steps": [seed]}).raise_for_status()
                http.post("/api/v1/datasets", json={"name": "hostile-ds"}).raise_for_status()
                yield Site(server, key, record, http)
    finally:
        stop_process(proc)


def test_the_corpus_covers_every_door_with_at_least_120_cases():
    assert len(CASES) >= 120
    assert len({c.id for c in CASES}) == len(CASES)
    paths = {c.path for c in CASES}
    for needed in (
        "/api/v1/steps",
        "/api/v1/trajectories",
        "/api/v1/groups",
        "/api/v1/rewards",
        "/api/v1/events",
        "/api/v1/feedback",
        "/api/v1/policy-versions",
        "/api/v1/runs",
        "/api/v1/datasets",
        "/api/v1/labels",
        *(door[2] for door in PROXY_DOORS),
        *(
            f"/compat/claw-r1/k/{{key}}/{e}"
            for e in ("submit_steps", "init_trajectory", "register_trajectory", "generate", "compute_reward")
        ),
    ):
        assert needed in paths, needed
    assert any(c.content_type == "application/msgpack" for c in CASES)
    assert any(c.path.startswith("/t/") for c in CASES)
    assert any(c.method == "GET" and "/diff?" in c.path for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_a_json_4xx_in_the_doors_shape_and_touches_nothing(site, case):
    # given the pool's counts and the upstream's log
    before, calls = site.counts(), site.upstream_calls()
    # when the hostile request is sent
    resp = site.send(case)
    # then a 4xx JSON error in the door's shape ...
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.content[:300])
    assert resp.headers["content-type"].startswith("application/json"), resp.content[:200]
    body = orjson.loads(resp.content)
    if case.door == "anthropic":
        assert body["type"] == "error"
        assert set(body["error"]) == {"type", "message"}
    else:
        assert set(body["error"]) == {"type", "code", "message", "param"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    # ... no header echoing the hostile input, nothing written, and no upstream call
    assert "\n" not in resp.headers.get("x-claw-trajectory", "")
    assert site.counts() == before
    assert site.upstream_calls() == calls


@pytest.mark.parametrize(
    ("name", "shape", "path", "body", "tooled"), PROXY_DOORS, ids=[d[0] for d in PROXY_DOORS]
)
def test_the_doors_valid_bodies_go_through(site, name, shape, path, body, tooled):
    # given the same doors and bodies without their hostile part
    calls = site.upstream_calls()
    # when the valid body (with a tool) is sent
    resp = site.send(Case(name, shape, path, orjson.dumps(tooled)))
    # then it is answered, and (but for count_tokens, answered locally) went upstream
    assert resp.status_code == 200, resp.content[:300]
    assert site.upstream_calls() == calls + (name != "count_tokens")


# --- the limits' edges (in process: the body reader and the step decoder) ------------------------
EDGES = [
    # (id, body, accepted)
    ("64 levels", b'{"a":' * 64 + b"1" + b"}" * 64, True),  # 64 objects, one in the other
    ("65 levels", b'{"a":' * 65 + b"1" + b"}" * 65, False),
    ("10,000 keys", orjson.dumps({f"k{i}": 0 for i in range(10_000)}), True),
    ("10,001 keys", orjson.dumps({f"k{i}": 0 for i in range(10_001)}), False),
    ("1,000,000 items", b'{"a":[' + b"0," * 999_999 + b"0]}", True),
    ("1,000,001 items", b'{"a":[' + b"0," * 1_000_000 + b"0]}", False),
]


@pytest.mark.parametrize(("case", "raw", "accepted"), EDGES, ids=[e[0] for e in EDGES])
def test_the_body_reader_takes_the_limits_and_refuses_one_more(case, raw, accepted):
    from claw_kit.web.body import BodyError, json_object

    # when a body at (or one past) a limit is read, then it is parsed (or a 400 naming it)
    if accepted:
        assert json_object(raw) == orjson.loads(raw)
    else:
        with pytest.raises(BodyError) as caught:
            json_object(raw)
        assert caught.value.status == 400 and caught.value.code == "invalid_json"


# A step's metadata object is the body's level 4: 61 objects nested there make 64 levels.
STEP_DEPTHS = [(61, True), (62, False)]


@pytest.mark.parametrize(
    ("levels", "accepted"), STEP_DEPTHS, ids=[f"metadata {n} levels" for n, _ in STEP_DEPTHS]
)
def test_a_steps_metadata_counts_its_depth_from_the_body(levels, accepted):
    from gateway.validation import parse_step_batch_json
    from pool.errors import InvalidInput

    meta = b'{"a":' * levels + b"1" + b"}" * levels
    raw = (
        b'{"steps":[{"trajectory_uid":"t","step_index":0,"prompt_ids":[1],"response_ids":[2],"metadata":'
        + meta
        + b"}]}"
    )
    # when the batch is decoded, then it passes with 64 levels in all and fails with 65
    if accepted:
        assert len(parse_step_batch_json(raw)) == 1
    else:
        with pytest.raises(InvalidInput) as caught:
            parse_step_batch_json(raw)
        assert caught.value.field.startswith("steps[0].metadata")


def test_the_documented_limits_are_the_settings(settings):
    import re

    from tests.live import ROOT

    doc = (Path(ROOT) / "docs" / "configuration.md").read_text()
    limits = doc.split("### Limits", 1)[1].split("\n## ", 1)[0]
    for name in (
        "CLAW_MAX_BODY_BYTES",
        "CLAW_MAX_JSON_DEPTH",
        "CLAW_MAX_JSON_KEYS",
        "CLAW_MAX_JSON_ITEMS",
        "CLAW_MAX_STEPS_PER_BATCH",
        "CLAW_MAX_TOKENS_PER_STEP",
        "CLAW_MAX_PROMPT_CHARS",
    ):
        stated = re.search(rf"`{name}`\s*=\s*([\d,]+)", limits)
        assert stated is not None, name
        assert int(stated.group(1).replace(",", "")) == getattr(settings, name), name
