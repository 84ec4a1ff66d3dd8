"""The lean decode step of this tree against another commit's, in one process: same logits? how fast?

    git worktree add /tmp/base <commit>
    .venv/bin/python benchmarks/decode_ab.py /tmp/base [--rounds 6] [--steps 48]

Loads the other tree's lean decoder (grpolab/engine/native/decoder.py, or where an older tree kept it) as a second module (everything else is this tree's) and
runs both on the bundled SmolLM2-135M-Instruct in bf16 (oneDNN-packed weights, as the rollout runs it),
after timing each tree's `weights_of` (the weight layout a rollout starts with) six times, alternating:
2 prompts of 46 tokens, prefill, repeated to 16 rows, then --steps decode steps. First it checks that
both give the same logits bit for bit (bf16 and fp32, a left-padded prefill and 5 greedy steps), then
it alternates the two for --rounds rounds and prints the median milliseconds per 16-row decode step
(prefill excluded). Alternating in one process is what makes a few percent visible on a shared machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch


def load_decoder(tree: str):
    src = Path(tree) / "src" / "grpolab"
    path = next((p for p in (src / "engine" / "native" / "decoder.py", src / "model" / "decoder.py", src / "decoder.py")
                 if p.exists()), src / "engine" / "native" / "decoder.py")
    spec = importlib.util.spec_from_file_location("grpolab_decoder_other", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def greedy_logits(dec, model, dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 40000, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    st = dec.LeanStepper(dec.weights_of(model, dtype), 8)
    out = [st.prefill(ids, mask, pos)]
    st.repeat(3)
    p, tok = pos[:, -1].repeat_interleave(3), out[0].argmax(-1).repeat_interleave(3)
    for _ in range(5):
        p = p + 1
        out.append(st.step(tok, p))
        tok = out[-1].argmax(-1)
    return out


def ms_per_step(dec, w, steps: int) -> float:
    st = dec.LeanStepper(w, steps)
    ids = torch.randint(0, 40000, (2, 46))
    mask = torch.ones_like(ids)
    pos = mask.cumsum(-1) - 1
    st.prefill(ids, mask, pos)
    st.repeat(8)
    p, tok = pos[:, -1].repeat_interleave(8), torch.randint(0, 40000, (16,))
    t = time.perf_counter()
    for _ in range(steps):
        p = p + 1
        st.step(tok, p)
    return (time.perf_counter() - t) / steps * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("other", help="a worktree of the commit to compare against")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=48)
    a = ap.parse_args()

    from grpolab.engine.native import decoder as ours
    from grpolab.model.load import load_policy, model_dir
    from grpolab.parallel.allocator import keep_freed_memory

    keep_freed_memory()  # as the training process runs
    other = load_decoder(a.other)
    model = load_policy(model_dir("smollm2-135m", log=lambda *_: None), torch.device("cpu")).eval()
    torch.set_grad_enabled(False)
    for dtype in (torch.bfloat16, torch.float32):
        x, y = greedy_logits(ours, model, dtype), greedy_logits(other, model, dtype)
        same = all(torch.equal(u, v) for u, v in zip(x, y))
        diff = max(float((u.float() - v.float()).abs().max()) for u, v in zip(x, y))
        print(f"{str(dtype)[6:]} logits, this tree vs {a.other}: identical {same} (max |diff| {diff:.3g})")
    mods = {"this tree": ours, a.other: other}
    layout: dict[str, list[float]] = {k: [] for k in mods}
    for _ in range(6):  # the per-rollout weight layout (cast, fuse, oneDNN reorder), alternating
        for name, dec in mods.items():
            t = time.perf_counter()
            dec.weights_of(model, torch.bfloat16)
            layout[name].append(time.perf_counter() - t)
    for name, ts in layout.items():
        print(f"{name:>20s}: weights_of {statistics.median(ts[1:]):.3f} s (bf16, median of 5 after one warm-up)")
    ws = {"this tree": ours.weights_of(model, torch.bfloat16), a.other: other.weights_of(model, torch.bfloat16)}
    times: dict[str, list[float]] = {k: [] for k in ws}
    for _ in range(a.rounds):
        for name, dec in (("this tree", ours), (a.other, other)):
            times[name].append(ms_per_step(dec, ws[name], a.steps))
    for name, ts in times.items():
        print(f"{name:>20s}: {statistics.median(ts):6.2f} ms per 16-row decode step (median of {a.rounds}; "
              f"{', '.join(f'{t:.1f}' for t in ts)})")
    print(f"ratio this tree / other: {statistics.median(times['this tree']) / statistics.median(times[a.other]):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
