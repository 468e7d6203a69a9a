"""Resumable evaluation (``evaluate.py --progress_every N``, ``--resume <run folder>``; callbacks/progress.py).

A run killed mid-way and resumed writes the ``metrics.json`` of an uninterrupted run: a real ``evaluate.py``
subprocess is SIGKILLed after its first progress checkpoints, on 1 process and on 2 (DDP on CPU, where one process
has finished its share before the kill and has nothing left after it), then resumed. Unit tests: the checkpoint
round trip of every evaluation callback (metrics built lazily included) and of a callback's extra state, the split
of a resumed run, corrupt or truncated progress files, resuming a folder without progress, and a resume whose
command line changes the evaluation.

The runs stop deterministically through :class:`StopAt`, a callback the test adds to the run's config: it stops
(raises, or waits to be killed) at a given batch of a given process, only while ``STOP_ENV`` is set, so the resumed
run (same config) does not stop. The classifier is a random tiny timm ViT, the data the synthetic shapes benchmark.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = "{img_size: 32, patch_size: 8, embed_dim: 32, depth: 4, num_heads: 2, num_classes: 4}"
STOP_ENV = "TOKEN_ATTRIBUTIONS_TEST_STOP"
DDP = ["--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu"]


class StopAt(pl.Callback):
    """Test helper: while ``$TOKEN_ATTRIBUTIONS_TEST_STOP`` is set (JSON ``{"rank", "batch", "how", "wait_for"}``),
    process ``rank`` stops at the end of its batch ``batch`` (before the progress checkpoint of that batch): it
    first waits until the files ``wait_for`` exist, then raises (``how: raise``) or sleeps until it is killed
    (``how: pause``)."""

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        spec = json.loads(os.environ.get(STOP_ENV) or "null")
        if not spec or trainer.global_rank != spec["rank"] or batch_idx != spec["batch"]:
            return
        deadline = time.monotonic() + 300
        while not all(Path(p).exists() for p in spec.get("wait_for", [])):
            if time.monotonic() > deadline:
                raise TimeoutError(f"StopAt: {spec['wait_for']} did not appear")
            time.sleep(0.05)
        if spec["how"] == "raise":
            raise RuntimeError("StopAt: run stopped by the test")
        while True:
            time.sleep(1)


def tiny_args(run_dir, every=1, test_size=5, batch_size=2, logger=False):
    return (["--trainer.logger", "false"] if not logger else []) + [
            "--model.classifier", "timm:vit_tiny_patch16_224", "--model.pretrained", "false",
            "--model.model_kwargs", TINY_MODEL, "--model.methods", "[rollout, gradcam]",
            "--data.init_args.image_size", "32", "--data.init_args.test_size", str(test_size),
            "--data.init_args.batch_size", str(batch_size),
            "--trainer.default_root_dir", str(Path(run_dir).parent), "--output_dir", str(run_dir),
            "--progress_every", str(every), "--trainer.callbacks+=tests.test_resume.StopAt"]


def evaluate_main(args, monkeypatch, stop=None):
    """``evaluate.main(args)`` in this process (1 process), stopped as ``stop`` says (:class:`StopAt`). A resume
    trusts its run folder, whose config names :class:`StopAt` (a class outside the project's packages)."""
    import evaluate

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("CI", "1")
    if stop is None:
        monkeypatch.delenv(STOP_ENV, raising=False)
    else:
        monkeypatch.setenv(STOP_ENV, json.dumps(stop))
    torch.set_num_threads(1)
    return evaluate.main(list(args) + (["--trust_run_config"] if "--resume" in args else []))


def load(path):
    return json.loads(Path(path).read_text())


def assert_same_metrics(got, expected, atol=0.0):
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        if atol == 0.0:
            assert got[key] == value, (key, got[key], value)
        else:
            a, b = torch.tensor(got[key], dtype=torch.float64), torch.tensor(value, dtype=torch.float64)
            assert a.shape == b.shape and torch.allclose(a, b, atol=atol, rtol=0, equal_nan=True), key


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """``metrics.json`` of an uninterrupted 1-process run of the tiny config (in this process)."""
    run = tmp_path_factory.mktemp("reference") / "run"
    mp = pytest.MonkeyPatch()
    try:
        evaluate_main(tiny_args(run, every=2), mp)
    finally:
        mp.undo()
    assert not (run / "progress").exists(), "a finished run keeps no progress"
    return load(run / "metrics.json")


# ------------------------------------------------------------------------------------------ killed subprocesses
def _popen(args, stop):
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline", WANDB_SILENT="true", CI="1")
    env[STOP_ENV] = json.dumps(stop)
    return subprocess.Popen([sys.executable, str(ROOT / "evaluate.py"), *args], cwd=str(ROOT), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _kill_when(proc, files, timeout=300):
    """SIGKILL the process group of ``proc`` (DDP children included) once ``files`` exist."""
    deadline = time.monotonic() + timeout
    while not all(Path(f).exists() for f in files):
        if proc.poll() is not None:
            pytest.fail(f"evaluate.py ended before it was killed:\n{proc.stdout.read()[-4000:]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"{files} did not appear")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def _resume(run):
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline", WANDB_SILENT="true", CI="1")
    env.pop(STOP_ENV, None)
    return subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "--resume", str(run), "--trust_run_config"],
                          cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=600)


def _done(run, rank):
    return torch.load(run / "progress" / f"rank{rank}.pt", weights_only=True)["done"].tolist()


def test_killed_run_resumes_to_the_uninterrupted_metrics_on_one_process(reference, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    # batches [0, 1], [2, 3], [4]: killed while in the second (only the first is checkpointed)
    proc = _popen(tiny_args(run), {"rank": 0, "batch": 1, "how": "pause"})
    _kill_when(proc, [run / "progress" / "rank0.pt"])
    assert _done(run, 0) == [0, 1] and not (run / "metrics.json").exists()
    capsys.readouterr()
    evaluate_main(["--resume", str(run)], monkeypatch)   # 1 process: resumed in this process
    assert f"resuming {run}: 2 of 5 samples done" in capsys.readouterr().out
    assert_same_metrics(load(run / "metrics.json"), reference)   # bit for bit: same batches, same sums
    assert not (run / "progress").exists()


def test_killed_ddp_run_resumes_to_the_uninterrupted_metrics_on_two_processes(reference, tmp_path):
    run = tmp_path / "run"
    # rank 0: samples 0, 2, 4 in batches [0, 2], [4]; rank 1: 1, 3 in one batch. Killed while rank 0 is in its
    # last batch and rank 1 is done: after the resume rank 1 has nothing left and still takes part in the reduction
    rank1 = run / "progress" / "rank1.pt"
    proc = _popen(tiny_args(run) + DDP, {"rank": 0, "batch": 1, "how": "pause", "wait_for": [str(rank1)]})
    _kill_when(proc, [run / "progress" / "rank0.pt", rank1])
    assert _done(run, 0) == [0, 2] and _done(run, 1) == [1, 3]
    with pytest.raises(SystemExit, match=r"changes the evaluation of the run \(trainer.devices: '2' -> '1'\)"):
        evaluate_main(["--resume", str(run), "--trainer.devices", "1"], pytest.MonkeyPatch())
    result = _resume(run)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"resuming {run}: 4 of 5 samples done (2 of 2 processes saved progress)" in result.stdout
    # 2 processes sum in another order than 1: equal up to float64 rounding (and float32 maps of other batches)
    assert_same_metrics(load(run / "metrics.json"), reference, atol=1e-6)
    assert not (run / "progress").exists()


# ------------------------------------------------------------------------------------------ in-process runs
def test_crashed_run_resumes_and_the_resume_keeps_its_config(reference, tmp_path, monkeypatch):
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="StopAt"):
        evaluate_main(tiny_args(run), monkeypatch, stop={"rank": 0, "batch": 2, "how": "raise"})
    assert _done(run, 0) == [0, 1, 2, 3] and (run / "progress" / "config.yaml").is_file()
    before = (run / "progress" / "rank0.pt").read_bytes()
    # what is evaluated cannot change; the config comes from the run folder
    with pytest.raises(SystemExit, match=r"changes the evaluation of the run \(data.init_args.test_size: 5 -> 6\)"):
        evaluate_main(["--resume", str(run), "--data.init_args.test_size", "6"], monkeypatch)
    with pytest.raises(SystemExit, match="writes to its own folder"):
        evaluate_main(["--resume", str(run), "--output_dir", str(tmp_path / "elsewhere")], monkeypatch)
    with pytest.raises(SystemExit, match="drop --config"):
        evaluate_main(["--resume", str(run), "--config", str(ROOT / "configs/evaluate/synthetic.yaml")], monkeypatch)
    # a new run may not take over the folder of an unfinished one
    with pytest.raises(SystemExit, match="holds the progress of an unfinished run.*--resume"):
        evaluate_main(tiny_args(run), monkeypatch)
    assert (run / "progress" / "rank0.pt").read_bytes() == before   # refusals change nothing
    # where progress goes and how often may change
    evaluate_main(["--resume", str(run), "--progress_every", "3", "--trainer.enable_progress_bar", "false"],
                  monkeypatch)
    assert_same_metrics(load(run / "metrics.json"), reference)
    with pytest.raises(SystemExit, match="has finished.*nothing to resume"):
        evaluate_main(["--resume", str(run)], monkeypatch)


def test_resume_without_progress(reference, tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="does not exist"):
        evaluate_main(["--resume", str(tmp_path / "nowhere")], monkeypatch)
    with pytest.raises(SystemExit, match="not a resumable evaluate.py run folder.*progress/config.yaml"):
        evaluate_main(["--resume", str(tmp_path)], monkeypatch)
    # killed before its first checkpoint: the config is there, no process saved progress -> from the start
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="StopAt"):
        evaluate_main(tiny_args(run), monkeypatch, stop={"rank": 0, "batch": 0, "how": "raise"})
    assert (run / "progress" / "config.yaml").is_file() and not (run / "progress" / "rank0.pt").exists()
    evaluate_main(["--resume", str(run)], monkeypatch)
    assert_same_metrics(load(run / "metrics.json"), reference)


