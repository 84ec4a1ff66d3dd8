"""The multi-turn rollout loop: environments, a tokenizer and a rollout engine; no training run.

    roll_out(environments, examples, engine=..., tokenizer=..., sampling=..., limits=..., G=...)
        envs = [factory() for each of the N = B*G trajectories] (Environments.pick: the example's
               `environment` column picks the factory, TRL's dict environment_factory)
        env.reset(example fields), Python's `random` seeded per example (grpolab.env.base.seeded), so
               that the G trajectories of an example get one task (else the run is refused)
        prompt = the prompt (a string or TRL's messages) + what reset returned, or the messages reset
                 returned, in the chat template, tools shown where it can
        engine.generate_turns(...)  (grpolab.engine: native or vLLM): the model writes a turn;
            respond: the batch's environments step (grpolab.env.run_turns: concurrently, or one after
                     another on this thread with env.tool_thread=main); each reply's messages become
                     tokens by the template (grpolab.model.template.addition_ids)
        -> the rollout, its environments (still open) and prompts: the caller scores them, then closes
           the environments (close_all)

The engine is any object with grpolab.engine.base.RolloutEngine's generate_turns, and `limits` its
TurnLimits: both come from the caller (grpolab.training.agents.agent_rollout), this layer imports no
engine. The model's tokens stay the ids it sampled; the environment's are marked in Rollout.env_mask,
so every algorithm reads the model's tokens only (docs/agents.md, "The masks").
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field

import torch

from grpolab.batch import Example, Rollout
from grpolab.env.base import EnvConfigError, Reply, close_environment, example_seed, seeded
from grpolab.env.budget import ToolBudget
from grpolab.env.calls import ToolCall
from grpolab.env.runner import run_turns
from grpolab.env.settings import EnvConfig
from grpolab.env.timeouts import Raised, call_with_timeout
from grpolab.model.template import TemplateError, addition_ids, render
from grpolab.util.fields import ConfigError
from grpolab.util.text import safe_text

log = logging.getLogger(__name__)

STOPS = ("answer", "max_turns", "budget", "env_tokens")
ROUTE_COLUMN = "environment"
"""The column that picks an example's environment among env.factories (TRL's multi-environment field)."""
UNSTARTED = "unstarted"
"""Key of roll_out's context: the trajectories whose environment could not start (their reward is 0;
grpolab.training.step takes the key out before the reward functions see the context)."""
NO_PROMPT = "(the environment could not start)"
"""The prompt of a group whose environment could not start and whose example has no prompt of its own."""


@dataclass
class Environments:
    """What a run needs to roll out in an environment: the factory, its tools, the settings; with
    env.factories, one (factory, tools) per name in `routes` (`factory` and `tools` are the first's)."""

    factory: object
    tools: list[dict]
    settings: EnvConfig
    routes: dict[str, tuple[object, list[dict]]] = field(default_factory=dict)
    has_reward: bool = True
    """Whether any of its environments gives a reward of its own (TRL: the class has get_reward)."""

    @property
    def name(self) -> str:
        return self.settings.name or ", ".join(f"{k}={v}" for k, v in self.settings.factories.items())

    def pick(self, e: Example) -> tuple[object, list[dict]]:
        """(factory, tool schemas) of an example's environment: the only one, or its `environment` column's."""
        if not self.routes:
            return self.factory, self.tools
        name = e.meta.get(ROUTE_COLUMN)
        if name not in self.routes:
            raise ConfigError(
                f"example {e.id!r} has `{ROUTE_COLUMN}={name!r}`, which is not among the environments of "
                f"env.factories ({', '.join(sorted(self.routes))}); give every row an `{ROUTE_COLUMN}` column naming one"
            )
        return self.routes[name]

    def fields(self, e: Example) -> dict:
        """What reset receives: the example's fields; routed, without the `environment` column (as TRL)."""
        out = example_fields(e)
        if self.routes:
            out.pop(ROUTE_COLUMN, None)
        return out


def content_text(content: object) -> tuple[object, bool]:
    """(the content a chat template renders, whether it had to be converted) of an environment message:
    a string, None, or a list of parts (dicts; a tuple of them becomes a list) as they are; bytes decoded
    as UTF-8 (U+FFFD where they are not); a dict (a service's JSON), a list of other things or a number as
    its JSON text; any other object as its str()."""
    if content is None or isinstance(content, str):
        return content, False
    if isinstance(content, (list, tuple)) and content and all(isinstance(p, dict) for p in content):
        return list(content), isinstance(content, tuple)
    if isinstance(content, (bytes, bytearray)):
        return safe_text(bytes(content).decode("utf-8", "replace"))[0], True
    text = None
    if isinstance(content, (dict, list, tuple, int, float, bool)):
        try:
            text = json.dumps(content, ensure_ascii=False, default=str)
        except (TypeError, ValueError, RecursionError):
            text = None
    if text is None:
        try:
            text = str(content)
        except Exception:  # noqa: BLE001 - a hostile __str__
            text = f"<{type(content).__name__}>"
    return safe_text(text)[0], True


def text_message(message: object, events) -> object:
    """An environment message whose content a template can render (content_text); each conversion counts
    one env/errors_content_not_text."""
    if not isinstance(message, dict) or "content" not in message:
        return message
    content, converted = content_text(message["content"])
    if not converted:
        return message
    events["content_not_text"] += 1
    return {**message, "content": content}


def example_fields(e: Example) -> dict:
    """What env.reset receives: the example's fields (TRL passes the dataset row's columns)."""
    return {"prompt": e.prompt, "answer": e.answer, "id": e.id, **e.meta}


def prompt_messages(e: Example, extra, system_prompt: str | None) -> list[dict]:
    """The prompt a trajectory starts from: the example's prompt (a string is one user message; TRL's
    message list as it is) with reset's text appended to the last message after a blank line (its
    whole content when that is empty: the environment writes the prompt), or the messages reset
    returned; `system_prompt` first unless there is a system message. An empty prompt is an error."""
    if isinstance(extra, list):  # the environment wrote the whole prompt (SkyRL-gym's init)
        msgs = [dict(m) for m in extra]
    else:
        msgs = [{"role": "user", "content": e.prompt}] if isinstance(e.prompt, str) else [dict(m) for m in e.prompt]
        if extra:
            text = msgs[-1]["content"]
            msgs[-1] = {**msgs[-1], "content": f"{text}\n\n{extra}" if text.strip() else extra}
    if system_prompt and not any(m["role"] == "system" for m in msgs):
        msgs.insert(0, {"role": "system", "content": system_prompt})
    if not any(isinstance(m.get("content"), str) and m["content"].strip() for m in msgs if m["role"] == "user"):
        raise ConfigError(
            f"example {e.id!r}: empty prompt, and the environment's reset() returned no text for it; "
            "give the data a prompt column or return the task's text from reset()"
        )
    return msgs


def check_group_prompts(prompts: list[list[dict]], examples: list[Example], G: int) -> None:
    """The G trajectories of an example must start from one prompt: it is prefilled once per group, and
    the training passes compute it once per group (grpolab.model.passes). An environment whose reset
    writes different tasks for them (a random generator of its own, which grpolab.env.base.seeded does
    not reach) is refused, naming the fix."""
    for i in range(len(prompts)):
        if prompts[i] != prompts[i - i % G]:
            e = examples[i // G]
            raise ConfigError(
                f"env.name: the environments of example {e.id!r} wrote different prompts for its {G} trajectories "
                f"({prompts[i - i % G][-1]['content'][:60]!r} and {prompts[i][-1]['content'][:60]!r}); a group must "
                "share its task. Draw the task in reset from Python's `random` module (grpolab seeds it per "
                "example) or from the example's fields (its `seed`, its id), not from a generator of its own"
            )


def _safe(text: str | None, events: Counter) -> str | None:
    """Text made valid Unicode (grpolab.util.text) where it enters the token stream here: the model's
    decoded turn, what reset() appends to the prompt; a repair counts an `invalid_unicode` event."""
    if not isinstance(text, str):
        return text
    out, k = safe_text(text)
    if k:
        events["invalid_unicode"] += 1
    return out


class Unstarted:
    """Stands for the environment of a trajectory whose group could not start (a factory or reset that
    raised or ran past env.reset_timeout_s): no tools, and its trajectory ends after the model's first
    turn; its reward is 0 (grpolab.training.step) and a TRL-form reward function reads None for it."""

    tools: list = []
    user_env = None
    has_reward = False

    def reset(self, fields: dict) -> None:
        return None

    def step(self, turn_text: str) -> Reply:
        return Reply(done=True)

    def reward(self) -> None:
        return None


def _start(factory, fields: dict):
    """A new environment from `factory`, reset for an example: (env, what reset returned). An environment
    whose reset raises is closed before the error goes on."""
    env = factory()
    try:
        return env, env.reset(fields)
    except BaseException:
        try:
            close_environment(env)
        except Exception:  # noqa: BLE001 - the reset's error is the one reported
            pass
        raise


def start_environment(factory, fields: dict, s: EnvConfig, events: Counter, example_id) -> tuple[object, object]:
    """(env, reset's text) of one trajectory; (None, None) when its factory or reset raised (counted as a
    `reset` event) or did not return within env.reset_timeout_s (`reset_timeout`), with a warning naming
    the example. Runs on a daemon thread with that limit (in this thread, without it, when
    env.tool_thread=main). A reset that breaks the contract (returns a number, say) is a usage error."""
    out = call_with_timeout(
        _start, {"factory": factory, "fields": fields}, s.reset_timeout_s, convert=False, here=s.tool_thread == "main"
    )
    if isinstance(out, tuple):
        return out
    if isinstance(out, Raised) and isinstance(out.error, EnvConfigError):
        raise ConfigError(f"env.name: {out.error}") from None
    kind = "reset_timeout" if out is None else "reset"
    why = (
        f"did not return within env.reset_timeout_s={s.reset_timeout_s:g} s"
        if out is None
        else f"raised {out.describe()}"
    )
    events[kind] += 1
    log.warning(
        "environment of example %s: creating or resetting it %s; the example's trajectories score 0 (env/errors_%s)",
        ascii(str(example_id))[:80],
        ascii(why)[:400],
        kind,
    )
    return None, None


def unstarted_groups(envs: list, G: int) -> set[int]:
    """The examples (groups of G trajectories) with an environment that could not start: the whole group
    is set aside (one prompt per group, and rewards of 0 give it no advantage)."""
    return {i // G for i, env in enumerate(envs) if env is None}


def _fallback_prompt(e: Example, system: str | None) -> list[dict]:
    """The prompt of a group whose environment could not start: the example's own, or NO_PROMPT."""
    try:
        return prompt_messages(e, None, system)
    except ConfigError:
        return prompt_messages(Example(prompt=NO_PROMPT, answer=e.answer, id=e.id), None, system)


def close_all(envs) -> None:
    """Close every trajectory's environment (a pooled instance goes back to its pool)."""
    for env in envs:
        close_environment(env)


def _record(
    messages: list[dict], calls: dict[int, list[ToolCall]], values: dict[int, object] | None = None
) -> list[dict]:
    """The conversation as reward functions and samples see it: each assistant turn that made tool calls
    carries them as TRL's parsed `tool_calls` (its text keeps the <tool_call> blocks); a tool message
    whose tool returned a list holds that list as its content (TRL passes it through; the model read
    its JSON text)."""
    out = []
    for k, m in enumerate(messages):
        if k in calls:
            m = {
                **m,
                "tool_calls": [
                    {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls[k]
                ],
            }
        if values and k in values:
            m = {**m, "content": values[k]}
        out.append(m)
    return out


def roll_out(
    envs_cfg: Environments,
    examples: list[Example],
    *,
    engine,
    tokenizer,
    sampling,
    limits,
    G: int,
    generator: torch.Generator | None = None,
    system_prompt: str | None = None,
) -> tuple[Rollout, dict[str, list], dict]:
    """G multi-turn trajectories per example, sampled by `engine` (its generate_turns, with `sampling`
    and `limits`: grpolab.engine.base's Sampling and TurnLimits) in `tokenizer`'s chat template. Returns
    (rollout, context, metrics); context holds, per trajectory, its `environments` (left open for
    scoring: the caller closes them, close_all), the `prompts` it started from, for the reward functions
    (as TRL passes both), and under UNSTARTED the rows whose environment could not start."""
    s = envs_cfg.settings
    tok = tokenizer
    system = system_prompt
    N = len(examples) * G
    picked = [envs_cfg.pick(examples[i // G]) for i in range(N)]
    tools_of = [tools or None for _, tools in picked]
    budget = ToolBudget(N, s.tool_budget_s, s.step_tool_budget_s)
    events, calls = Counter(), Counter()
    envs: list = []
    try:
        extras = []
        for i in range(N):  # in order, one at a time: reproducible draws from a seeded `random`
            fields = envs_cfg.fields(examples[i // G])
            with seeded(example_seed(fields)):
                env, extra = start_environment(picked[i][0], fields, s, events, examples[i // G].id)
            envs.append(env)
            extras.append(_safe(extra, events))
        unstarted = unstarted_groups(envs, G)
        row_prompts = []
        for i in range(N):
            if i // G in unstarted:
                close_environment(envs[i])
                envs[i] = Unstarted()
                row_prompts.append(_fallback_prompt(examples[i // G], system))
            else:
                row_prompts.append(prompt_messages(examples[i // G], extras[i], system))
        check_group_prompts(row_prompts, examples, G)
        prompt_ids = [
            list(
                tok(
                    render(tok, row_prompts[i], add_generation_prompt=True, tools=tools_of[i]), add_special_tokens=False
                )["input_ids"]
            )
            for i in range(0, N, G)
        ]
        history = [list(p) for p in row_prompts]
        calls_at: list[dict[int, list[ToolCall]]] = [{} for _ in range(N)]
        values_at: list[dict[int, object]] = [{} for _ in range(N)]  # tool results that were lists

        def respond(rows: list[int], turn_ids: list[list[int]], ended: list[bool]) -> list[list[int] | None]:
            texts = [_safe(t, events) for t in tok.batch_decode(turn_ids, skip_special_tokens=True)]
            replies = run_turns(
                [envs[r] for r in rows],
                texts,
                clocks=[budget.clocks[r] for r in rows],
                sequential=s.tool_thread == "main",
            )
            out: list[list[int] | None] = []
            for r, text, reply, eos in zip(rows, texts, replies, ended):
                history[r].append({"role": "assistant", "content": text})
                made = [c for c in reply.parsed if isinstance(c, ToolCall)]
                if made:
                    calls_at[r][len(history[r]) - 1 - len(row_prompts[r])] = made
                events.update(reply.events)
                calls.update(reply.calls)
                if reply.done or not reply.messages or not eos:
                    out.append(None)
                    continue
                reply.messages = [text_message(m, events) for m in reply.messages]
                try:
                    out.append(addition_ids(tok, history[r], reply.messages, tools_of[r], events=events))
                except Exception as e:  # noqa: BLE001 - a turn the probe did not foresee (TemplateError), or a
                    # reply the template cannot render: its trajectory ends here, counted, and the run goes on
                    events["template"] += 1
                    why = e if isinstance(e, TemplateError) else f"rendering the reply raised {type(e).__name__}: {e}"
                    log.warning("multi-turn: %s; the trajectory ends at this turn (env/errors_template)", why)
                    out.append(None)
                    continue
                for j, value in reply.values.items():
                    values_at[r][len(history[r]) - len(row_prompts[r]) + j] = value
                history[r] += reply.messages
            return out

        rollout, trajs = engine.generate_turns(prompt_ids, respond, sampling, limits, G=G, generator=generator)
    except BaseException:
        close_all(envs)
        raise
    for h, tr in zip(history, trajs):
        if tr.stop == "env_tokens":  # the last reply was refused by the budget: it is not in the tokens either
            while h and h[-1]["role"] != "assistant":
                h.pop()
    rollout.conversations = [
        _record(h[len(row_prompts[i]) :], calls_at[i], values_at[i]) for i, h in enumerate(history)
    ]
    rollout.stops = [t.stop for t in trajs]
    metrics = {**trajectory_metrics(rollout, trajs, events, calls), **budget.metrics()}
    failed = [i for i in range(N) if i // G in unstarted]
    return rollout, {"environments": envs, "prompts": row_prompts, UNSTARTED: failed}, metrics


def trajectory_metrics(rollout: Rollout, trajs, events: Counter, calls: Counter) -> dict:
    """docs/metrics.md, "Environments": per-trajectory means, error counts by kind, stop shares."""
    n = len(trajs)
    env_tokens = float(rollout.env_mask.sum()) if rollout.env_mask is not None else 0.0
    model_tokens = float(rollout.completion_mask.sum())
    m = {
        "env/turns_mean": sum(len(t.turns) for t in trajs) / n,
        "env/tool_calls_mean": sum(calls.values()) / n,
        "env/env_token_frac": env_tokens / max(1.0, env_tokens + model_tokens),
    }
    for stop in STOPS:
        m[f"env/stopped_{stop}"] = sum(t.stop == stop for t in trajs) / n
    for kind, k in events.items():
        m[f"env/errors_{kind}"] = float(k)
    for name, k in calls.items():
        m[f"env/calls/{name}"] = float(k)
    return m
