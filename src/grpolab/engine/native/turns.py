"""Multi-turn generation: G trajectories per prompt, the model's turns interleaved with what an
environment adds, decoded together on one KV cache.

    prefill each prompt once, repeat its cache G times
    while some trajectory goes on:
        decode one turn for every live row (a row that ended its turn waits as a hole in the cache)
        respond(rows, turns) -> the environment's tokens for each row, or None: the trajectory ends
        rows that ended leave the batch; the others get [EOS] + their environment tokens appended to
        their own cache rows (left-padded, one prefill-style pass): nothing is recomputed

The model's tokens are the ids it sampled, with the log-prob of each under the sampling distribution;
environment tokens are whatever `respond` returns (grpolab.env.rollout renders them with the chat
template) and are marked in `env_mask`: no algorithm ever reads them as the model's (grpolab.batch).
This module knows nothing of tools or environments: `respond` is a plain function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from grpolab.batch import Rollout, Stop
from grpolab.engine.native.sampling import PLAIN, Filters, sample_token, seen_tokens
from grpolab.engine.native.session import decode_session
from grpolab.model.cache import left_pad, positions


@dataclass
class Trajectory:
    """One row's token stream after its prompt, in order."""

    ids: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)  # 0.0 at environment tokens
    model: list[bool] = field(default_factory=list)  # True: the model sampled it
    turns: list[list[int]] = field(default_factory=list)  # the model's ids of each turn
    stop: Stop | str = ""  # why it ended (grpolab.batch.Stop): answer, max_turns, budget, env_tokens

    def add(self, ids: list[int], logp: list[float] | None, model: bool) -> None:
        self.ids += ids
        self.logp += logp if logp is not None else [0.0] * len(ids)
        self.model += [model] * len(ids)


Respond = Callable[[list[int], list[list[int]], list[bool]], list["list[int] | None"]]
"""respond(rows, turn_ids, ended_with_eos) -> per row: the environment's token ids to append (the next
assistant header included), or None when that trajectory ends. Rows index the N trajectories."""


@torch.no_grad()
def generate_turns(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    respond: Respond,
    *,
    G: int,
    max_turn_tokens: int,
    max_model_tokens: int,
    max_env_tokens: int,
    max_turns: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    autocast_dtype: torch.dtype | None = None,
    generator: torch.Generator | None = None,
    eos_ids: set[int] | None = None,
    lean: bool = True,
    filters: Filters = PLAIN,
) -> tuple[Rollout, list[Trajectory]]:
    """Sample G multi-turn trajectories per prompt (token ids, chat-templated).

    max_turn_tokens: the most tokens one model turn may write; max_model_tokens: the trajectory's budget,
    every model token of every turn; max_env_tokens: the most environment tokens one trajectory may receive;
    max_turns: the most model turns. A turn that reaches a limit without EOS ends its trajectory
    (truncated); so does a reply that would pass max_env_tokens."""
    # cache slots: each turn takes max_turn_tokens (a row that ended its turn early waits as holes), and
    # each reply, left-padded to the batch's longest, at most max_env_tokens plus the turn's EOS
    capacity = max_turns * (max_turn_tokens + max_env_tokens + 1)
    with decode_session(
        model, tokenizer, prompt_ids, autocast_dtype=autocast_dtype, capacity=capacity, lean=lean, eos_ids=eos_ids
    ) as sess:
        ids, mask, pad_id = sess.ids, sess.mask, sess.pad_id
        trajs = _decode_turns(
            sess.stepper,
            ids,
            mask,
            G,
            respond,
            max_turn_tokens,
            max_model_tokens,
            max_env_tokens,
            max_turns,
            temperature,
            top_p,
            greedy,
            generator,
            sess.eos,
            pad_id,
            filters,
        )
    return as_rollout(trajs, tokenizer, ids, mask, G, pad_id), trajs


