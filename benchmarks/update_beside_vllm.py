"""Does a started vLLM slow the trainer's own passes in the same process? One bf16 forward+backward of
the bundled model (16 sequences x 96 tokens), 3 times before and 3 times after vLLM's CPU build starts.

    python benchmarks/update_beside_vllm.py [nobind]

`nobind`: VLLM_CPU_OMP_THREADS_BIND=nobind (vLLM does not bind its threads to cores). Prints the
seconds of each pass before and after, and torch's thread count.
"""

import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import torch  # noqa: E402

from grpolab.model.load import load_policy, model_dir  # noqa: E402


def main() -> None:
    path = model_dir("smollm2-135m", log=lambda *a: None)
    model = load_policy(path, torch.device("cpu"))
    ids = torch.randint(5, 1000, (16, 96))

    def forward_backward() -> float:
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits
        logits.float().logsumexp(-1).mean().backward()
        model.zero_grad()
        return time.perf_counter() - t

    forward_backward()
    print("before vLLM:", [round(forward_backward(), 2) for _ in range(3)], "threads", torch.get_num_threads(), flush=True)
    if sys.argv[1:] == ["nobind"]:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    from vllm import LLM

    LLM(model=str(path), dtype="bfloat16", seed=0, logprobs_mode="processed_logprobs", enable_prefix_caching=True,
        skip_tokenizer_init=True)
    print("after vLLM: ", [round(forward_backward(), 2) for _ in range(3)], "threads", torch.get_num_threads(), flush=True)


if __name__ == "__main__":
    main()
