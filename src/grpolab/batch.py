"""The data a training step passes along, with its shapes: Example (a prompt and its references),
Rollout (N = B*G sampled completions), GroupSlice (a micro-batch of whole groups on the device) and
Batch (what one step knows about its completions; each stage fills in its part).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class Example:
    """One task item.

    prompt: the user message shown to the model (the chat template is applied by the rollout).
    answer: the reference answer as a string (what a verifier compares against).
    meta:   task-specific data for verifiers (countdown numbers/target, code tests, tool spec...).
    id:     a stable identifier, for samples.jsonl.
    """

    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)
    id: str = ""


class Stop(str, Enum):
    """Why a completion or a trajectory ended; one set of reasons for every engine. A str, so that
    `stop == "answer"` holds and it is written to JSON as its value."""

    EOS = "eos"  # single-turn: the model wrote an end-of-sequence token
    LENGTH = "length"  # single-turn: max_new_tokens reached without EOS (truncated)
    ANSWER = "answer"  # multi-turn: a turn the environment closed (it gave no reply, or said done)
    MAX_TURNS = "max_turns"  # multi-turn: env.max_turns model turns
    BUDGET = "budget"  # multi-turn: a turn ran out of tokens (env.max_turn_tokens or env.max_model_tokens)
    ENV_TOKENS = "env_tokens"  # multi-turn: a reply would pass env.max_env_tokens

    __str__ = str.__str__
    __format__ = str.__format__

    @property
    def truncated(self) -> bool:
        """Whether the sample was cut by a limit rather than ended by the model or the environment."""
        return self in (Stop.LENGTH, Stop.BUDGET, Stop.ENV_TOKENS)


@dataclass
class Rollout:
    """A batch of N = B*G completions, grouped contiguously: [p0 s0..s(G-1), p1 s0.., ...]."""

    prompt_ids: torch.Tensor  # (N, P) left-padded
    prompt_mask: torch.Tensor  # (N, P) 1 = real token
    completion_ids: torch.Tensor  # (N, C) right-padded with pad_id
    completion_mask: torch.Tensor  # (N, C) float, 1 = generated token (EOS included)
    sample_logp: torch.Tensor  # (N, C) log-prob of each sampled token under the sampling distribution
    truncated: torch.Tensor  # (N,) bool: hit max_new_tokens without EOS
    texts: list[str]  # decoded completions (special tokens removed); multi-turn: the last model turn
    G: int
    env_mask: torch.Tensor | None = None  # (N, C) float, 1 = a token the environment inserted (multi-turn)
    conversations: list[list[dict]] | None = None  # multi-turn: the messages after the prompt, per row
    stops: list[str] | None = (
        None  # multi-turn: why each trajectory ended (Stop; grpolab.engine.native.turns.Trajectory.stop)
    )
    version: int = 0  # the policy version that sampled it: optimizer steps taken when its weights were synced

    @property
    def lengths(self) -> torch.Tensor:
        """(N,) tokens the model wrote: environment tokens are not the model's and are not counted."""
        return self.completion_mask.sum(-1)  # (N,)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(N, C) 1 where a token is present (the model's or the environment's): what the passes attend to.
        completion_mask, the model's tokens only, is what every algorithm reads (loss, KL, entropy,
        lengths, advantages): an environment token is context, never a sample."""
        if self.env_mask is None:
            return self.completion_mask
        return self.completion_mask + self.env_mask

    def select(self, idx: torch.Tensor) -> Rollout:
        """Rows `idx` (used by dynamic sampling to keep whole groups)."""
        il = idx.tolist()
        return Rollout(
            self.prompt_ids[idx],
            self.prompt_mask[idx],
            self.completion_ids[idx],
            self.completion_mask[idx],
            self.sample_logp[idx],
            self.truncated[idx],
            [self.texts[i] for i in il],
            self.G,
            None if self.env_mask is None else self.env_mask[idx],
            None if self.conversations is None else [self.conversations[i] for i in il],
            None if self.stops is None else [self.stops[i] for i in il],
            self.version,
        )


def _pad_id_of(parts: list[Rollout]) -> int:
    """The padding id the rollouts already use: the id at any masked-out position (0 if there is none)."""
    for r in parts:
        for ids, mask in ((r.completion_ids, r.completion_mask), (r.prompt_ids, r.prompt_mask)):
            pad = ids[mask == 0]
            if pad.numel():
                return int(pad[0])
    return 0


def concat_rollouts(parts: list[Rollout], pad_id: int | None = None) -> Rollout:
    """Stack rollouts (padding prompts on the left and completions on the right to a common width).

    pad_id: the id written into new padding; by default the one the rollouts already pad with.
    """
    P = max(r.prompt_ids.shape[1] for r in parts)
    C = max(r.completion_ids.shape[1] for r in parts)

    def lpad(x, w, v):
        return F.pad(x, (w - x.shape[1], 0), value=v)

    def rpad(x, w, v):
        return F.pad(x, (0, w - x.shape[1]), value=v)

    if pad_id is None:
        pad_id = _pad_id_of(parts)
    return Rollout(
        torch.cat([lpad(r.prompt_ids, P, pad_id) for r in parts]),
        torch.cat([lpad(r.prompt_mask, P, 0) for r in parts]),
        torch.cat([rpad(r.completion_ids, C, pad_id) for r in parts]),
        torch.cat([rpad(r.completion_mask, C, 0) for r in parts]),
        torch.cat([rpad(r.sample_logp, C, 0) for r in parts]),
        torch.cat([r.truncated for r in parts]),
        [t for r in parts for t in r.texts],
        parts[0].G,
        None
        if all(r.env_mask is None for r in parts)
        else torch.cat(
            [rpad(r.env_mask if r.env_mask is not None else torch.zeros_like(r.completion_mask), C, 0) for r in parts]
        ),
        None
        if all(r.conversations is None for r in parts)
        else [c for r in parts for c in (r.conversations or [[] for _ in r.texts])],
        None if all(r.stops is None for r in parts) else [s for r in parts for s in (r.stops or ["" for _ in r.texts])],
        min(r.version for r in parts),
    )


@dataclass
class GroupSlice:
    """Whole groups of a rollout, trimmed, on the compute device."""

    rows: Tensor  # (b,) row indices into the rollout, b = groups * G, grouped contiguously
    prompt_ids: Tensor  # (b/G, P') one left-padded prompt per group
    prompt_mask: Tensor  # (b/G, P')
    completion_ids: Tensor  # (b, C') right-padded
    completion_mask: Tensor  # (b, C') float, the model's tokens
    G: int
    attention_mask: Tensor | None = None  # (b, C') tokens present (model + environment); None: completion_mask

    @property
    def present(self) -> Tensor:
        """(b, C') 1 where a token is present: what a forward pass attends to."""
        return self.completion_mask if self.attention_mask is None else self.attention_mask

    @property
    def width(self) -> int:
        """C', the completion columns this slice kept."""
        return self.completion_ids.shape[1]

    def full_sequences(self) -> tuple[Tensor, Tensor]:
        """Prompt + completion ids and mask per sequence, (b, P' + C') each (a critic reads whole sequences)."""
        return (
            torch.cat([self.prompt_ids.repeat_interleave(self.G, 0), self.completion_ids], 1),
            torch.cat([self.prompt_mask.repeat_interleave(self.G, 0), self.present.long()], 1),
        )


@dataclass
class Batch:
    """What one step knows about its completions; each stage fills in its part."""

    examples: list[Example]  # B' prompts (collect)
    rollout: Rollout | None  # N = B' * G completions, None when no group was kept (collect)
    raw_reward: Tensor  # (N,) the verifiers' weighted total (collect)
    reward_by_fn: dict[str, list[float]]  # name -> N scores of each verifier (collect)
    metrics: dict[str, float] = field(default_factory=dict)  # what the stages measured
    ref_logp: Tensor | None = None  # (N, C) log pi_ref, with a reference (reference)
    reward: Tensor | None = None  # (N,) shaped sequence reward (shape)
    token_reward: Tensor | None = None  # (N, C) shaped per-token reward, for a critic (shape)
    adv: Tensor | None = None  # (N,) sequence or (N, C) token advantages (advantages)
    old_values: Tensor | None = None  # (N, C) V before the update, with a critic (advantages)
    returns: Tensor | None = None  # (N, C) value targets, with a critic (advantages)
    old_logp: Tensor | None = None  # (N, C) log pi_old of each token, before the update (update)
    last_logp: Tensor | None = None  # (N, C) log pi_theta in the last epoch's pass: ratio = exp(last - old)
    entropy: Tensor | None = None  # (N, C) policy entropy at each completion position (update)
    extra: dict[str, list] = field(default_factory=dict)  # column -> N values reward functions logged (log_extra)
    first_errors: dict[str, str] = field(default_factory=dict)  # reward name -> its first failure this step

    @property
    def empty(self) -> bool:
        return self.rollout is None

    @property
    def n_tokens(self) -> int:
        """Valid completion tokens of the batch: the token normaliser of the whole optimizer batch."""
        return int(self.rollout.completion_mask.sum())

    def keep_groups(self, keep: Tensor) -> Batch:
        """The groups where keep (B',) is True, as a new Batch (None rollout when none is)."""
        G = self.rollout.G
        rows = keep.repeat_interleave(G).nonzero().squeeze(-1)  # (N',)
        if len(rows) == 0:
            return Batch([], None, self.raw_reward[:0], {k: [] for k in self.reward_by_fn})
        picked = rows.tolist()
        return Batch(
            [e for e, k in zip(self.examples, keep.tolist()) if k],
            self.rollout.select(rows),
            self.raw_reward[rows],
            {k: [v[i] for i in picked] for k, v in self.reward_by_fn.items()},
            extra={k: [v[i] for i in picked] for k, v in self.extra.items()},
        )
