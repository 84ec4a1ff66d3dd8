"""grpolab's own rollout engine: the decode loop on the policy and everything only it uses.

- `engine`     NativeEngine, the loop behind the engine seam (grpolab.engine.base).
- `session`    what both decode loops set up: left-padded prompts, the stepper, EOS ids.
- `steppers`   one decode step: the model's own forward (HFStepper) or the lean step; the rule that picks one.
- `generate`   the decode loop: prefill once per group, finished rows leave the batch.
- `turns`      multi-turn decoding: the model's turns and the environment's tokens on one KV cache.
- `sampling`   temperature, top-k, top-p, min-p, the repetition penalty, and the sampled token's log-prob.
- `decoder`    the lean decode step (Llama, Qwen2, Mistral) and its KV cache; `kernels/` its C attention.
- `probe`      the timing of one rollout for precision=auto.

This __init__ imports nothing: grpolab.engine.base reads `sampling` while `engine` reads the seam.
"""
