"""Run by tests/test_distributed.py, as one process or under torchrun: `grpolab train` with a rollout
that is a fixed function of (prompt, sample index), so that one process with 2k prompts and two
processes with k prompts each see exactly the same completions and rewards.

    python tests/ddp_worker.py OUT MODEL_DIR PROMPTS_PER_STEP [KEY=VALUE ...]
    python tests/ddp_worker.py --resume OUT [KEY=VALUE ...]

--sampled anywhere keeps the model's own sampled rollouts instead.

GRPOLAB_TEST_HOLD=RANK:STEP:FILE (the elastic tests): the first worker of that rank to reach that step
writes its pid to FILE (which must not exist yet) and then waits there, at most 120 s, to be killed.
"""

import hashlib
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_helpers import varied_score  # noqa: E402

from grpolab import rewards
from grpolab.app.cli import main
from grpolab.batch import Rollout
from grpolab.engine.native import engine as native
from grpolab.model.cache import left_pad


def fixed_generate(model, tokenizer, prompt_ids, *, G, max_new_tokens, eos_ids=None, **kw):
    """Completions that depend only on the prompt's tokens and the sample's index within its group."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids, mask = left_pad(prompt_ids, pad)
    rows, lengths = [], []
    for p in prompt_ids:
        for j in range(G):
            seed = int.from_bytes(hashlib.sha256(f"{p}|{j}".encode()).digest()[:8], "little")
            g = torch.Generator().manual_seed(seed)
            n = int(torch.randint(1, max_new_tokens + 1, (1,), generator=g))
            rows.append(torch.randint(100, 5000, (n,), generator=g))
            lengths.append(n)
    C = max(lengths)
    comp = torch.full((len(rows), C), pad, dtype=torch.long)
    cmask = torch.zeros((len(rows), C))
    for i, r in enumerate(rows):
        comp[i, : len(r)] = r
        cmask[i, : len(r)] = 1.0
    texts = tokenizer.batch_decode([r.tolist() for r in rows], skip_special_tokens=True)
    return Rollout(
        ids.repeat_interleave(G, 0),
        mask.repeat_interleave(G, 0),
        comp,
        cmask,
        torch.zeros_like(cmask),
        torch.tensor([n == max_new_tokens for n in lengths]),
        texts,
        G,
    )


def hold_at_a_step() -> None:
    """GRPOLAB_TEST_HOLD: the first worker of a rank to reach a step writes its pid and waits to be killed."""
    from grpolab.training import trainer

    rank, at, path = os.environ["GRPOLAB_TEST_HOLD"].split(":", 2)
    real = trainer.train_step

    def held(run, step_no):
        if step_no == int(at) and os.environ.get("RANK") == rank:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:  # held once already: a restarted or relaunched worker goes on
                return real(run, step_no)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            time.sleep(120)
            raise SystemExit("GRPOLAB_TEST_HOLD: nobody killed this worker")
        return real(run, step_no)

    trainer.train_step = held


def uneven_score(completion: str, example) -> float:
    """varied_score, but 0 for every completion of the prompts whose (salted) hash is even: their groups
    carry no signal and are not computed, so the ranks have different numbers of micro-batches to run
    (with seed 0 and 2 x 2 arithmetic prompts: rank 0 none and rank 1 two at step 1, one and two at step 2)."""
    even = hashlib.sha256(f"46|{example.prompt}".encode()).digest()[0] % 2 == 0
    return 0.0 if even else varied_score(completion, example)


if __name__ == "__main__":
    if "--sampled" in sys.argv:  # the model's own rollouts (sampled on each rank), not fixed_generate
        sys.argv.remove("--sampled")
    else:
        native.generate = fixed_generate  # the native engine's decode loop (grpolab.engine.native.engine)
    rewards.REWARDS["test_varied"] = lambda: varied_score
    rewards.REWARDS["test_uneven"] = lambda: uneven_score
    if os.environ.get("GRPOLAB_TEST_HOLD"):
        hold_at_a_step()
    if sys.argv[1] == "--resume":  # python tests/ddp_worker.py --resume OUT [KEY=VALUE ...]
        sys.exit(main(["train", *sys.argv[1:]]))
    out, model, prompts, *extra = sys.argv[1:]
    G = 4
    sys.exit(
        main(
            [
                "train",
                f"model={model}",
                f"out={out}",
                f"batch_size={int(prompts) * G}",
                f"G={G}",
                "max_new_tokens=6",
                "micro_batch=4",
                "eval_size=0",
                "progress=false",
                "tensorboard=false",
                "samples_per_step=0",
                "report=false",
                "lr=1e-3",
                "rewards=[{name: test_varied}]",
                "threads=1",
                *extra,
            ]
        )
    )
