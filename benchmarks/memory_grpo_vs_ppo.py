"""GRPO vs PPO peak memory: moved to grpolab.app.lab.memory (`grpolab lab memory [--steps N] [--model M]`)."""
import sys

from grpolab.app.lab.memory import run

if __name__ == "__main__":
    run(sys.argv[1:])
