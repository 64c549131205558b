"""Snapshots carry the images of their steps (issue 24, part 4): the Parquet file holds the
bytes in an ``images`` column that Hugging Face ``datasets`` reads as its ``Image`` feature,
and the tar download holds the JSONL (with references) and a media/ folder, each image once.
Both are compared byte for byte with what was stored.

docs/trainers.md, Images for trainers: Snapshots hold the bytes: the Parquet file has an images
column that Hugging Face datasets loads as a sequence of its Image feature (PIL images), and a
snapshot with images also has a tar download (?format=tar): snapshot.jsonl, whose rows carry the
image references and each image's file, plus a media/ folder holding each image once."""

from __future__ import annotations

import io
import tarfile

import datasets
import orjson
import pyarrow.parquet as pq
import pytest
from PIL import Image

from curation.services.datasets import dataset_create
from curation.services.snapshots import snapshot_build
from pool.models import Scope
from tests.conftest import client_for
from tests.curation.test_consume import ready_group
from tests.media_support import attach, attach_url, png, sha

pytestmark = pytest.mark.django_db

A, B, C = png(1), png(2, (80, 50)), png(3)
REMOTE = "https://images.example/cat.png"


@pytest.fixture(autouse=True)
def media_root(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"


@pytest.fixture
def trainer(make_key):
    return client_for(make_key(Scope.CONSUME, name="trainer"))


@pytest.fixture
def with_images() -> dict[str, list[bytes]]:
    """4 steps of one group: the images each stores, in order (A re-sent in three steps)."""
    dataset_create(name="all")
    uids = ready_group("g1")
    wanted = {uids[0]: [A, B], uids[1]: [A, B, C], uids[2]: [A], uids[3]: []}
    for uid, images in wanted.items():
        attach(uid, images, first_token=0)
    attach_url(uids[3], REMOTE, 0)  # a remote image: referenced, never fetched
    return wanted


def snapshot(trainer) -> str:
    sid = trainer.post("/api/v1/snapshots", {"dataset": "all"}, format="json").json()["id"]
    snapshot_build(snapshot_id=sid)
    return sid


def download(trainer, sid: str, fmt: str) -> bytes:
    resp = trainer.get(f"/api/v1/snapshots/{sid}/download", {"format": fmt})
    assert resp.status_code == 200, resp.content
    return b"".join(resp.streaming_content)


def test_parquet_images_load_with_datasets_as_its_image_feature_byte_exact(trainer, with_images, tmp_path):
    # given a snapshot of steps with images
    sid = snapshot(trainer)
    path = tmp_path / "snapshot.parquet"
    path.write_bytes(download(trainer, sid, "parquet"))
    # when datasets loads the Parquet file
    ds = datasets.load_dataset("parquet", data_files=str(path), cache_dir=str(tmp_path / "hf"))["train"]
    # then the images column is a list of its Image feature, decoded to PIL images
    feature = ds.features["images"]
    inner = getattr(feature, "feature", None)
    assert isinstance(inner, datasets.Image), feature
    by_uid = {row["uid"]: row for row in ds}
    assert set(by_uid) == set(with_images)
    for uid, images in with_images.items():
        decoded = by_uid[uid]["images"]
        assert all(isinstance(i, Image.Image) for i in decoded), uid
        assert [i.size for i in decoded] == [Image.open(io.BytesIO(b)).size for b in images], uid
    # and undecoded, each image's bytes are the stored ones, in order (the remote one left out)
    raw = ds.cast_column("images", datasets.Sequence(datasets.Image(decode=False)))
    for row in raw:
        got = [(sha(i["bytes"]), i["path"]) for i in row["images"]]
        assert got == [(sha(b), f"{sha(b)}.png") for b in with_images[row["uid"]]], row["uid"]


def test_tar_download_holds_the_jsonl_and_each_image_once_byte_exact(trainer, with_images):
    # given a snapshot of steps with images (A in three steps, 7 stored references)
    sid = snapshot(trainer)
    # when the tar is downloaded
    tar = tarfile.open(fileobj=io.BytesIO(download(trainer, sid, "tar")))
    names = tar.getnames()
    # then it holds each image once, named by its sha256, byte-exact, and the JSONL
    files = {n: tar.extractfile(n).read() for n in names}
    unique = {sha(b): b for images in with_images.values() for b in images}
    assert sorted(names) == sorted([f"media/{h}.png" for h in unique] + ["snapshot.jsonl"])
    for h, data in unique.items():
        assert files[f"media/{h}.png"] == data
    # and the JSONL inside is the JSONL download, whose rows reference the images in order
    assert files["snapshot.jsonl"] == download(trainer, sid, "jsonl")
    rows = {r["uid"]: r for r in map(orjson.loads, files["snapshot.jsonl"].splitlines())}
    for uid, images in with_images.items():
        stored = [i for i in rows[uid]["images"] if i["kind"] == "stored"]
        assert [(i["sha256"], i["file"], i["media_type"], i["byte_size"]) for i in stored] == [
            (sha(b), f"media/{sha(b)}.png", "image/png", len(b)) for b in images
        ], uid
        assert [(i["width"], i["height"]) for i in stored] == [Image.open(io.BytesIO(b)).size for b in images]
        assert [i["token_start"] for i in stored] == [4 * n for n in range(len(images))]
    remote = [i for r in rows.values() for i in r["images"] if i["kind"] == "url"]
    assert [(i["url"], i["sha256"], i["file"]) for i in remote] == [(REMOTE, None, None)]
    # and the manifest counts unique images, references and bytes
    manifest = trainer.get(f"/api/v1/snapshots/{sid}").json()["manifest"]
    assert manifest["media"] == {
        "images": 3,
        "references": 6,
        "bytes": sum(len(b) for b in unique.values()),
    }


def test_parquet_schema_names_the_image_feature_for_datasets(trainer, with_images):
    # given a snapshot with images; when its Parquet schema is read
    sid = snapshot(trainer)
    schema = pq.read_schema(io.BytesIO(download(trainer, sid, "parquet")))
    # then its huggingface metadata names the images column's feature, and the type matches it
    features = datasets.Features.from_arrow_schema(schema)
    assert isinstance(features["images"].feature, datasets.Image)
    assert (
        schema.field("images").type
        == datasets.Features({"images": features["images"]}).arrow_schema.field("images").type
    )


def test_a_snapshot_without_images_has_no_tar_and_an_empty_images_column(trainer):
    # given steps without images
    dataset_create(name="all")
    ready_group("g1")
    # when snapshotted
    sid = snapshot(trainer)
    status = trainer.get(f"/api/v1/snapshots/{sid}").json()
    # then there is no tar, the manifest counts no image, and every row's images are empty
    assert status["formats"] == ["jsonl", "parquet"]
    assert status["manifest"]["media"] == {"images": 0, "references": 0, "bytes": 0}
    resp = trainer.get(f"/api/v1/snapshots/{sid}/download", {"format": "tar"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "format", resp.content
    rows = [orjson.loads(line) for line in download(trainer, sid, "jsonl").splitlines()]
    assert [r["images"] for r in rows] == [[]] * 4
    assert (
        pq.read_table(io.BytesIO(download(trainer, sid, "parquet"))).column("images").to_pylist() == [[]] * 4
    )
