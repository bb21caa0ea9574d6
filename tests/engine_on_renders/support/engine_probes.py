"""Callbacks the tests add on the command line: what each rank was fed and ended with; a kill at a chosen moment.

And a pruner that sweep files of the tests name, whose decisions do not depend on the numbers; faults
injected at a chosen step: a network that runs out of GPU memory, a loader worker killed, a disk filled.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import time
from pathlib import Path

import lightning as L
import optuna
import torch


class DataProbe(L.Callback):
    """Write ``rank<N>.json``: the sample ids of every training batch, per epoch, and a weights digest.

    The DDP tests write archives whose images carry their own index in the first two pixels
    (and train without augmentation), so ids are read from the data the rank really received.
    """

    def __init__(self, output_dir: str) -> None:
        self.output_dir = Path(output_dir)
        self.ids: dict[int, list[int]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        pixels = batch[0][:, 0, 0, :2].long().cpu()
        self.ids.setdefault(trainer.current_epoch, []).extend((pixels[:, 0] * 256 + pixels[:, 1]).tolist())

    def on_train_end(self, trainer, pl_module) -> None:
        digest = hashlib.sha256()
        for name, tensor in sorted(pl_module.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        environment = type(getattr(trainer.strategy, "cluster_environment", None)).__name__  # who launched it
        record = {"world_size": trainer.world_size, "environment": environment, "ids": self.ids}
        record["weights"] = digest.hexdigest()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


class KillAt(L.Callback):
    """Signal this process (``KILL_SIGNAL``, default SIGKILL) at the moment named by ``KILL_AT``, if set.

    The moment is read from the environment, not the config, so the killed run, its resume and
    the uninterrupted reference share one config (and one run directory). Moments:
    ``train_batch:E:B`` after training batch B of epoch E; ``validation:E`` after the first
    validation batch of epoch E; ``after_checkpoint:E`` at the end of epoch E, after its
    checkpoints are written; ``sanity`` during the sanity-check validation. ``KILL_RANK``, if
    set, names the only rank that is signalled. ``KILL_GROUP=1`` signals the whole process group
    (loader workers too), as a terminal's Ctrl-C or a scheduler's signal to a job does.
    """

    def __init__(self) -> None:
        self.moment = os.environ.get("KILL_AT", "")
        self.signal = signal.Signals[os.environ.get("KILL_SIGNAL", "SIGKILL")]
        self.rank = os.environ.get("KILL_RANK")
        self.group = os.environ.get("KILL_GROUP") == "1"

    def setup(self, trainer, pl_module, stage) -> None:
        if self.rank is not None and int(self.rank) != trainer.global_rank:
            self.moment = ""

    def _kill_if(self, moment: str) -> None:
        if moment == self.moment:
            if self.group:
                os.killpg(os.getpgid(0), self.signal)
            else:
                os.kill(os.getpid(), self.signal)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._kill_if(f"train_batch:{trainer.current_epoch}:{batch_idx}")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._kill_if("sanity" if trainer.sanity_checking else f"validation:{trainer.current_epoch}")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._kill_if(f"after_checkpoint:{trainer.current_epoch}")


class PruneLaterTrials(optuna.pruners.BasePruner):
    """Prune every trial but the first once it has reported ``after`` values (epochs)."""

    def __init__(self, after: int = 1) -> None:
        self.after = after

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        return trial.number > 0 and len(trial.intermediate_values) >= self.after


class OutOfMemoryAt(torch.nn.Sequential):
    """A small network whose training forward pass raises CUDA's out-of-memory error at optimizer step ``OOM_AT``.

    The error is torch's own type with the allocator's wording, as a real GPU raises it in the forward pass.
    No project's network: this module is imported by both renders' commands, which each import only their own.
    """

    def __init__(self, num_classes: int, width: int = 4) -> None:
        nn = torch.nn
        super().__init__(
            nn.Conv2d(3, width, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(width, num_classes),
        )
        self.at = int(os.environ.get("OOM_AT", "0"))
        self.calls = 0

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls == self.at:
                raise torch.OutOfMemoryError(
                    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of "
                    "which 1.02 GiB is free."
                )
        return super().forward(images)


class KillWorkerAt(L.Callback):
    """SIGKILL a loader worker after training batch ``KILL_WORKER_AT`` (``E:B``), as the kernel's OOM killer would."""

    def __init__(self) -> None:
        self.moment = os.environ.get("KILL_WORKER_AT", "")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if f"{trainer.current_epoch}:{batch_idx}" != self.moment:
            return
        me = str(os.getpid())
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if fields[1] == me:  # the parent pid: a loader worker of this process
                    os.kill(int(entry.name), signal.SIGKILL)
                    return


