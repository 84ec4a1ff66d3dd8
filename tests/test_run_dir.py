"""Which directory a run is written into: never through a symbolic link, never into a directory
holding something else, and the command line says so with exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpolab.training.metrics import JsonlWriter, MetricsLogger, check_out_dir
from grpolab.util.fields import ConfigError
from grpolab.util.fileio import atomic_write

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim.txt"
    v.write_text("precious\n")
    d = tmp_path / "victim_dir"
    d.mkdir()
    return v, d


def test_links_in_a_new_run_directory_are_refused(tmp_path, victim):
    """A non-run directory prepared with `samples.jsonl -> victim` and `tb -> victim_dir`: both
    were followed (appended to, written into); now the directory is refused before anything is written."""
    v, d = victim
    out = tmp_path / "out"
    out.mkdir()
    (out / "samples.jsonl").symlink_to(v)
    with pytest.raises(ConfigError, match="samples.jsonl is a symbolic link"):
        check_out_dir(out, resume=False)
    (out / "samples.jsonl").unlink()
    (out / "tb").symlink_to(d)
    with pytest.raises(ConfigError, match="tb is a symbolic link"):
        check_out_dir(out, resume=False)
    assert v.read_text() == "precious\n" and os.listdir(d) == []


def test_a_new_run_goes_only_into_a_new_or_empty_directory(tmp_path):
    assert check_out_dir(tmp_path / "new", resume=False) is False
    empty = tmp_path / "empty"
    empty.mkdir()
    assert check_out_dir(empty, resume=False) is False
    (empty / "dataset.jsonl").write_text('{"prompt": "p", "answer": "a"}\n')  # grpolab.train's own rows
    assert check_out_dir(empty, resume=False) is False
    (empty / "notes.txt").write_text("mine\n")
    with pytest.raises(ConfigError, match="is not empty and holds no run \\(notes.txt\\)"):
        check_out_dir(empty, resume=False)
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="is not a directory"):
        check_out_dir(f, resume=False)


def test_a_resumed_run_with_a_linked_file_is_refused(tmp_path, victim):
    v, _ = victim
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("steps: 2\n")
    assert check_out_dir(out, resume=True) is True
    (out / "metrics.jsonl").symlink_to(v)
    with pytest.raises(ConfigError, match="metrics.jsonl is a symbolic link"):
        check_out_dir(out, resume=True)


def test_run_files_are_never_opened_through_a_link(tmp_path, victim):
    """Even past the directory check (a link planted while the run starts): O_NOFOLLOW."""
    v, d = victim
    (tmp_path / "samples.jsonl").symlink_to(v)
    with pytest.raises(ConfigError, match="symbolic link"):
        JsonlWriter(tmp_path / "samples.jsonl")
    with pytest.raises(ConfigError, match="symbolic link"):
        JsonlWriter(tmp_path / "samples.jsonl", keep_until_step=3)
    out = tmp_path / "run"
    out.mkdir()
    (out / "tb").symlink_to(d)
    with pytest.raises(ConfigError, match="tb is a symbolic link"):
        MetricsLogger(out, report_to=["tensorboard"])
    assert v.read_text() == "precious\n" and os.listdir(d) == []


def test_atomic_write_uses_an_unpredictable_exclusive_temporary_name(tmp_path, victim, monkeypatch):
    """The temporary name was `.tmp-NAME.PID`: a link planted there was written through."""
    v, _ = victim
    target = tmp_path / "summary.json"
    (tmp_path / f".tmp-summary.json.{os.getpid()}").symlink_to(v)
    names = []
    real_replace = os.replace

    def spy(src, dst):
        names.append(os.path.basename(src))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    atomic_write(target, "{}\n")
    atomic_write(target, '{"a": 1}\n')
    assert v.read_text() == "precious\n"
    assert target.read_text() == '{"a": 1}\n' and not target.is_symlink()
    assert len(set(names)) == 2 and all(n.startswith(".tmp-summary.json.") for n in names)
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask


def _cli(args, cwd):
    env = {
        **os.environ,
        "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "grpolab.app.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("text", ["- 1\n", "steps: [1\n", b"steps: \xff\xfe\n", "just a string\n"])
def test_resume_of_a_tampered_config_is_a_usage_error(tmp_path, text):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
    res = _cli(["train", "--resume", str(out)], tmp_path)
    assert res.returncode == 2, (res.stdout[-1000:], res.stderr[-2000:])
    assert "config.yaml" in res.stderr and "Traceback" not in res.stderr


def test_out_that_cannot_be_created_or_holds_links_is_a_usage_error(tmp_path, tiny_model_dir, victim):
    v, _ = victim
    res = _cli(
        [
            "train",
            f"model={tiny_model_dir}",
            "steps=1",
            "G=2",
            "batch_size=2",
            "max_new_tokens=4",
            "eval_size=0",
            "out=/proc/grpolab-no-such-dir",
        ],
        tmp_path,
    )
    assert res.returncode == 2, (res.stdout[-1000:], res.stderr[-2000:])
    assert "cannot create /proc/grpolab-no-such-dir" in res.stderr and "Traceback" not in res.stderr
    out = tmp_path / "prepared"
    out.mkdir()
    (out / "samples.jsonl").symlink_to(v)
    res = _cli(["train", f"model={tiny_model_dir}", "steps=1", f"out={out}"], tmp_path)
    assert res.returncode == 2 and "samples.jsonl is a symbolic link" in res.stderr, res.stderr[-2000:]
    assert v.read_text() == "precious\n"
