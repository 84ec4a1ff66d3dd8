"""grpolab report: one self-contained HTML page per run or comparison (docs/report.md).

    runs = load_runs(dirs)            grpolab.app.report.load: metrics, samples, config, summary
    plots = all_plots(runs)           grpolab.app.report.plots: matplotlib PNGs, one per panel
    html = render(runs, plots)        grpolab.app.report.page (+ credit.py: the token-level view)

`write_report` writes the page and each plot as a PNG beside it (NAME_plots/SLUG.png). The per-token
values the credit view shows are saved by `grpolab train` (grpolab.training.token_credit).
matplotlib is imported only when plots are drawn: importing this package needs nothing extra.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from grpolab.app.report.load import RunData, load_run, load_runs


def write_run_report(out: Path, device) -> None:
    """OUT/report.html of one run: what `grpolab train` writes at the end (cfg.report)."""
    write_report([out], out / "report.html", machine=machine_info(device))


def machine_info(device) -> dict:
    """What the run ran on (no host name): OS, CPU count, torch version and the device."""
    import torch

    info = {
        "os": platform.platform(terse=True),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
    }
    if getattr(device, "type", str(device)) == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def write_report(
    run_dirs: list[str | Path], out: str | Path, *, machine: dict | None = None, runs: list[RunData] | None = None
) -> Path:
    """Write the report of `run_dirs` (several: overlaid) to `out` and its PNGs to OUT-STEM_plots/.

    `machine` (grpolab train passes machine_info) is saved as machine.json in the single run
    directory, so that a later `grpolab report` names the machine too. `runs`: the runs already
    loaded (load_runs(run_dirs)), to read them once. Raises ConfigError for a
    directory that is not a run, MissingPlotting when matplotlib is not installed.
    """
    from grpolab.app.report.page import render
    from grpolab.app.report.plots import all_plots
    from grpolab.util.fileio import atomic_write

    if machine is not None and len(run_dirs) == 1:
        atomic_write(Path(run_dirs[0]) / "machine.json", json.dumps(machine, indent=2))
    if runs is None or machine is not None:
        runs = load_runs(run_dirs)
    plots = all_plots(runs)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    png_dir = out.with_name(f"{out.stem}_plots")
    png_dir.mkdir(exist_ok=True)
    for plot in plots:
        if plot.png is not None:
            atomic_write(png_dir / f"{plot.slug}.png", plot.png, fsync=False)
    atomic_write(out, render(runs, plots), fsync=False)
    return out


__all__ = ["RunData", "load_run", "load_runs", "machine_info", "write_report"]
