"""What one `grpolab bench` measures: the command line, its presets, and what both sides share.

A `Spec` is the resolved setting (model, prompts per step, G, forced completion length, beta, LoRA
rank, device, precision, steps); the parent process writes it as JSON and every worker reads it, so
grpolab and TRL see exactly the same numbers, prompts and reward function.

The multi-turn setting (`--setting agent`) adds what both sides share for tool use: its chat template,
environment, few-shot prompts and limits live in grpolab.app.bench.agent.
"""

from __future__ import annotations

import argparse
import zlib
from dataclasses import asdict, dataclass

from grpolab.app.bench.agent import AGENT_TASK_ARGS, ENV_NAME, agent_limits
from grpolab.util.fields import ConfigError

SETTINGS = {  # --setting presets; an explicit flag overrides the preset's value
    "a": {"new_tokens": 64, "beta": 0.0, "lora_r": 0},
    "b": {"new_tokens": 128, "beta": 0.04, "lora_r": 0},
    "c": {"new_tokens": 128, "beta": 0.04, "lora_r": 16},
    # multi-turn: new_tokens is the most tokens of one model turn; max_turns model turns (max_turns - 1 tool calls)
    "agent": {"new_tokens": 48, "beta": 0.0, "lora_r": 0, "agent": True, "max_turns": 3},
}
DEFAULTS = {"new_tokens": 64, "beta": 0.0, "lora_r": 0, "agent": False, "max_turns": 3}
INSTALL_TRL = (
    "TRL is not installed; the comparison needs it: pip install 'grpolab[bench]' "
    "(trl==1.16.0, peft), or run grpolab alone with --against none"
)
LOGP_TOL = 1e-3  # fp32: max |log pi_grpolab - log pi_TRL| over the check's tokens

USAGE = """grpolab bench [--model smollm2-135m|DIR] [--setting a|b|c|agent] [--prompts 2] [--G 8] [--new-tokens 64]
                     [--beta 0] [--lora-r 0] [--max-turns 3] [--precision auto|fp32|bf16] [--trl-precision both]
                     [--trl-checkpointing both]
                     [--device cpu|cuda|auto] [--against trl|none] [--steps 3] [--rounds 2] [--json-out FILE]
                     [--threads 0] [--lr 1e-6] [--seed 0] [--engine native|vllm|both] [--busy 0]

The same GRPO configuration trained by grpolab and by TRL's GRPOTrainer, each in its own process,
alternating (grpolab, TRL, grpolab, TRL, ...), one warm-up step then --steps timed steps each.
Every completion is forced to --new-tokens tokens (no early EOS) on both sides, so both do the same
work; a log-prob check first confirms that both compute the same per-token log-probs.
--against none: grpolab alone, its phases against the FLOP floor of this machine.
Settings: a = 64 tokens, beta 0; b = 128 tokens, beta 0.04; c = b with LoRA r=16 on all linear layers;
agent = multi-turn tool use against TRL's environment_factory: at most --max-turns 3 model turns of at most
--new-tokens 48 tokens each, ended by EOS (not forced: a tool call needs the turn to end), one tool `add`,
the same Qwen2.5 chat template and few-shot prompts on both sides."""


