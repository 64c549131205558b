"""verl gets a row's images (issue 24, part 4): ``to_dataproto`` of a pulled batch with images
carries each row's images in order as PIL images in ``non_tensor_batch["multi_modal_data"]``,
the way Claw-R1's VerlBackend and verl's agent loop read a step's multi_modal_data
(``images``; ``image`` too, for verl's dataset and vLLM), against a real server process.

docs/trainers.md, Images for trainers: The verl integration puts a row's images in the
DataProto's non_tensor_batch["multi_modal_data"] as {"images": [...], "image": [...]} (PIL
images; the first key is what Claw-R1's VerlBackend and verl's agent loop read, the second what
verl's RLHFDataset passes to vLLM)."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import pytest

pytest.importorskip("torch")
pytest.importorskip("ray")  # verl.protocol imports it
pytest.importorskip("verl")

from PIL import Image  # noqa: E402

from claw_client import ClawClient  # noqa: E402
from claw_client.integrations.verl import to_dataproto  # noqa: E402
from tests.live import LiveServer, live_server  # noqa: E402
from tests.media_support import png  # noqa: E402

pytestmark = pytest.mark.live

KEYS = """
from pool.services.api_keys import api_key_create
for name, scope in (("agent", "ingest"), ("trainer", "consume"), ("admin", "admin")):
    print(api_key_create(name=name, scopes=[scope])[1])
"""
A, B, C = png(41, (60, 40)), png(42, (32, 48)), png(43)
# trajectory -> the images of its one step, in order
SENT = {"v-r0": [A, B], "v-r1": [], "v-r2": [C, A, B]}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    with live_server(tmp_path_factory.mktemp("srv")) as srv:
        names = ("agent", "trainer", "admin")
        keys = dict(zip(names, srv.manage("shell", "-c", KEYS).strip().splitlines()[-3:], strict=True))
        with ClawClient(srv.url, keys["agent"]) as agent, ClawClient(srv.url, keys["admin"]) as admin:
            agent._json("POST", "/groups", json={"uid": "v", "expected_rollouts": len(SENT)})
            steps = [
                {
                    "trajectory_uid": traj,
                    "prompt_group_uid": "v",
                    "step_index": 0,
                    "prompt_ids": [1, 2, 3 + k],
                    "response_ids": [9, 10],
                    "reward": float(k),
                    "is_last": True,
                    "multi_modal_data": {"images": [base64.b64encode(b).decode() for b in images]},
                }
                for k, (traj, images) in enumerate(SENT.items())
            ]
            assert agent.submit_steps(steps)["created"] == len(steps)
            admin.create_dataset("vision")
        yield srv, keys


def decoded(data: bytes) -> tuple[tuple[int, int], bytes]:
    image = Image.open(io.BytesIO(data))
    return image.size, image.tobytes()


@pytest.mark.parametrize("fmt", ["steps", "padded"])
def test_a_pulled_batchs_images_reach_verl_as_multi_modal_data(server, tmp_path, fmt):
    srv, keys = server
    with ClawClient(srv.url, keys["trainer"], media_cache=tmp_path / "cache") as trainer:
        # given a pulled batch of three rollouts, two with images
        with trainer.pull("vision", consumer=f"verl-{fmt}", batch_size=1, format=fmt) as batch:
            # when it becomes a DataProto
            data = to_dataproto(batch)
        # then each row's multi_modal_data holds its images in order, decoded to the pixels sent
        trajs = list(data.non_tensor_batch["trajectory_uids"])
        assert sorted(trajs) == sorted(SENT)
        mmd = data.non_tensor_batch["multi_modal_data"]
        assert mmd.dtype == object and len(mmd) == len(trajs)
        for traj, entry in zip(trajs, mmd, strict=True):
            if not SENT[traj]:
                assert entry is None, traj
                continue
            assert set(entry) == {"images", "image"} and entry["image"] is entry["images"]
            assert all(isinstance(i, Image.Image) for i in entry["images"])
            assert [(i.size, i.tobytes()) for i in entry["images"]] == [decoded(b) for b in SENT[traj]], traj
        # and verl's own row selection keeps them with their rows
        r2 = trajs.index("v-r2")
        picked = data.select_idxs([r2])
        assert [i.tobytes() for i in picked.non_tensor_batch["multi_modal_data"][0]["images"]] == [
            decoded(b)[1] for b in SENT["v-r2"]
        ]


def test_rows_with_images_and_no_way_to_fetch_them_are_a_clear_error(server):
    srv, keys = server
    with ClawClient(srv.url, keys["trainer"]) as trainer:
        answer = trainer.pull("vision", consumer="verl-raw", batch_size=1)
        rows = answer.batch["steps"]
        answer.nack()
    # given the rows alone (no client to fetch with); when converted, then it says what to pass
    with pytest.raises(ValueError, match="media="):
        to_dataproto(rows)
