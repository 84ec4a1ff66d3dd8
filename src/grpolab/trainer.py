"""Old import path, kept for users' code: the loop around the step is grpolab.training.trainer."""

from grpolab.training.trainer import evaluate, setup, train  # noqa: F401
