"""Layer 3, the network: loading (local directory, GGUF, the bundled default), LoRA, the reference and
the critic, the chat template, the log-prob passes, precision and the planner's shapes and bytes. Every
forward pass over whole groups has one owner: grpolab.model.passes. The decode loop that samples
rollouts is the native engine's (grpolab.engine.native).
"""