class FillDiskAt(L.Callback):
    """Fill the disk of the run's checkpoints, leaving ``FILL_LEAVE`` bytes, as epoch ``FILL_AT`` starts.

    For a test that mounted a small filesystem there: the next checkpoint really meets a full disk.
    """

    def __init__(self) -> None:
        self.epoch = os.environ.get("FILL_AT", "")
        self.leave = int(os.environ.get("FILL_LEAVE", "0"))

    def on_train_epoch_start(self, trainer, pl_module) -> None:  # the checkpoints of the epoch before are written
        if str(trainer.current_epoch) != self.epoch or not trainer.is_global_zero:
            return
        filler = Path(trainer.checkpoint_callback.dirpath) / ".filler"
        free = os.statvfs(filler.parent).f_bavail * os.statvfs(filler.parent).f_frsize
        with open(filler, "wb") as file:
            file.write(b"\0" * max(free - self.leave, 0))


class NoSpaceAt(L.Callback):
    """From epoch ``NO_SPACE_AT`` on, torch's writer stops halfway through a file with ``ENOSPC``, as on a full disk.

    For machines where a test cannot mount a small filesystem (``FillDiskAt`` is the real thing).
    """

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if str(trainer.current_epoch) != os.environ.get("NO_SPACE_AT", ""):
            return
        real = torch.save

        def short_write(obj, file, *args, **kwargs):
            real(obj, file, *args, **kwargs)
            with open(file, "r+b") as written:
                written.truncate(os.path.getsize(file) // 2)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))

        torch.save = short_write


class FailAt(L.Callback):
    """Fail on rank ``FAIL_RANK`` (default 1) as training batch ``FAIL_AT`` (``E:B``) starts, noting the time.

    ``FAIL_KIND``: ``oom`` raises torch's out-of-memory error as a GPU does, ``error`` a plain exception of
    the step. The moment goes to ``<run>/fault.time`` (seconds since the epoch), for "ended within N s".
    """

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if f"{trainer.current_epoch}:{batch_idx}" != os.environ.get("FAIL_AT", ""):
            return
        if trainer.global_rank != int(os.environ.get("FAIL_RANK", "1")):
            return
        (Path(trainer.default_root_dir) / "fault.time").write_text(str(time.time()))
        if os.environ.get("FAIL_KIND") == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        raise RuntimeError("the training step failed on purpose")


class FailInTest(L.Callback):
    """Fail as test batch ``FAIL_TEST_AT`` starts: an evaluation that breaks after it began."""

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if str(batch_idx) == os.environ.get("FAIL_TEST_AT", ""):
            raise RuntimeError("the test step failed on purpose")


class TinyNet(torch.nn.Sequential):
    """A user's own network: any nn.Module whose constructor takes num_classes first (tests/test_cli.py)."""

    def __init__(self, num_classes: int, hidden: int = 8) -> None:
        nn = torch.nn
        super().__init__(nn.Flatten(), nn.Linear(3 * 32 * 32, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


class SpoilTheFineTune(L.Callback):
    """A fine-tune that hurt: heavy noise in the backbone's weights at the start of the final validation."""

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        last = trainer.current_epoch >= trainer.max_epochs - 1
        if trainer.sanity_checking or not last:
            return
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for parameter in pl_module.backbone.parameters():
                noise = torch.randn(parameter.shape, generator=generator).to(parameter)
                parameter.add_(noise * (3 * parameter.std().nan_to_num() + 1))
