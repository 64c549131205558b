"""The demo traffic's screenshot agent (issue 24, part 6) through a real gateway and the demo
upstream: the unmodified openai SDK sends PNG screenshots as image_url data URLs, re-sending
the last ones every turn; the gateway stores each distinct screenshot once, and each image's
placeholder run in the upstream's prompt ids is recorded as its token span."""

from __future__ import annotations

import hashlib

import httpx
import openai
import pytest

from claw_client import ClawClient
from claw_site.demo import traffic
from claw_site.demo.toy_tokenizer import IMAGE_PAD, VISION_END, VISION_START
from claw_site.demo.upstream import DEMO_IMAGE_TOKENS
from tests.gateway.conftest import start_upstream
from tests.live import live_server, stop_process

pytestmark = pytest.mark.live

COUNTS = (
    "from pool.models import Media, StepMedia; "
    "print(Media.objects.count(), StepMedia.objects.count(), StepMedia.objects.filter(media__isnull=True).count())"
)


@pytest.fixture
def vlm_upstream():
    """The demo upstream as `manage.py serve` starts it: images as placeholder runs."""
    base, proc = start_upstream("--image-tokens", str(DEMO_IMAGE_TOKENS))
    try:
        yield base
    finally:
        stop_process(proc)


def test_the_screenshot_agent_stores_each_screenshot_once(vlm_upstream, tmp_path):
    with live_server(tmp_path, {"CLAW_UPSTREAM_URL": vlm_upstream}) as srv:
        agent_key, trainer_key = srv.make_key("ingest"), srv.make_key("consume")
        admin = srv.make_key("admin")
        # given the screenshot agent run to the end of one group, as the demo traffic runs it
        with (
            httpx.Client(timeout=30, headers={"Authorization": f"Bearer {agent_key}"}) as http,
            openai.OpenAI(base_url=f"{srv.url}/v1", api_key=agent_key, max_retries=0) as llm,
        ):
            outcomes = list(traffic._screenshot_group(srv.url, llm, http))
        assert outcomes and all(outcomes), outcomes
        # when a trainer pulls every step
        with ClawClient(srv.url, admin) as claw:
            claw.create_dataset("screens")
        with ClawClient(srv.url, trainer_key, media_cache=tmp_path / "cache") as trainer:
            with trainer.pull("screens", consumer="c", batch_size=64, unit="steps") as batch:
                rows = batch.steps
                fetched = {r["uid"]: trainer.media_bytes(r) for r in rows}
        # then each step carries its last 3 screenshots in order, byte-exact
        per_rollout = traffic.SCREEN_TURNS
        assert len(rows) == traffic.SCREEN_ROLLOUTS * per_rollout
        for row in rows:
            group, traj, turn = row["prompt_group_uid"], row["trajectory_uid"], row["step_index"]
            screens = [traffic.screenshot_png(group if t == 0 else f"{traj}:{t}") for t in range(turn + 1)]
            wanted = screens[-traffic.SCREENS_IN_PROMPT :]
            assert fetched[row["uid"]] == wanted, row["uid"]
            assert [i["sha256"] for i in row["images"]] == [hashlib.sha256(b).hexdigest() for b in wanted]
            # and each image's placeholder run in the prompt ids is its recorded span
            ids = list(row["prompt_ids"])
            for image in row["images"]:
                start, end = image["token_start"], image["token_end"]
                assert end - start == DEMO_IMAGE_TOKENS, image
                assert ids[start - 1 : end + 1] == [
                    VISION_START,
                    *[IMAGE_PAD] * DEMO_IMAGE_TOKENS,
                    VISION_END,
                ]
        # and each distinct screenshot is stored once: the group's shared first one, then
        # every rollout's own, however many prompts re-sent them
        unique = {hashlib.sha256(b).digest() for images in fetched.values() for b in images}
        references = sum(len(images) for images in fetched.values())
        assert len(unique) == 1 + traffic.SCREEN_ROLLOUTS * (per_rollout - 1)
        media, refs, remote = map(int, srv.manage("shell", "-c", COUNTS).split()[-3:])
        assert (media, refs, remote) == (len(unique), references, 0)
        assert references == traffic.SCREEN_ROLLOUTS * sum(
            min(t + 1, traffic.SCREENS_IN_PROMPT) for t in range(per_rollout)
        )
