"""bench.media's workload is W-vision as shared/WORKLOADS.md describes it."""

from __future__ import annotations

import hashlib
import io

from PIL import Image

from bench.media import N_PAD, PAD, RESPONSE, bodies, w_vision


def test_w_vision_is_80_steps_73_unique_screenshots_and_216_references():
    # given / when: the workload of one seed
    batches, unique, refs = w_vision(seed=0, prefix="x")
    steps = [s for b in batches for s in b]
    # then: 8 rollouts x 10 turns, each turn's batch one step per rollout
    assert len(batches) == 10 and {len(b) for b in batches} == {8} and len(steps) == 80
    # 73 distinct 1280x800 PNGs of tens to a few hundred KB; 216 references
    assert len({hashlib.sha256(u).digest() for u in unique}) == len(unique) == 73
    assert refs == sum(len(s["images"]) for s in steps) == 216
    for u in unique[:3]:
        assert Image.open(io.BytesIO(u)).size == (1280, 800) and 10_000 < len(u) < 500_000
    # the rollouts share their first screenshot only; each prompt holds its last 3
    firsts = {hashlib.sha256(s["images"][0]).digest() for s in batches[0]}
    assert len(firsts) == 1
    for s in steps:
        assert len(s["images"]) == min(s["step_index"] + 1, 3)
        assert s["prompt_ids"].count(PAD) == N_PAD * len(s["images"]) and len(s["response_ids"]) == RESPONSE
    # and: the same steps are sent with and without their images
    with_images, without = (
        bodies(batches[:1], with_images=True, prefix=""),
        bodies(batches[:1], with_images=False, prefix="p-"),
    )
    assert b"multi_modal_data" in with_images[0] and b"multi_modal_data" not in without[0]