@dataclass
class Spec:
    """The resolved setting, shared by the parent and every worker (as JSON)."""

    model: str = "smollm2-135m"
    setting: str | None = None
    prompts: int = 2
    G: int = 8
    new_tokens: int = 64
    beta: float = 0.0
    lora_r: int = 0
    precision: str = "auto"  # grpolab's precision= (auto: grpolab.model.precision.choose)
    trl_precision: str = "both"
    trl_checkpointing: str = "both"  # TRL's gradient_checkpointing: on (its default), off, or both configurations
    device: str = "auto"
    against: str = "trl"
    steps: int = 3
    rounds: int = 2
    lr: float = 1e-6  # TRL's default learning rate, given to both
    seed: int = 0
    threads: int = 0  # torch CPU threads in every worker (0: torch's default)
    json_out: str | None = None
    agent: bool = False  # multi-turn tool use (--setting agent): new_tokens is then the limit of one turn
    max_turns: int = 3  # agent: most model turns per trajectory (TRL: max_tool_calling_iterations = max_turns - 1)
    engine: str = "native"  # grpolab's rollout engine(s): native, vllm, or both (two grpolab configurations)
    busy: int = 0  # single-threaded busy processes beside every timed worker, either side (a loaded machine)

    def engines(self) -> list[str]:
        return ["native", "vllm"] if self.engine == "both" else [self.engine]

    @property
    def completions(self) -> int:
        return self.prompts * self.G

    def trl_precisions(self) -> list[str]:
        return ["fp32", "bf16"] if self.trl_precision == "both" else [self.trl_precision]

    def trl_checkpointings(self) -> list[str]:
        return ["on", "off"] if self.trl_checkpointing == "both" else [self.trl_checkpointing]

    def describe(self) -> str:
        ft = f"LoRA r={self.lora_r} on all linear layers" if self.lora_r else "full fine-tuning"
        head = f"setting {self.setting}: " if self.setting else ""
        if self.agent:
            lim = agent_limits(self)
            length = (
                f"multi-turn tool use (env {ENV_NAME.split(':')[1]}, Qwen2.5 chat template): at most "
                f"{self.max_turns} turns of at most {self.new_tokens} tokens each (ended by EOS, not forced), "
                f"TRL budget {lim['trl_max_completion_length']} tokens with tool replies"
            )
        else:
            length = f"{self.new_tokens} new tokens (forced)"
        busy = f"; beside {self.busy} busy process{'es' if self.busy != 1 else ''}" if self.busy else ""
        return (
            f"{head}{self.model}, {self.prompts} prompts x G={self.G} = {self.completions} completions, "
            f"{length}, beta {self.beta:g}, {ft}{busy}"
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Spec:
        return cls(**d)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="grpolab bench",
        usage=USAGE.split("\n\n")[0],
        description=USAGE.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--model", default="smollm2-135m", help="smollm2-135m (bundled) or a local HF model directory")
    ap.add_argument("--setting", choices=sorted(SETTINGS), help="a preset (a, b, c, agent); explicit flags override it")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step (default 2)")
    ap.add_argument("--G", type=int, default=8, help="completions per prompt (default 8)")
    ap.add_argument(
        "--new-tokens",
        type=int,
        help="completion length, forced on both sides (default 64); --setting agent: the most "
        "tokens of one turn, not forced (48)",
    )
    ap.add_argument("--beta", type=float, help="KL coefficient; > 0 adds the reference pass (default 0)")
    ap.add_argument("--lora-r", type=int, help="LoRA rank on all linear layers, 0 = full fine-tuning (default 0)")
    ap.add_argument("--max-turns", type=int, help="--setting agent: most model turns per trajectory (default 3)")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"], help="grpolab's precision")
    ap.add_argument(
        "--trl-precision",
        default="both",
        choices=["fp32", "bf16", "both"],
        help="TRL's precision (bf16=True/False); both = two TRL configurations (default)",
    )
    ap.add_argument(
        "--trl-checkpointing",
        default="both",
        choices=["on", "off", "both"],
        help="TRL's gradient_checkpointing: on (its default), off, or both = two TRL configurations per "
        "precision, off only where the memory allows (default both); the ratio is against the faster",
    )
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument(
        "--against",
        default="trl",
        choices=["trl", "none"],
        help="trl: the comparison; none: grpolab alone, against the FLOP floor",
    )
    ap.add_argument("--steps", type=int, default=3, help="timed steps per process, after 1 warm-up step")
    ap.add_argument("--rounds", type=int, default=2, help="alternations grpolab, TRL, ... (default 2)")
    ap.add_argument("--lr", type=float, default=1e-6, help="learning rate of both (default 1e-6, TRL's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads of every worker, both sides (default 0: torch's own, one per core); on a "
        "machine shared with other jobs, 1 avoids the slowdown of oversubscribed threads",
    )
    ap.add_argument(
        "--busy",
        type=int,
        default=0,
        help="run every timed worker, both sides, beside N single-threaded processes that spin at 100%% "
        "of a core (python -c 'while True: pass'): the ratio on a machine doing something else "
        "(default 0: alone)",
    )
    ap.add_argument("--json-out", metavar="FILE", help="also write the JSON result to FILE")
    ap.add_argument(
        "--engine",
        default="native",
        choices=["native", "vllm", "both"],
        help="grpolab's rollout engine (rollout.engine); both = grpolab native and grpolab+vLLM, each "
        "against TRL and against each other (default native)",
    )
    return ap


def parse_spec(argv: list[str]) -> Spec:
    """The command line as a Spec. argparse exits 2 on a malformed flag; a bad value raises ConfigError (2)."""
    ns = parser().parse_args(argv)
    preset = {**DEFAULTS, **(SETTINGS[ns.setting] if ns.setting else {})}
    vals = {k: getattr(ns, k, None) if getattr(ns, k, None) is not None else preset[k] for k in DEFAULTS}
    spec = Spec(
        model=ns.model,
        setting=ns.setting,
        prompts=ns.prompts,
        G=ns.G,
        precision=ns.precision,
        trl_precision=ns.trl_precision,
        trl_checkpointing=ns.trl_checkpointing,
        device=ns.device,
        against=ns.against,
        steps=ns.steps,
        rounds=ns.rounds,
        lr=ns.lr,
        seed=ns.seed,
        threads=ns.threads,
        json_out=ns.json_out,
        engine=ns.engine,
        busy=ns.busy,
        **vals,
    )
    check(spec)
    return spec


def check(spec: Spec) -> None:
    """Impossible values, named by their flag (ConfigError: exit 2)."""
    rules = [
        (spec.prompts >= 1, "--prompts", "must be >= 1"),
        (spec.G >= 2, "--G", "must be >= 2 (a group of one has no advantage; TRL requires 2 or more)"),
        (spec.new_tokens >= 1, "--new-tokens", "must be >= 1"),
        (spec.beta >= 0, "--beta", "must be >= 0"),
        (spec.lora_r >= 0, "--lora-r", "must be >= 0 (0 = full fine-tuning)"),
        (spec.steps >= 1, "--steps", "must be >= 1"),
        (spec.rounds >= 1, "--rounds", "must be >= 1"),
        (spec.lr > 0, "--lr", "must be > 0"),
        (spec.threads >= 0, "--threads", "must be >= 0 (0 = torch's default)"),
        (spec.busy >= 0, "--busy", "must be >= 0 (busy processes beside each worker; 0 = alone)"),
        (spec.max_turns >= 1, "--max-turns", "must be >= 1"),
        (spec.agent or spec.max_turns == DEFAULTS["max_turns"], "--max-turns", "applies to --setting agent only"),
    ]
    for ok, flag, msg in rules:
        if not ok:
            raise ConfigError(f"bench {flag}: {msg}")


def bench_reward(completions, **kwargs) -> list[float]:
    """The reward of both sides: a deterministic pseudo-random number in [0, 1] of each completion's
    text (crc32), so that rewards vary within every group and no group is skipped for equal rewards.
    TRL passes chat completions as message lists, grpolab as strings; both read the same text."""
    out = []
    for c in completions:
        text = c if isinstance(c, str) else "".join(str(m.get("content") or "") for m in c if isinstance(m, dict))
        out.append((zlib.crc32(text.encode("utf-8")) % 1009) / 1008)
    return out


REWARD_NAME = "grpolab.app.bench.spec:bench_reward"


def bench_task(spec: Spec):
    """The task both sides draw their prompts from: arithmetic (the agent setting: with its few-shot prompt)."""
    from grpolab.tasks import build_task

    return build_task("arithmetic", spec.seed, dict(AGENT_TASK_ARGS) if spec.agent else {})


def step_prompts(spec: Spec, task, n_steps: int) -> list[list]:
    """The prompts of grpolab's steps 1..n_steps (grpolab.training.step.collect's draw), as TRL's chat messages:
    one list of {"role", "content"} per prompt, the task's system prompt first when it has one."""
    import torch

    from grpolab.training.run import step_rng

    out = []
    for step in range(1, n_steps + 1):
        rng, _ = step_rng(spec.seed, step, torch.device("cpu"))
        for ex in task.sample(spec.prompts, rng):
            msgs = [{"role": "system", "content": task.system_prompt}] if task.system_prompt else []
            if isinstance(ex.prompt, str):
                msgs.append({"role": "user", "content": ex.prompt})
            else:
                msgs = [dict(m) for m in ex.prompt]
            out.append(msgs)
    return out


def grpolab_recipe(
    spec: Spec, out: str, precision: str | None = None, model: str | None = None, engine: str = "native"
) -> dict:
    """The grpolab config of the setting (micro-batching and everything else at grpolab's defaults).
    `model`: the directory to load instead of spec.model (the agent setting's copy with its chat template)."""
    recipe = {
        "model": model or spec.model,
        "task": "arithmetic",
        "rewards": [{"name": REWARD_NAME}],
        "G": spec.G,
        "batch_size": spec.completions,
        "max_new_tokens": spec.new_tokens,
        "algo": {"name": "grpo", "beta": spec.beta},
        "precision": precision or spec.precision,
        "lr": spec.lr,
        "device": spec.device,
        "seed": spec.seed,
        "steps": spec.steps + 1,
        "out": out,
        "threads": spec.threads,
        "eval_size": 0,
        "save_every": 0,
        "tensorboard": False,
        "progress": False,
        "report": False,
        "rollout": {"engine": engine},
    }
    if spec.agent:
        lim = agent_limits(spec)
        recipe.update(
            task_args=dict(AGENT_TASK_ARGS),
            temperature=1.0,
            top_p=1.0,
            env={
                "name": ENV_NAME,
                "max_turns": lim["max_turns"],
                "max_turn_tokens": lim["turn_tokens"],
                "max_model_tokens": lim["model_tokens"],
                "max_env_tokens": lim["env_tokens"],
            },
        )
    if spec.lora_r:
        recipe["lora"] = {"r": spec.lora_r, "alpha": 2.0 * spec.lora_r, "dropout": 0.0, "target_modules": "all-linear"}
    return recipe


def grpolab_config(
    spec: Spec, out: str, precision: str | None = None, model: str | None = None, engine: str = "native"
):
    """The validated grpolab Config of the setting (ConfigError, exit 2, naming the key)."""
    from grpolab.training.config import build_config

    return build_config(grpolab_recipe(spec, out, precision, model, engine))


__all__ = [
    "INSTALL_TRL",
    "LOGP_TOL",
    "SETTINGS",
    "Spec",
    "bench_reward",
    "bench_task",
    "check",
    "grpolab_config",
    "parse_spec",
    "step_prompts",
]
