"""Layer 3, the network: loading (local directory, GGUF, the bundled default), LoRA, the reference and
the critic, generation (sampling, KV cache, the decode loop, the lean decoder and its C kernel), the
log-prob passes and precision. Every forward pass over whole groups has one owner: grpolab.model.passes.
"""
