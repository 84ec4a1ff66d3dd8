"""Old import path, kept for users' code: the rollout now lives in grpolab.model.generate (the loop),
grpolab.batch (Rollout) and grpolab.model.template (chat_prompts)."""

from grpolab.batch import Rollout, concat_rollouts  # noqa: F401
from grpolab.model.generate import eos_token_ids, generate  # noqa: F401
from grpolab.model.template import chat_prompts  # noqa: F401
