"""Long evaluations say where they are (``callbacks.run_clock.RunClock``): progress lines when stdout is not a
terminal, and the run's model passes with their share of the wall time, printed and in ``metrics.meta.json``."""
from __future__ import annotations

import io
import json
import re
import time

import pytest
import torch

from callbacks.run_clock import RunClock, format_seconds
from tests.test_evaluate import run_evaluate, tiny_args


def test_a_non_interactive_run_prints_progress_lines_and_its_model_passes(tmp_path):
    args = tiny_args(tmp_path, test_size=6, batch_size=2) + ["--progress_interval", "0.05"]
    result = run_evaluate(args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("[progress]")]
    assert lines, result.stdout[-2000:]
    pattern = re.compile(r"\[progress\] (\d)/6 samples \([\d.]+%\) \| \S+ elapsed(, about \S+ left)? \| now: (.+)")
    parsed = [pattern.fullmatch(line) for line in lines]
    assert all(parsed), lines
    done = [int(m.group(1)) for m in parsed]
    assert done == sorted(done) and all(d in (0, 2, 4, 6) for d in done)
    assert all((m.group(2) is not None) == (int(m.group(1)) > 0) for m in parsed)   # an estimate once a batch is done
    steps = {m.group(3) for m in parsed}
    assert steps <= {"starting", "explaining", "explaining: rollout", "explaining: gradcam", "explaining: random",
                     "explaining: beyond_intuition_token", "PerturbationTest", "CleanAccuracyTest",
                     "SegmentationTest", "HeatmapOverlays", "ProgressCheckpoint", "ResultsReporter"}, steps
    meta = json.loads((tmp_path / "run" / "metrics.meta.json").read_text())
    run = meta["run"]
    assert set(run) == {"model_passes", "model_pass_rows", "model_pass_seconds", "wall_seconds", "model_pass_share"}
    assert run["model_passes"] >= 3 and run["model_pass_rows"] >= 6   # at least the clean pass of each batch
    assert 0 < run["model_pass_seconds"] <= run["wall_seconds"] and 0 < run["model_pass_share"] <= 1
    summary = re.search(r"\[run\] 6 samples in \S+: (\d+) model passes \((\d+) rows\) took \S+ \(([\d.]+)% of the "
                        r"wall time\)", result.stdout)
    assert summary and int(summary.group(1)) == run["model_passes"] and int(summary.group(2)) == run["model_pass_rows"]
    assert "metrics.json" not in meta and set(json.loads((tmp_path / "run" / "metrics.json").read_text()))


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Trainer:
    """What RunClock reads of a trainer."""

    def __init__(self, size: int, callbacks=()):
        self.test_dataloaders = torch.utils.data.DataLoader(list(range(size)))
        self.world_size, self.global_rank, self.is_global_zero = 1, 0, True
        self.callbacks = list(callbacks)


class _Module(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = torch.nn.Linear(3, 2)


def test_model_passes_are_counted_once_per_outer_call_and_lines_follow_the_stream():
    module, out = _Module(), io.StringIO()
    clock = RunClock(interval_s=0.02, stream=out)
    trainer = _Trainer(8, [clock])
    clock.on_test_start(trainer, module)
    module.model(torch.zeros(4, 3))
    module.model(torch.zeros(2, 3))
    clock.on_test_batch_end(trainer, module, None, {"label": torch.zeros(4)}, 0)
    time.sleep(0.1)
    clock.on_test_end(trainer, module)
    assert clock.facts["model_passes"] == 2 and clock.facts["model_pass_rows"] == 6
    assert "[progress] 4/8 samples (50.0%)" in out.getvalue() and "left" in out.getvalue()
    module.model(torch.zeros(1, 3))   # the hooks are gone after the run
    assert clock.facts["model_passes"] == 2
    terminal = _Terminal()
    quiet = RunClock(interval_s=0.02, stream=terminal)
    quiet.on_test_start(trainer, module)
    time.sleep(0.1)
    quiet.on_test_end(trainer, module)
    assert "[progress]" not in terminal.getvalue() and "[run] 0 samples" in terminal.getvalue()


def test_the_estimate_extrapolates_the_time_per_sample():
    clock = RunClock(interval_s=1)
    clock._total, clock._done, clock._start = 10, 4, time.perf_counter() - 40
    assert re.fullmatch(r"\[progress\] 4/10 samples \(40\.0%\) \| 40s elapsed, about 1m00s left \| now: starting",
                        clock.line())
    assert format_seconds(3725) == "1h02m05s"
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        RunClock(interval_s=0)
