"""grpolab: reinforcement learning from verifiable rewards, from REINFORCE to GRPO and its refinements."""

__version__ = "0.1.0"
