# ruff: noqa: UP006, UP035, B006 -- written in the style of the project it imitates (typing.Dict, extras={})
"""An environment written the way SkyRL-gym's are (NovaSky-AI/SkyRL, skyrl_gym): built per trajectory
from (env_config, extras), started by init(prompt) -> (prompt, metadata), stepped with the model's text
and answering with a dict of observations, reward, done and metadata. skyrl_gym is not installed here,
so its small BaseTextEnv is restated below in its shape; nothing here knows grpolab.
"""

from typing import Any, Dict, List, Tuple

ConversationType = List[Dict[str, str]]


class BaseTextEnv:
    def __init__(self):
        self.turns = 0
        self.max_turns = 1

    def step(self, action: str) -> Dict[str, Any]:
        raise NotImplementedError

    def init(self, prompt: ConversationType) -> Tuple[ConversationType, Dict[str, Any]]:
        return prompt, {}

    def close(self):
        pass


class OneWordEnv(BaseTextEnv):
    """Say the ground-truth word; each wrong turn gets a hint until max_turns."""

    def __init__(self, env_config, extras: Dict[str, Any] = {}):
        super().__init__()
        reward_spec = extras.get("reward_spec", {})
        assert "ground_truth" in reward_spec, "reward_spec.ground_truth is required"
        self.ground_truth = reward_spec["ground_truth"]
        self.max_turns = int(env_config.max_turns)
        self.hint = env_config.get("hint", "Try again.")

    def init(self, prompt):
        return [{"role": "system", "content": "Answer with one word."}] + prompt, {}

    def step(self, action: str):
        self.turns += 1
        reward = 1.0 if self.ground_truth.lower() in action.lower() else 0.0
        done = self.turns >= self.max_turns or reward == 1.0
        return {
            "observations": [] if done else [{"role": "user", "content": self.hint}],
            "reward": reward,
            "done": done,
            "metadata": {"turns": self.turns},
        }


def turns_used(environments, **kwargs):
    """A TRL-form reward that reads the SkyRL instances."""
    return [float(env.turns) for env in environments]
