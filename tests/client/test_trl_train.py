"""TRL trains on Claw-R1's exports: docs/trainers.md's "TRL SFT" and "TRL DPO" snippets run verbatim
against a live server (tests/live.py), and one step of SFTTrainer and DPOTrainer runs on CPU
on each export (a pull turned into rows by claw_client.integrations.trl, and a snapshot's
sft / dpo file), with a tiny randomly initialised Qwen2 model and a tokenizer built in code.

Runs in CI's SQLite pass (DATABASE_URL unset), where TRL must be installed (`make test`
installs it): a missing trl fails there; the PostgreSQL pass skips it (the exports' content
is compared on both databases by tests/curation/test_trl_exports.py)."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from claw_client import ClawClient
from claw_client.integrations.trl import to_dpo_pairs, to_sft_rows
from tests.client.chat_rollouts import GROUPS, ROLLOUTS, steps
from tests.live import ROOT, LiveServer, live_server

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is downloaded: the model and tokenizer are built here

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        bool(os.environ.get("DATABASE_URL")), reason="TRL training runs in CI's SQLite pass (see the module)"
    ),
]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] or '' }}"
    "{% if m['tool_calls'] %}{% for c in m['tool_calls'] %} {{ c['function']['name'] }}{% endfor %}{% endif %}"
    " <|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def readme_block(heading: str) -> str:
    """The first ```python block under ``heading`` (before the next heading)."""
    text = (ROOT / "docs" / "trainers.md").read_text()
    section = text.split(f"\n{heading}\n", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block and not re.search(r"\n#{1,6} ", section[: block.start()]), f"no python block under {heading}"
    return block.group(1)


def tiny_model(path: Path) -> Path:
    """A randomly initialised 2-layer Qwen2 and a byte-level BPE tokenizer trained here on the
    rollouts' words, with a chat template, saved to ``path`` as a model folder (what ``MODEL``
    names in the snippets). Byte-level BPE is what Qwen2's tokenizer class loads as is."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    texts = [m["content"] or "" for _, _, convo in ROLLOUTS.values() for m in convo] + [
        "user assistant tool calc"
    ]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=320, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<|endoftext|>", eos_token="<|im_end|>")
    tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    # the folder's tokenizer (as the trainers load it) encodes every conversation as built
    loaded = AutoTokenizer.from_pretrained(path)
    for _, _, convo in ROLLOUTS.values():
        ids = tok.apply_chat_template(convo)["input_ids"]
        assert loaded.apply_chat_template(convo)["input_ids"] == ids and tok.unk_token_id not in ids
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[LiveServer, str, Path]]:
    """A live server holding what the agent sent (groups, steps; dataset "chat" admits it),
    a consume key, and the tiny model folder."""
    srv_dir = tmp_path_factory.mktemp("srv")
    with live_server(srv_dir) as srv:
        agent_key, admin_key = srv.make_key("ingest", name="agent"), srv.make_key("admin", name="admin")
        with ClawClient(srv.url, agent_key) as agent, ClawClient(srv.url, admin_key) as admin:
            for g in GROUPS:
                agent._request("POST", "/groups", json=g)
            assert agent.submit_steps(steps())["created"] == len(steps())
            admin.create_dataset("chat")
        model = tiny_model(tmp_path_factory.mktemp("model"))
        yield srv, srv.make_key("consume", "policy", name="trainer"), model


@pytest.fixture
def env(server, tmp_path, monkeypatch) -> ClawClient:
    """The snippets' environment (CLAW_URL, CLAW_KEY, DATASET, MODEL), run in a fresh folder."""
    srv, key, model = server
    for name, value in (("CLAW_URL", srv.url), ("CLAW_KEY", key), ("DATASET", "chat"), ("MODEL", str(model))):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    with ClawClient(srv.url, key) as claw:
        yield claw


def trained_once(trainer) -> None:
    """One optimiser step ran, with a finite loss."""
    assert trainer.state.global_step == 1
    losses = [h["train_loss"] for h in trainer.state.log_history if "train_loss" in h]
    assert len(losses) == 1 and math.isfinite(losses[0])


def convos(*trajectories: str) -> list[list[dict]]:
    return [ROLLOUTS[t][2] for t in trajectories]


def test_the_readme_sft_snippet_trains_on_a_pull(env):
    """docs/trainers.md "TRL SFT": pull, to_sft_rows, SFTTrainer; the lease is acked after training
    and the trained model published as a checkpoint of the run, holding it."""
    # when the docs' snippet runs as written
    ns: dict = {}
    exec(compile(readme_block("### TRL SFT"), "docs/trainers.md: TRL SFT", "exec"), ns)
    # then it trained one step on the best rollout of each group, as sent
    trained_once(ns["trainer"])
    greet = next(s["trajectory_uid"] for s in ns["batch"].batch["steps"] if s["prompt_group_uid"] == "greet")
    assert sorted((r["messages"] for r in ns["rows"]), key=repr) == sorted(
        convos("math-r0", greet, "solo"), key=repr
    )
    # and the lease was acked: consumer "sft" has nothing left
    assert not env.pull("chat", consumer="sft", batch_size=10)
    # and the run's checkpoint holds it
    (cp,) = env.run(ns["run"].uid).checkpoints()
    assert (cp["leases"], cp["steps"]) == (1, len(ns["batch"]))


def test_the_readme_dpo_snippet_trains_on_a_snapshot(env):
    """docs/trainers.md "TRL DPO": a snapshot with format dpo, downloaded, DPOTrainer."""
    ns: dict = {}
    exec(compile(readme_block("### TRL DPO"), "docs/trainers.md: TRL DPO", "exec"), ns)
    trained_once(ns["trainer"])
    # the pairs file: math-r0 against the two rollouts more than 0.5 below it
    pairs = [json.loads(line) for line in Path(ns["path"]).read_text().splitlines()]
    q, best = convos("math-r0")[0][:1], convos("math-r0")[0][1:]
    assert sorted(pairs, key=repr) == sorted(
        ({"prompt": q, "chosen": best, "rejected": c[1:]} for c in convos("math-r1", "math-r2")), key=repr
    )
    assert ns["snap"]["manifest"]["export"] == {
        "format": "dpo",
        "margin": 0.5,
        "rows": 2,
        "sha256": ns["snap"]["manifest"]["export"]["sha256"],
    }


@pytest.mark.parametrize("source", ["pull", "snapshot"])
@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_each_export_trains_one_step(env, server, tmp_path, kind, source):
    # given the rows of one export
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    if source == "pull":
        with env.pull("chat", consumer=f"{kind}-{source}", batch_size=10) as batch:
            rows = to_sft_rows(batch, min_reward=0.5) if kind == "sft" else to_dpo_pairs(batch, margin=0.0)
    else:
        opts = {"min_reward": 0.5} if kind == "sft" else {"margin": 0.0}
        snap = env.snapshot("chat", format=kind, **opts)
        path = env.download_snapshot(snap["id"], kind, str(tmp_path / "rows.jsonl"))
        rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert len(rows) == (4 if kind == "sft" else 2)
    # when one TRL step trains on them
    model = str(server[2])
    if kind == "sft":
        config = SFTConfig(output_dir=str(tmp_path / "out"), max_steps=1, bf16=False, report_to="none")
        trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows))
    else:
        config = DPOConfig(output_dir=str(tmp_path / "out"), max_steps=1, bf16=False, report_to="none")
        trainer = DPOTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows))
    trainer.train()
    # then it ran
    trained_once(trainer)


def test_a_run_of_sft_checkpoints_each_save_with_the_leases_acked_before(env, server, tmp_path):
    """claw_client.integrations.trl.checkpoint_callback: the rows of a pull acked before
    training; each save of SFTTrainer is a checkpoint of the run, the first holding the lease."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from claw_client.integrations.trl import checkpoint_callback

    run = env.open_run(consumer="sft-run", dataset="chat", name="sft", config={"max_steps": 2})
    with env.pull("chat", consumer="sft-run", batch_size=10) as batch:
        rows = to_sft_rows(batch, min_reward=0.5)
    start = max((v["version"] for v in env._json("GET", "/policy-versions")), default=0)
    config = SFTConfig(
        output_dir=str(tmp_path / "out"), max_steps=2, save_steps=1, bf16=False, report_to="none"
    )
    trainer = SFTTrainer(
        model=str(server[2]),
        args=config,
        train_dataset=Dataset.from_list(rows),
        callbacks=[checkpoint_callback(run, start=start)],
    )
    trainer.train()
    assert [(c["version"], c["leases"], c["steps"]) for c in run.checkpoints()] == [
        (start + 1, 1, len(batch)),
        (start + 2, 0, 0),
    ]
    assert run.step_uids(start + 1) == batch.manifest["step_uids"]