def _decode_turns(
    stepper,
    ids,
    mask,
    G,
    respond,
    max_turn_tokens,
    max_model_tokens,
    max_env_tokens,
    max_turns,
    temperature,
    top_p,
    greedy,
    generator,
    eos,
    pad_id,
    filters: Filters = PLAIN,
) -> list[Trajectory]:
    device = ids.device
    N = ids.shape[0] * G
    logits = stepper.prefill(ids, mask, positions(mask))  # (B, V)
    if G > 1:
        stepper.repeat(G)
        logits = logits.repeat_interleave(G, 0)  # (N, V)
    pos = positions(mask.repeat_interleave(G, 0))[:, -1]  # (N,) position of each row's last token
    trajs = [Trajectory() for _ in range(N)]
    rows = torch.arange(N, device=device)  # trajectory of each cache row
    # the repetition penalty's memory: every token of each trajectory so far (prompt, turns, replies)
    seen = seen_tokens(ids, mask, logits.shape[-1]).repeat_interleave(G, 0) if filters.penalised else None  # (N, V)
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
            tok, lp = sample_token(
                logits, temperature, top_p, greedy, generator, filters, None if seen is None else seen[rows]
            )  # (n,) each
            if seen is not None:
                seen[rows[writing], tok[writing]] = True
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
        turn_ids = [tok_hist[i, : int(length[i])].tolist() for i in range(n)]
        for i, r in enumerate(row_list):
            trajs[r].add(turn_ids[i], lp_hist[i, : int(length[i])].float().tolist(), model=True)
            trajs[r].turns.append(turn_ids[i])
        eos_list = ended_eos.tolist()
        replies = respond(row_list, turn_ids, eos_list)  # every turn is shown (an environment may score it)
        go_on, additions = [], []
        for i, r in enumerate(row_list):
            stop = turn_stop(
                replies[i],
                eos_list[i],
                turn=turn,
                max_turns=max_turns,
                env_used=env_used[r],
                max_env_tokens=max_env_tokens,
                model_used=int(model_used[r]),
                max_model_tokens=max_model_tokens,
            )
            if stop is not None:
                trajs[r].stop = stop
                continue
            reply = replies[i]
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
        if seen is not None:
            seen[rows] |= seen_tokens(add_ids, add_mask, seen.shape[-1])
        add_pos = pos[:, None] + add_mask.cumsum(-1)  # (n', L): positions go on after each row's last token
        pos = add_pos[:, -1]
        logits = stepper.extend(add_ids, add_mask, add_pos * add_mask)
    return trajs  # every trajectory has its stop: the last turn gives each live row one


def turn_stop(
    reply: list[int] | None,
    ended_with_eos: bool,
    *,
    turn: int,
    max_turns: int,
    env_used: int,
    max_env_tokens: int,
    model_used: int,
    max_model_tokens: int,
) -> Stop | None:
    """Whether a trajectory ends after this turn, and why (None: it goes on with `reply`). Every engine's
    multi-turn loop asks this, in this order: a turn cut by its token limit, the environment closing it,
    the turn limit, a reply over the environment-token budget, the model-token budget spent."""
    if not ended_with_eos:
        return Stop.BUDGET
    if reply is None:
        return Stop.ANSWER
    if turn == max_turns:
        return Stop.MAX_TURNS
    if env_used + len(reply) > max_env_tokens:
        return Stop.ENV_TOKENS
    if model_used >= max_model_tokens:
        return Stop.BUDGET
    return None


def as_rollout(trajs: list[Trajectory], tokenizer, ids, mask, G, pad_id) -> Rollout:
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
    truncated = torch.tensor([Stop(t.stop).truncated for t in trajs])
    return Rollout(
        prompt_ids=ids.repeat_interleave(G, 0).cpu(),
        prompt_mask=mask.repeat_interleave(G, 0).cpu(),
        completion_ids=comp,
        completion_mask=cmask,
        sample_logp=lps,
        truncated=truncated,
        texts=texts,
        G=G,
        env_mask=emask,
        stops=[Stop(t.stop) for t in trajs],
    )
