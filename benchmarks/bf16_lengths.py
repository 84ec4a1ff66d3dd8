"""Mean completion length sampled from the untrained bundled model in fp32 vs under bf16 autocast.

    .venv/bin/python benchmarks/bf16_lengths.py

8 arithmetic prompts (the demo's task, seed 1) x G = 8, up to 32 new tokens, EOS on, for seeds 0-2; one
line per seed and the mean (standard deviation over seeds) per precision: whether bf16 sampling by
itself shortens completions (docs/performance.md, "Learning unchanged").
"""
import random
import statistics

import torch

from grpolab.engine.native.generate import eos_token_ids, generate
from grpolab.model.load import load_policy, load_tokenizer, model_dir
from grpolab.model.template import chat_prompts
from grpolab.tasks import build_task

path = model_dir("smollm2-135m", log=lambda *a: None); tok = load_tokenizer(path); m = load_policy(path, torch.device("cpu"))
task = build_task("arithmetic", 0, {"min_digits": 1, "max_digits": 2})
ex = task.sample(8, random.Random(1))
ids = chat_prompts(tok, [e.prompt for e in ex], task.system_prompt)
eos = eos_token_ids(m, tok)
res = {"fp32": [], "bf16": []}
for seed in range(3):
    for name, dt in (("fp32", None), ("bf16", torch.bfloat16)):
        g = torch.Generator().manual_seed(seed)
        r = generate(m, tok, ids, G=8, max_new_tokens=32, autocast_dtype=dt, generator=g, eos_ids=eos)
        res[name].append(float(r.lengths.mean()))
    print(seed, {k: v[-1] for k, v in res.items()}, flush=True)
print({k: (round(statistics.mean(v),2), round(statistics.stdev(v),2)) for k, v in res.items()})
