"""Multi-turn generation: G trajectories per prompt, the model's turns interleaved with what an
environment adds, decoded together on one KV cache.

    prefill each prompt once, repeat its cache G times
    while some trajectory goes on:
        decode one turn for every live row (a row that ended its turn waits as a hole in the cache)
        respond(rows, turns) -> the environment's tokens for each row, or None: the trajectory ends
        rows that ended leave the batch; the others get [EOS] + their environment tokens appended to
        their own cache rows (left-padded, one prefill-style pass): nothing is recomputed

The model's tokens are the ids it sampled, with the log-prob of each under the sampling distribution;
environment tokens are whatever `respond` returns (grpolab.training.agents renders them with the chat
template) and are marked in `env_mask`: no algorithm ever reads them as the model's (grpolab.batch).
This module knows nothing of tools or environments: `respond` is a plain function.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from grpolab.batch import Rollout
from grpolab.model.cache import left_pad, positions
from grpolab.model.generate import HFStepper, stepper_for
from grpolab.model.sampling import sample_token


@dataclass
class Trajectory:
    """One row's token stream after its prompt, in order."""

    ids: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)  # 0.0 at environment tokens
    model: list[bool] = field(default_factory=list)  # True: the model sampled it
    turns: list[list[int]] = field(default_factory=list)  # the model's ids of each turn
    stop: str = ""  # why it ended: "answer" (a turn the environment closed), "max_turns", "budget", "env_tokens"

    def add(self, ids: list[int], logp: list[float] | None, model: bool) -> None:
        self.ids += ids
        self.logp += logp if logp is not None else [0.0] * len(ids)
        self.model += [model] * len(ids)


Respond = Callable[[list[int], list[list[int]], list[bool]], list["list[int] | None"]]
"""respond(rows, turn_ids, ended_with_eos) -> per row: the environment's token ids to append (the next
assistant header included), or None when that trajectory ends. Rows index the N trajectories."""


