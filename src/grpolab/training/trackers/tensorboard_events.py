"""TensorBoard: event files under OUT/tb (`tensorboard --logdir OUT/tb`).

Metrics are scalars under their own names; the config is a text entry (`config`, its YAML); a table is a
text entry of its name holding a Markdown table, one per step it was logged at. A resumed run purges the
events logged after the step it continues from (purge_step), so a re-done step is not drawn twice.
"""

from __future__ import annotations

import yaml
from torch.utils.tensorboard import SummaryWriter

from grpolab.training.trackers.base import Tracker, TrackerContext, scalars, table_data


def markdown_table(rows: list[dict]) -> str:
    """Rows as a Markdown table (TensorBoard's text plugin renders it); `|` and line breaks in a cell escaped."""
    cols, data = table_data(rows)

    def esc(x) -> str:
        return "" if x is None else str(x).replace("|", "\\|").replace("\r", "").replace("\n", "<br>")

    lines = ["| " + " | ".join(esc(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(esc(x) for x in row) + " |" for row in data]
    return "\n".join(lines)


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def start(self, ctx: TrackerContext) -> dict:
        purge = ctx.resume_step + 1 if ctx.resume_step is not None else None
        self.writer = SummaryWriter(str(ctx.out / "tb"), purge_step=purge)
        if ctx.resume_step is None:
            text = yaml.safe_dump(ctx.config, sort_keys=False)
            self.writer.add_text("config", "```\n" + text + "\n```", 0)
        return {}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for k, v in scalars(metrics).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def log_table(self, name: str, rows: list[dict], step: int) -> None:
        if rows:
            self.writer.add_text(name, markdown_table(rows), step)
            self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


TRACKER = TensorBoardTracker
