"""Does TRL 1.16 train with use_vllm=True, vllm_mode="colocate" on vLLM's CPU build? A 2-step GRPOTrainer on a
local model directory (a tiny Llama with 32-wide heads: grpolab's make_tiny_model(hidden=128)).

    python benchmarks/trl_vllm_colocate.py MODEL_DIR

On 2026-12-02 (vLLM 0.32.0 CPU, TRL 1.16.0): vLLM starts, the first weight sync fails (docs/performance.md,
"Rollout engines").
"""
import os
import sys
import time
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("RANK", "0"); os.environ.setdefault("LOCAL_RANK", "0"); os.environ.setdefault("WORLD_SIZE", "1")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29533")
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
model = sys.argv[1]
ds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i}+{i}?"}]} for i in range(8)])
def reward(completions, **kw): return [float(len(c[0]["content"]) % 3) for c in completions]
args = GRPOConfig(output_dir="/tmp/trl-vllm", per_device_train_batch_size=8, num_generations=4, max_completion_length=16,
                  max_steps=2, use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, report_to=[],
                  use_cpu=True, logging_steps=1, save_strategy="no", bf16=False)
t = time.time()
tr = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds)
print("init", time.time() - t, flush=True)
tr.train()
print("done", time.time() - t)
