"""A tiny GRPO trainer on Claw-R1: pull tree batches, one packed forward, policy gradient, ack,
bump the policy version.

Each training step:

1. pulls one batch in the ``tree`` format through ``ClawClient.pull`` (a context manager:
   the lease is acked when the block ends normally, nacked if it raises);
2. runs ONE forward of a tiny randomly initialised causal transformer over the packed prefix
   tree (``position_ids`` = depth, the tree attention mask from ``subtree_end`` through
   ``claw_client.tree_attention_mask``) and gathers every step's response-token logprobs via
   ``response_index`` (the logit row at ``parent[q]`` predicts token ``q``);
3. computes GRPO advantages, ``(r - mean) / (std + eps)`` per ``prompt_group_uid`` (masked
   steps weigh 0), and the loss ``-mean(w * A * logprob)`` over the response tokens of
   unmasked steps, where ``w`` is the truncated importance ratio ``min(exp(lp -
   rollout_lp), cap)`` (detached) for steps that came with rollout logprobs, else 1;
4. takes an Adam step, leaves the ``with`` block (ack), then publishes version ``v + 1`` as
   a checkpoint of its training run (``Run.set_policy_version``): the server's curation
   uses the version for staleness/freshness, and the checkpoint records the leases acked
   since the previous one, so each version can be walked back to the steps that trained it.

The training is one run (``ClawClient.open_run``: its consumer, dataset, config and this
file's hash as the code version); ``--run`` continues a run by its uid (a trainer restarted).

Before training on a batch it checks it (``batch_check``): a step to train on (unmasked)
with a null reward would be trained on as reward 0, and one without rollout logprobs without
importance correction, silently. Such a batch is refused: the lease is nacked (the steps go
back to the pool) and ``main`` exits with status 2 and a message naming the steps, unless
``--allow-null-rewards`` / ``--allow-missing-logprobs`` accept them.

One JSON line per step is printed, with ``mean_reward`` (the mean reward of the batch's
steps trained on, as the advantages see them) and ``groups_with_variance`` (the fraction of
its groups whose rewards are not all equal: the others give GRPO no signal). No Django:
only ``claw_client``, numpy and torch.

Run from the repository root against a server, with a trainer's key: scopes ``consume`` (it
pulls) and ``policy`` (it publishes policy versions; a consume key alone may not), e.g.
``manage.py create_api_key --name grpo --scope consume --scope policy``::

    python -m examples.grpo_tiny --url http://127.0.0.1:8000 --key $CLAW_KEY \\
        --dataset grpo --consumer grpo-tiny --steps 3 --batch-size 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from claw_client import ClawClient, Run, token_logprobs, tree_attention_mask

VOCAB = 64  # token ids are taken modulo this: the model is tiny, the ids are not
RATIO_CAP = 2.0  # the truncated importance ratio's cap
MAX_POSITIONS = 1024  # positions (tree depths) are clamped to this


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, u, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, u, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # bool: True = may attend
        x = x + self.proj(a.transpose(1, 2).reshape(b, u, d))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """A 2-layer pre-norm causal transformer with learned positions. Causality comes entirely
    from the mask it is given (the tree mask is causal along every root-to-leaf path)."""

    def __init__(self, vocab: int = VOCAB, d: int = 32, layers: int = 2, heads: int = 2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(MAX_POSITIONS, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        x = self.tok(input_ids) + self.pos(position_ids.clamp(max=MAX_POSITIONS - 1))
        for blk in self.blocks:
            x = blk(x, mask)
        return self.head(self.ln(x))  # (1, U, V)


class BadBatch(Exception):
    """A pulled batch the trainer refuses to train on (raised inside the pull: nacked)."""


SHOWN_UIDS = 10  # step uids a refusal names (then "and N more")


def batch_check(
    tree: dict[str, Any], *, allow_null_rewards: bool = False, allow_missing_logprobs: bool = False
) -> None:
    """Raise BadBatch naming the steps to train on (unmasked) that have a null reward or no
    rollout logprobs, unless allowed. Masked steps are context only: never trained on."""
    trained = [i for i, m in enumerate(tree["mask"]) if not m]
    problems = []
    null = [tree["uid"][i] for i in trained if tree["reward"][i] is None]
    if null and not allow_null_rewards:
        problems.append(
            f"{len(null)} of the {len(trained)} steps to train on have a null reward ({_uids(null)}): "
            "they would be trained on as reward 0 (--allow-null-rewards accepts that)"
        )
    bare = [tree["uid"][i] for i in trained if not tree["has_rollout_logprobs"][i]]
    if bare and not allow_missing_logprobs:
        problems.append(
            f"{len(bare)} of the {len(trained)} steps to train on have no rollout logprobs ({_uids(bare)}): "
            "they would be trained on without importance correction (--allow-missing-logprobs accepts that)"
        )
    if problems:
        raise BadBatch("refused the batch; " + "; ".join(problems))


def _uids(uids: Sequence[str]) -> str:
    shown = ", ".join(uids[:SHOWN_UIDS])
    return shown + (f" and {len(uids) - SHOWN_UIDS} more" if len(uids) > SHOWN_UIDS else "")


def batch_rewards(tree: dict[str, Any]) -> dict[str, Any]:
    """The rewards of the steps trained on (unmasked), as the advantages see them (a null,
    when allowed, counts 0): their mean, how many were null, and the fraction of groups (a
    step without a group is a group of one) whose rewards are not all equal."""
    r = _rewards(tree["reward"])
    keep = ~np.asarray([bool(m) for m in tree["mask"]], dtype=bool)
    groups = _group_rows(tree["prompt_group_uid"], keep)
    varied = sum(1 for rows in groups if r[rows].max() > r[rows].min())
    return {
        "mean_reward": float(r[keep].mean()) if keep.any() else None,
        "null_rewards": sum(1 for x, k in zip(tree["reward"], keep, strict=True) if k and x is None),
        "groups_with_variance": varied / len(groups) if groups else None,
    }


def grpo_advantages(
    rewards: Sequence[float | None], groups: Sequence[str | None], masked: Sequence[bool], eps: float = 1e-6
) -> np.ndarray:
    """Per row ``(r - mean) / (std + eps)`` over the unmasked rows of its prompt group (a row
    without a group is its own group, advantage 0). Masked rows get 0; a null reward counts 0
    (``batch_check`` refuses such a batch unless allowed)."""
    r = _rewards(rewards)
    adv = np.zeros(len(r), dtype=np.float64)
    for rows in _group_rows(groups, ~np.asarray(masked, dtype=bool)):
        vals = r[rows]
        adv[rows] = (vals - vals.mean()) / (vals.std() + eps)
    return adv


def _rewards(rewards: Sequence[float | None]) -> np.ndarray:
    return np.array([0.0 if x is None else float(x) for x in rewards], dtype=np.float64)


def _group_rows(groups: Sequence[str | None], keep: np.ndarray) -> list[np.ndarray]:
    """The kept rows of each prompt group, in first-seen order (a row without a group is its
    own group); groups with no kept row are left out."""
    keys = [g if g is not None else f"\0row{i}" for i, g in enumerate(groups)]
    out = []
    for key in dict.fromkeys(keys):
        rows = np.array([i for i, k in enumerate(keys) if k == key and keep[i]], dtype=np.int64)
        if len(rows):
            out.append(rows)
    return out


def policy_loss(
    model: TinyLM, tree: dict[str, Any], ratio_cap: float = RATIO_CAP
) -> tuple[torch.Tensor, dict]:
    """The GRPO loss of one ``tree`` batch from one packed forward, and its stats."""
    ids = np.asarray(tree["input_ids"], dtype=np.int64) % VOCAB
    pos = np.asarray(tree["position_ids"], dtype=np.int64)
    parent = np.asarray(tree["parent"], dtype=np.int64)
    offsets = np.asarray(tree["response_offsets"], dtype=np.int64)
    index = np.asarray(tree["response_index"], dtype=np.int64)
    counts = np.diff(offsets)

    mask = tree_attention_mask(np.asarray(tree["subtree_end"], dtype=np.int64))  # (1, 1, U, U)
    logits = model(torch.from_numpy(ids)[None], torch.from_numpy(pos)[None], mask)
    # Step i's response tokens are index[offsets[i]:offsets[i+1]]: gather their logprobs (a
    # token shared by several steps is gathered once per step, from the same logit row).
    lp = token_logprobs(logits, SimpleNamespace(parent=parent, input_ids=ids), index)  # (S,)

    masked = [bool(m) for m in tree["mask"]]
    adv = grpo_advantages(tree["reward"], tree["prompt_group_uid"], masked)
    tok_adv = torch.from_numpy(np.repeat(adv, counts)).float()
    tok_keep = torch.from_numpy(np.repeat(~np.asarray(masked, dtype=bool), counts))
    has_old = torch.from_numpy(np.repeat(np.asarray(tree["has_rollout_logprobs"], dtype=bool), counts))
    old = torch.as_tensor(np.asarray(tree["rollout_logprobs"], dtype=np.float64)).float()
    # Root tokens have no context (NaN): a response never starts at a root, but be safe.
    valid = tok_keep & ~torch.isnan(lp)
    lp = torch.nan_to_num(lp)
    ratio = torch.where(has_old, torch.exp(lp.detach() - old).clamp(max=ratio_cap), torch.ones_like(lp))
    n = int(valid.sum())
    loss = -(ratio * tok_adv * lp * valid).sum() / max(n, 1)
    stats = {
        "response_tokens": n,
        "mean_logprob": float(lp.detach()[valid].mean()) if n else 0.0,
        **batch_rewards(tree),
    }
    return loss, stats


def train(
    client: ClawClient,
    dataset: str,
    consumer: str,
    steps: int,
    *,
    batch_size: int = 2,
    model: TinyLM | None = None,
    lr: float = 1e-2,
    policy_version: int | None = None,
    version_client: ClawClient | None = None,
    seed: int = 0,
    log: Callable[[str], Any] | None = print,
    allow_null_rewards: bool = False,
    allow_missing_logprobs: bool = False,
    rollout: Callable[[TinyLM, int], Any] | None = None,
    run: Run | str | None = None,
) -> list[dict[str, Any]]:
    """``steps`` GRPO steps on ``dataset`` as ``consumer``; one stats dict per step.

    They train within a training run: ``run`` (a Run, or a run's uid to continue it), else a
    new one (``open_run``: this consumer and dataset, the hyperparameters as its config,
    ``code_version()``). Each new policy version is a checkpoint of it; each stats dict
    names the run and how many leases its checkpoint took (``checkpoint_leases``).

    ``rollout(model, version)``, when given, runs before each pull: it rolls out the tasks to
    train on next with the current policy (``rollout_tasks``: the whole loop in one process).

    A pull that finds nothing ready ends training early (the stats list is then shorter).
    After each acked step the policy version becomes ``v + 1`` (``policy_version`` is the
    starting v, default 0), set through ``version_client`` (default ``client``). A batch
    ``batch_check`` refuses raises BadBatch, after the steps trained before it; its lease is
    nacked.
    """
    torch.manual_seed(seed)
    model = model if model is not None else TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    version = policy_version or 0
    if not isinstance(run, Run):
        config = {"lr": lr, "batch_size": batch_size, "seed": seed, "ratio_cap": RATIO_CAP}
        run = client.open_run(
            consumer=consumer,
            dataset=dataset,
            name="grpo_tiny",
            config=config,
            code_version=code_version(),
            uid=run,
            versions=version_client,
        )
    out: list[dict[str, Any]] = []
    for step in range(steps):
        if rollout is not None:
            rollout(model, version)
        with client.pull(dataset, consumer=consumer, batch_size=batch_size, format="tree") as batch:
            if not batch:
                break
            tree = batch.batch
            batch_check(
                tree, allow_null_rewards=allow_null_rewards, allow_missing_logprobs=allow_missing_logprobs
            )
            loss, extra = policy_loss(model, tree)
            if not math.isfinite(loss.item()):
                raise FloatingPointError(f"non-finite loss {float(loss)}")  # nacks the lease
            opt.zero_grad()
            loss.backward()
            opt.step()
            lease = batch.lease_id
        # acked: the policy that made these gradients is the next version, a checkpoint of
        # the run holding the leases acked since the previous one (this one, and any a
        # crashed process acked before it)
        version += 1
        published = run.set_policy_version(version)
        st = tree["stats"]
        row = {
            "step": step,
            "loss": loss.item(),
            "steps": len(tree["uid"]),
            "groups": len({g for g in tree["prompt_group_uid"] if g is not None}),
            "unique_tokens": st["unique_tokens"],
            "total_tokens": st["total_tokens"],
            "policy_version": version,
            "lease_id": lease,
            "run": run.uid,
            "checkpoint_leases": published["checkpoint"]["leases"],
            **extra,
        }
        out.append(row)
        if log is not None:
            log(json.dumps(row))
    return out


def code_version() -> str:
    """This trainer's code version: the sha256 of its source, shortened (a run records it)."""
    with open(__file__, "rb") as fh:
        return "grpo_tiny-" + hashlib.sha256(fh.read()).hexdigest()[:12]


# --- the rollout side: sample tasks, roll them out with the policy, reward them ----------------------
def rollout_tasks(
    claw: ClawClient,
    model: TinyLM,
    version: int,
    *,
    task_set: str,
    groups: int = 2,
    rollouts: int = 4,
    strategy: str = "informative",
    response_len: int = 4,
    rng: np.random.Generator | None = None,
) -> list[dict[str, Any]]:
    """One round of rollouts: ``sample_tasks`` picks ``groups`` tasks of ``task_set``; each is
    one prompt group (``task`` named, ``rollouts`` expected) of white-box rollouts sampled from
    ``model`` itself (so the rollout logprobs are exact), one step each, rewarded by the task's
    verifier: 1.0 when the first response token is the task's ``ground_truth`` (a token id,
    modulo VOCAB), else 0.0. Returns the sampled tasks. The tasks' statistics, and so the next
    sample, follow from the rewards (the pool keeps them)."""
    rng = rng if rng is not None else np.random.default_rng(version)
    picked = claw.sample_tasks(
        groups, strategy=strategy, tasks={"set": task_set}, seed=int(rng.integers(2**31))
    )
    steps = []
    for t in picked:
        prompt = [int(x) for x in (t["prompt"] or [])] or [1]
        group = f"{t['uid']}-v{version}-{rng.integers(2**31)}"
        claw.open_group(group, expected_rollouts=rollouts, task=t["uid"])
        for r in range(rollouts):
            response, logprobs = _sample(model, prompt, response_len, rng)
            reward = float(response[0] == int(t["ground_truth"]) % VOCAB)
            steps.append(
                {
                    "trajectory_uid": f"{group}-r{r}",
                    "prompt_group_uid": group,
                    "step_index": 0,
                    "prompt_ids": prompt,
                    "response_ids": response,
                    "rollout_logprobs": logprobs,
                    "reward": reward,
                    "is_last": True,
                    "policy_version": version,
                }
            )
    if steps:
        claw.submit_steps(steps)
    return picked


@torch.no_grad()
def _sample(
    model: TinyLM, prompt: list[int], n: int, rng: np.random.Generator
) -> tuple[list[int], list[float]]:
    """``n`` tokens sampled from the model after ``prompt`` (a plain causal mask), with their logprobs."""
    ids = [p % VOCAB for p in prompt]
    out, lps = [], []
    for _ in range(n):
        u = len(ids)
        mask = torch.ones(u, u, dtype=torch.bool).tril()[None, None]
        logits = model(torch.tensor([ids]), torch.arange(u)[None], mask)[0, -1]
        logp = torch.log_softmax(logits.double(), dim=-1).numpy()
        tok = int(rng.choice(VOCAB, p=np.exp(logp) / np.exp(logp).sum()))
        out.append(tok)
        lps.append(float(logp[tok]))
        ids.append(tok)
    return out, lps


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("CLAW_URL", "http://127.0.0.1:8000"))
    p.add_argument(
        "--key", default=os.environ.get("CLAW_API_KEY"), help="consume + policy key (env CLAW_API_KEY)"
    )
    p.add_argument("--version-key", default=None, help="key for policy versions (default: --key)")
    p.add_argument("--dataset", required=True)
    p.add_argument("--consumer", default="grpo-tiny")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=2, help="prompt groups per pull")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument(
        "--start-version",
        type=int,
        default=0,
        help="the current policy version (the server refuses a move back without an admin's force)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run", default=None, help="continue the training run of this uid (default: a new run)")
    p.add_argument(
        "--allow-null-rewards", action="store_true", help="train on steps with a null reward, as reward 0"
    )
    p.add_argument(
        "--allow-missing-logprobs",
        action="store_true",
        help="train on steps without rollout logprobs, without importance correction",
    )
    a = p.parse_args(argv)
    if not a.key:
        p.error("--key (or CLAW_API_KEY) is required")
    with ClawClient(a.url, a.key) as claw:
        vclient = ClawClient(a.url, a.version_key) if a.version_key else None
        try:
            train(
                claw,
                a.dataset,
                a.consumer,
                a.steps,
                batch_size=a.batch_size,
                lr=a.lr,
                policy_version=a.start_version,
                version_client=vclient,
                seed=a.seed,
                allow_null_rewards=a.allow_null_rewards,
                allow_missing_logprobs=a.allow_missing_logprobs,
                run=a.run,
            )
        except BadBatch as exc:
            print(f"grpo_tiny: {exc}", file=sys.stderr)
            return 2
        finally:
            if vclient is not None:
                vclient.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