def test_corrupt_or_truncated_progress_file_is_a_clear_error_and_nothing_is_lost(tmp_path, monkeypatch):
    from callbacks.progress import ProgressError, RunProgress

    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="StopAt"):
        evaluate_main(tiny_args(run), monkeypatch, stop={"rank": 0, "batch": 1, "how": "raise"})
    path = run / "progress" / "rank0.pt"
    good = path.read_bytes()
    assert RunProgress.load(run).done(0) == [0, 1]
    for damaged in (good[: len(good) // 2], b"\x00garbage" * 10, b""):
        path.write_bytes(damaged)
        with pytest.raises(ProgressError, match=rf"progress file '{path}' cannot be read.*Move it away"):
            RunProgress.load(run)
        with pytest.raises(SystemExit, match=rf"progress file '{path}' cannot be read"):
            evaluate_main(["--resume", str(run)], monkeypatch)
        assert path.read_bytes() == damaged and (run / "progress" / "config.yaml").is_file()
    torch.save({"rank": 0}, path)   # readable, but not a progress file
    with pytest.raises(ProgressError, match="not a progress file of evaluate.py"):
        RunProgress.load(run)
    # a kill while a checkpoint is written leaves only its temporary file beside the last good one
    path.write_bytes(good)
    (run / "progress" / ".rank0.pt.tmp").write_bytes(good[:100])
    assert RunProgress.load(run).done(0) == [0, 1]
    # a checkpoint of another config is refused
    config = run / "progress" / "config.yaml"
    config.write_text(config.read_text() + "\n# edited\n")
    with pytest.raises(ProgressError, match="written for another config"):
        RunProgress.load(run)


# ------------------------------------------------------------------------------------------ units
def _perturbation_outputs(methods, batch_size=3, tokens=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"relevance": {m: {"predicted": torch.rand(batch_size, tokens, generator=g)} for m in methods},
            "logits": torch.randn(batch_size, 4, generator=g)}


def test_progress_state_round_trip_of_every_callback(tmp_path):
    """States of lazily built metrics (PerturbationTest, SegmentationTest, CDAMAnalysis with class-agnostic
    methods) and of CleanAccuracyTest, saved through a progress file and restored into fresh callbacks, give the
    same results after the same further updates; extra state goes through the two optional methods."""
    from callbacks.accuracy import CleanAccuracyTest
    from callbacks.base import EvaluationCallback
    from callbacks.cdam_analysis import CDAMAnalysis
    from callbacks.progress import write_atomic
    from callbacks.segmentation import SegmentationTest
    from evaluation.metrics import PositivePerturbationCurve

    class Rows(CleanAccuracyTest):
        def __init__(self):
            super().__init__()
            self.rows = []

        def update(self, outputs, batch):
            super().update(outputs, batch)
            self.rows += batch["index"].tolist()

        def extra_progress_state(self):
            return {"rows": list(self.rows)}

        def load_extra_progress_state(self, state):
            self.rows = list(state["rows"])

    def batches(n):
        g = torch.Generator().manual_seed(n)
        for b in range(n):
            maps = torch.rand(2, 16, generator=g)
            outputs = {"relevance": {m: {s: maps + k for s in ("predicted", "target", "other")}
                                     for k, m in enumerate(("a", "b"))},
                       "logits": torch.randn(2, 4, generator=g), "class_specific": {"a": True, "b": False}}
            batch = {"label": torch.randint(0, 4, (2,), generator=g), "index": torch.tensor([2 * b, 2 * b + 1]),
                     "mask": (torch.rand(2, 32, 32, generator=g) > 0.5).float(),
                     "other_mask": (torch.rand(2, 32, 32, generator=g) > 0.5).float()}
            yield outputs, batch

    def make():
        return [SegmentationTest(), CDAMAnalysis(), Rows()]

    first, data = make(), list(batches(4))
    for outputs, batch in data[:2]:
        for cb in first:
            cb.update(outputs, batch)
    saved = [cb.progress_state() for cb in first]
    assert saved[1]["build"] == {"methods": ["a", "b"], "class_agnostic": ["b"]}
    path = write_atomic({"callbacks": saved}, tmp_path / "state.pt")
    restored_states = torch.load(path, weights_only=True)["callbacks"]   # plain values and tensors only
    second = make()
    for cb, state in zip(second, restored_states):
        cb.build_from_progress(state, torch.device("cpu"))
    assert second[2].rows == [0, 1, 2, 3]
    assert not any("/discrimination/b/" in k for k in second[1].compute())   # built for the class-agnostic 'b'
    for outputs, batch in data[2:]:
        for a, b in zip(first, second):
            a.update(outputs, batch)
            b.update(outputs, batch)
    for a, b in zip(first, second):
        ra, rb = a.compute(), b.compute()
        assert sorted(ra) == sorted(rb)
        assert all(ra[k] == rb[k] or (ra[k] != ra[k] and rb[k] != rb[k]) for k in ra), type(a).__name__
    # the base class' defaults, and what is refused
    assert EvaluationCallback.extra_progress_state(second[0]) == {}
    bad = dict(saved[0], metrics=saved[0]["metrics"][:1])
    with pytest.raises(ValueError, match="holds 1 metrics, the callback built 2"):
        SegmentationTest().build_from_progress(bad)
    curve = PositivePerturbationCurve(3)
    state = {"class": "PositivePerturbationCurve", "states": {"correct": torch.zeros(5, dtype=torch.float64),
                                                              "total": torch.zeros((), dtype=torch.float64)}}
    from callbacks.base import _load_metric_state

    with pytest.raises(ValueError, match="state 'correct' was saved as"):
        _load_metric_state(curve, state, "test")


def test_perturbation_test_is_rebuilt_for_the_saved_methods():
    from callbacks.perturbation import PerturbationTest

    first = PerturbationTest(class_settings=("predicted",), directions=("positive",))
    first.build(["x", "y"], torch.device("cpu"))
    for metric in first.metrics():
        metric.update(torch.rand(4, len(first.fractions) + 1) > 0.5)
    state = first.progress_state()
    assert state["build"] == {"methods": ["x", "y"]}
    second = PerturbationTest(class_settings=("predicted",), directions=("positive",))
    second.build_from_progress(state)
    assert second._built_methods == ["x", "y"]
    assert second.compute() == first.compute()


def test_resumed_split_keeps_each_process_share_and_skips_done_samples():
    from pytorch_lightning.overrides.distributed import UnrepeatedDistributedSampler

    from datamodules.unrepeated import RemainingSampler

    data = list(range(7))
    for rank in (0, 1):
        assert list(RemainingSampler(data, 2, rank)) == list(UnrepeatedDistributedSampler(data, 2, rank,
                                                                                        shuffle=False))
    sampler = RemainingSampler(data, 2, 0, done=[0, 2])
    assert list(sampler) == [4, 6] and len(sampler) == 2
    empty = RemainingSampler(data, 2, 1, done=[1, 3, 5])
    assert list(empty) == [] and len(empty) == 1   # Lightning would skip a 0-length loader's epoch end
    with pytest.raises(ValueError, match="not in its share"):
        RemainingSampler(data, 2, 1, done=[2])


def test_resume_on_another_number_of_processes_is_refused(tmp_path):
    from callbacks.progress import ProgressError, RunProgress
    from datamodules.unrepeated import ResumeSplit, UnrepeatedTestData

    progress = RunProgress(tmp_path, tmp_path / "config.yaml", {0: {"world_size": 2, "num_samples": 5,
                                                                    "done": torch.tensor([0, 2])}})
    progress.check_world_size(2)
    with pytest.raises(ProgressError, match="evaluated by 2 processes; resume it with the same number"):
        progress.check_world_size(1)
    assert progress.split() == ResumeSplit(2, 5, {0: [0, 2]})

    class Data(pl.LightningDataModule):
        def test_dataloader(self):
            return torch.utils.data.DataLoader(list(range(5)), batch_size=2)

    with pytest.raises(ValueError, match="evaluated by 2 processes, this one has 1"):
        UnrepeatedTestData(Data(), resume=progress.split()).test_dataloader()
    loader = UnrepeatedTestData(Data(), resume=ResumeSplit(1, 5, {0: [0, 1]})).test_dataloader()
    assert [batch.tolist() for batch in loader] == [[2, 3], [4]]


def test_resumed_wandb_run_joins_the_group_of_the_killed_run(tmp_path, monkeypatch):
    """A resume logs to a new W&B run in the killed run's group, tagged ``resumed`` (nothing is logged here)."""
    from cli import EvaluateCLI

    monkeypatch.setenv("WANDB_MODE", "offline")
    cli = EvaluateCLI(tiny_args(tmp_path / "run", logger=True))
    group = cli.trainer.logger._wandb_init["group"]
    config = tmp_path / "run" / "progress" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(cli.parser.dump(cli.config, skip_none=False))
    resumed = EvaluateCLI(["--resume", str(tmp_path / "run"), "--trust_run_config"])   # the config names StopAt
    init = resumed.trainer.logger._wandb_init
    assert init["group"] == group and "resumed" in init["tags"]
    assert resumed.config["output_dir"] == str(tmp_path / "run")
