"""What the CLI installs whatever the config's lists say, and the line a stopped run ends with (in this process)."""

from __future__ import annotations

import io
import signal
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from jsonargparse import Namespace

from classifier_engine.checkpoints.checkpoint_io import AtomicCheckpointIO
from classifier_engine.checkpoints.preprocessing_record import PreprocessingRecord
from classifier_engine.checkpoints.random_state import RandomState
from classifier_engine.cli.guarantees import LastCheckpoint, Safety, check_user_parts
from classifier_engine.cli.model_guarantees import (
    CalibrationFit,
    FinalValidation,
    ScheduleResume,
    TrainingTotalsLog,
)
from classifier_engine.faults.divergence import DivergenceGuard
from classifier_engine.faults.ending import exit_status, stopped_message
from classifier_engine.faults.rank_failure import RankFailureWatch
from classifier_engine.faults.stop_on_signal import StopOnSignal
from classifier_engine.foundation.errors import UsageError
from classifier_engine.runs.console_log import REDRAWN_LINES, ConsoleLog


def namespaces(items: list[dict] | None) -> list[Namespace] | None:
    return None if items is None else [Namespace(item) for item in items]


def trainer_config(callbacks: list[dict] | None = None, plugins: list[dict] | None = None, **keys: object) -> Namespace:
    """A parsed ``trainer`` section as the CLI checks it: class_path/init_args namespaces."""
    return Namespace(callbacks=namespaces(callbacks), plugins=namespaces(plugins), **keys)


CHECKPOINT = "lightning.pytorch.callbacks.ModelCheckpoint"
RANDOM_STATE = f"{RandomState.__module__}.{RandomState.__name__}"


@pytest.mark.parametrize(
    ("config", "named"),
    [
        (trainer_config([{"class_path": RANDOM_STATE}]), "RandomState"),
        (trainer_config([{"class_path": CHECKPOINT, "init_args": Namespace(filename="last")}]), "filename last"),
        (trainer_config([{"class_path": CHECKPOINT, "init_args": Namespace(save_last=True)}]), "save_last"),
        (trainer_config(plugins=[{"class_path": "lightning.pytorch.plugins.TorchCheckpointIO"}]), "TorchCheckpointIO"),
        (trainer_config(enable_checkpointing=False), "enable_checkpointing"),
    ],
    ids=["installed-class-again", "filename-last", "save-last", "checkpoint-writer", "checkpointing-off"],
)
def test_a_list_that_contradicts_what_resume_rests_on_is_refused(config, named):
    with pytest.raises(UsageError, match=named):
        check_user_parts(config)


def test_a_users_own_checkpoints_and_plugins_are_welcome():
    best = {"class_path": CHECKPOINT, "init_args": Namespace(monitor="val/loss", filename="best-{epoch}")}
    elsewhere = {"class_path": CHECKPOINT, "init_args": Namespace(filename="last", dirpath="/backups")}
    environment = {"class_path": "lightning.pytorch.plugins.environments.LightningEnvironment"}
    check_user_parts(trainer_config([best, elsewhere], [environment]))


def test_the_installed_callbacks_write_last_ckpt_by_epoch_and_optionally_by_step(tmp_path):
    by_epoch = Safety().callbacks(tmp_path)
    model = [CalibrationFit, TrainingTotalsLog, FinalValidation, ScheduleResume]  # what the model's promises need
    kinds = [RankFailureWatch, StopOnSignal, RandomState, PreprocessingRecord, *model, DivergenceGuard, LastCheckpoint]
    assert [type(callback) for callback in by_epoch] == kinds
    assert by_epoch[-1].dirpath == str(tmp_path / "checkpoints") and by_epoch[-1].save_on_exception
    both = Safety(last_every_n_train_steps=50).callbacks(tmp_path)
    assert [callback._every_n_train_steps for callback in both[-2:]] == [0, 50]


def stopped(tmp_path: Path, writer: AtomicCheckpointIO, cause: signal.Signals | None) -> str:
    run = SimpleNamespace(directory=tmp_path / "run")
    return stopped_message(SimpleNamespace(global_step=63), run, writer, cause)


def test_the_stop_line_names_the_checkpoint_it_wrote_or_says_none_was(tmp_path):
    writer, last = AtomicCheckpointIO(), tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert stopped(tmp_path, writer, signal.SIGTERM) == (
        "Stopped by SIGTERM at step 63; nothing was saved, so there is nothing to resume: run the command again to "
        "start over"
    )
    writer.save_checkpoint({"global_step": 40, "state_dict": {}}, last)  # an earlier save of this session ...
    writer.written.clear()  # ... seen as one of an earlier session
    assert "nothing was saved this session" in stopped(tmp_path, writer, signal.SIGINT)
    assert f"{last} still holds step 40" in stopped(tmp_path, writer, signal.SIGINT)
    writer.save_checkpoint({"global_step": 63, "state_dict": {}}, last)
    assert stopped(tmp_path, writer, signal.SIGINT) == (
        f"Stopped by Ctrl-C at step 63; {last} holds step 63: run the same command with --ckpt_path last to continue"
    )
    assert torch.load(last, weights_only=True)["global_step"] == 63
    assert stopped(tmp_path, writer, None).startswith("Stopped by an error at step 63; ")
    assert [exit_status(number) for number in (signal.SIGINT, signal.SIGTERM)] == [130, 143]


def test_the_console_log_holds_lines_until_the_run_is_worth_recording_and_keeps_a_redrawn_line_once(
    tmp_path, monkeypatch
):
    screen, errors = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setattr(sys, "stderr", errors)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)  # start() installs its own
    console = ConsoleLog()
    console.start()
    print("before the first step")
    sys.stderr.write("\rEpoch 0:  10%")
    sys.stderr.write("\rEpoch 0: 100%\n")  # a progress bar: the file keeps its last state
    path = console.attach(tmp_path / "run", rank=0)
    print("after")
    console.detach()
    lines = [line.split(" ", 2)[2] for line in path.read_text().splitlines()]  # without the time stamp
    assert lines[0].startswith("---- ") and lines[1:] == ["before the first step", "Epoch 0: 100%", "after"]
    assert screen.getvalue() == "before the first step\nafter\n"  # the screen gets every byte, as printed
    assert errors.getvalue() == "\rEpoch 0:  10%\rEpoch 0: 100%\n"

    print("a refused start")
    console.discard()  # nothing of a command refused before training reaches the disk
    console.attach(tmp_path / "other", rank=1)
    assert not (tmp_path / "other").exists()  # another rank's file only once it prints
    print("a warning of rank 1")
    console.detach()
    assert (tmp_path / "other" / "logs" / "console-rank1.log").read_text().endswith(" a warning of rank 1\n")


def test_on_a_terminal_the_console_log_keeps_what_a_live_display_shows_last_without_its_codes(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    console = ConsoleLog()
    console.start()
    console.redrawn = REDRAWN_LINES  # as on a terminal (a StringIO is not one)
    path = console.attach(tmp_path / "run", rank=0)
    print("Epoch 0/1 \x1b[35m━━━━\x1b[0m 1/5")
    print("   val/top1: 0.1")
    print("\x1b[2K\x1b[1A\x1b[2K\x1b[1A\x1b[2KEpoch 0/1 \x1b[35m━━━━━━━━\x1b[0m 5/5")  # rich redraws its block
    print("   val/top1: 0.4")
    print("Run: runs/x")
    console.detach()
    lines = [line.split(" ", 2)[2] for line in path.read_text().splitlines()[1:]]
    assert lines == ["Epoch 0/1 ━━━━━━━━ 5/5", "   val/top1: 0.4", "Run: runs/x"]