@torch.no_grad()
def generate_turns(model, tokenizer, prompt_ids: list[list[int]], respond: Respond, *, G: int, max_turn_tokens: int,
                   max_model_tokens: int, max_env_tokens: int, max_turns: int, temperature: float = 1.0,
                   top_p: float = 1.0, greedy: bool = False, autocast_dtype: torch.dtype | None = None,
                   generator: torch.Generator | None = None, eos_ids: set[int] | None = None,
                   lean: bool = True) -> tuple[Rollout, list[Trajectory]]:
    """Sample G multi-turn trajectories per prompt (token ids, chat-templated).

    max_turn_tokens: the most tokens one model turn may write; max_model_tokens: the trajectory's budget,
    every model token of every turn; max_env_tokens: the most environment tokens one trajectory may receive;
    max_turns: the most model turns. A turn that reaches a limit without EOS ends its trajectory
    (truncated); so does a reply that would pass max_env_tokens."""
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = torch.tensor(sorted(eos_ids if eos_ids is not None else {tokenizer.eos_token_id}), dtype=torch.long,
                       device=device)
    ids, mask = left_pad(prompt_ids, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    # cache slots: each turn takes max_turn_tokens (a row that ended its turn early waits as holes), and
    # each reply, left-padded to the batch's longest, at most max_env_tokens plus the turn's EOS
    capacity = max_turns * (max_turn_tokens + max_env_tokens + 1)
    was_training = model.training
    model.eval()
    try:
        stepper = stepper_for(model, autocast_dtype or next(model.parameters()).dtype, capacity, lean)
        hf = isinstance(stepper, HFStepper)
        amp = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype and hf else contextlib.nullcontext()
        with amp:
            trajs = _decode_turns(stepper, ids, mask, G, respond, max_turn_tokens, max_model_tokens, max_env_tokens,
                                  max_turns, temperature, top_p, greedy, generator, eos, pad_id)
    finally:
        model.train(was_training)
    return _as_rollout(trajs, tokenizer, ids, mask, G, pad_id), trajs


def _decode_turns(stepper, ids, mask, G, respond, max_turn_tokens, max_model_tokens, max_env_tokens, max_turns,
                  temperature, top_p, greedy, generator, eos, pad_id) -> list[Trajectory]:
    device = ids.device
    N = ids.shape[0] * G
    logits = stepper.prefill(ids, mask, positions(mask))  # (B, V)
    if G > 1:
        stepper.repeat(G)
        logits = logits.repeat_interleave(G, 0)  # (N, V)
    pos = positions(mask.repeat_interleave(G, 0))[:, -1]  # (N,) position of each row's last token
    trajs = [Trajectory() for _ in range(N)]
    rows = torch.arange(N, device=device)  # trajectory of each cache row
    model_used = torch.zeros(N, dtype=torch.long, device=device)
    env_used = [0] * N
    for turn in range(1, max_turns + 1):
        n = len(rows)
        limit = torch.clamp(max_model_tokens - model_used[rows], max=max_turn_tokens)  # (n,) tokens this turn
        tok_hist = torch.full((n, max_turn_tokens), pad_id, dtype=torch.long, device=device)
        lp_hist = torch.zeros((n, max_turn_tokens), device=device)
        length = torch.zeros(n, dtype=torch.long, device=device)
        writing = limit > 0  # (n,) rows still in their turn
        ended_eos = torch.zeros(n, dtype=torch.bool, device=device)
        for t in range(max_turn_tokens):
            tok, lp = sample_token(logits, temperature, top_p, greedy, generator)  # (n,) each
            tok_hist[writing, t], lp_hist[writing, t] = tok[writing], lp[writing]
            length += writing.long()
            is_eos = torch.isin(tok, eos) & writing
            ended_eos |= is_eos
            feed = writing & ~is_eos & (length < limit)  # rows whose token goes into the cache now
            writing = feed
            if not bool(writing.any()):
                break
            pos = pos + feed.long()
            logits = stepper.step(torch.where(feed, tok, torch.full_like(tok, pad_id)), pos, valid=feed)
        model_used[rows] += length
        row_list = rows.tolist()
        turn_ids = [tok_hist[i, :int(length[i])].tolist() for i in range(n)]
        for i, r in enumerate(row_list):
            trajs[r].add(turn_ids[i], lp_hist[i, :int(length[i])].float().tolist(), model=True)
            trajs[r].turns.append(turn_ids[i])
        eos_list = ended_eos.tolist()
        replies = respond(row_list, turn_ids, eos_list)  # every turn is shown (an environment may score it)
        go_on, additions = [], []
        for i, r in enumerate(row_list):
            reply = replies[i]
            if not eos_list[i]:  # the turn ran out of tokens: the trajectory is cut here
                trajs[r].stop = "budget"
                continue
            if reply is None:
                trajs[r].stop = "answer"
                continue
            if turn == max_turns:
                trajs[r].stop = "max_turns"
                continue
            if env_used[r] + len(reply) > max_env_tokens:
                trajs[r].stop = "env_tokens"
                continue
            if int(model_used[r]) >= max_model_tokens:
                trajs[r].stop = "budget"
                continue
            env_used[r] += len(reply)
            trajs[r].add(reply, None, model=False)
            go_on.append(i)
            additions.append([turn_ids[i][-1]] + reply)  # the turn's EOS goes into the cache first
        if not go_on:
            break
        keep = torch.tensor(go_on, dtype=torch.long, device=device)
        if len(go_on) < n:
            stepper.keep(keep)
        rows, pos = rows[keep], pos[keep]
        add_ids, add_mask = left_pad(additions, pad_id)
        add_ids, add_mask = add_ids.to(device), add_mask.to(device)
        add_pos = pos[:, None] + add_mask.cumsum(-1)  # (n', L): positions go on after each row's last token
        pos = add_pos[:, -1]
        logits = stepper.extend(add_ids, add_mask, add_pos * add_mask)
    return trajs  # every trajectory has its stop: the last turn gives each live row one


def _as_rollout(trajs: list[Trajectory], tokenizer, ids, mask, G, pad_id) -> Rollout:
    """The trajectories as one Rollout: completion = the whole stream after the prompt, right-padded;
    completion_mask marks the model's tokens, env_mask the environment's."""
    N = len(trajs)
    C = max(1, max(len(t.ids) for t in trajs))
    comp = torch.full((N, C), pad_id, dtype=torch.long)
    cmask, emask, lps = torch.zeros((N, C)), torch.zeros((N, C)), torch.zeros((N, C))
    for i, t in enumerate(trajs):
        L = len(t.ids)
        comp[i, :L] = torch.tensor(t.ids, dtype=torch.long)
        model = torch.tensor(t.model, dtype=torch.bool)
        cmask[i, :L] = model.float()
        emask[i, :L] = (~model).float()
        lps[i, :L] = torch.tensor(t.logp)
    texts = tokenizer.batch_decode([t.turns[-1] if t.turns else [] for t in trajs], skip_special_tokens=True)
    truncated = torch.tensor([t.stop in ("budget", "env_tokens") for t in trajs])
    return Rollout(prompt_ids=ids.repeat_interleave(G, 0).cpu(), prompt_mask=mask.repeat_interleave(G, 0).cpu(),
                   completion_ids=comp, completion_mask=cmask, sample_logp=lps, truncated=truncated, texts=texts,
                   G=G, env_mask=emask)
