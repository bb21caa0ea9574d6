"""One trial is one ordinary ``main.py fit`` run: its own directory (named by its config hash), checkpoints and logs.

With ``sweep.py --folds k``, a trial is k fold runs scored by their mean (``TrialObjective``).

The trial's values become command-line options on top of the sweep's fit options, and the run
is started with ``--ckpt_path last --allow_fresh_start true``: a trial whose config was trained
before continues that run (a finished one is not trained again, its result is reused), and a
trial retried after its worker was killed resumes the killed trial's checkpoint.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import lightning as L
import optuna
from optuna_integration import PyTorchLightningPruningCallback
from typing_extensions import override

from ..cli.trainer_cli import TrainerCLI
from ..foundation.errors import UserError
from ..foundation.files import Partial
from .space import SweepSpec, as_options

RECORD = "sweep.json"  # in the run directory: the study and trial that ran it, and how it ended


class TrialRecord(L.Callback):
    """Tie the run and the trial together: the trial gets the run directory, the run a ``sweep.json``."""

    def __init__(self, trial: optuna.Trial, study_name: str) -> None:
        self.trial = trial
        self.study_name = study_name
        self.run_dir: Path | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.run_dir = Path(trainer.default_root_dir)  # runs.Run.place points it at the run directory
        if trainer.is_global_zero:
            self.trial.set_user_attr("run_dir", str(self.run_dir))
            self.write(state="running")

    def write(self, **fields: Any) -> None:
        """Update the run's ``sweep.json`` (its earlier fields, e.g. a value, are kept)."""
        assert self.run_dir is not None
        path = self.run_dir / RECORD
        record = json.loads(path.read_text()) if path.is_file() else {}
        record.update(study=self.study_name, trial=self.trial.number, **fields)
        with Partial(path) as partial:
            partial.write_text(json.dumps(record, indent=2) + "\n")


def recorded_value(run_dir: Path) -> float | None:
    """The metric value an earlier trial of the same config recorded, if it finished."""
    path = run_dir / RECORD
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return record.get("value") if record.get("state") == "complete" else None


class TrialObjective:
    """What Optuna calls per trial: draw values, run the fit, return the metric after the last validation.

    With ``folds``, a trial is that many fold runs (``data.folds``, ``data.fold``) and its value their mean:
    after each fold the mean so far is reported to the pruner (the fold is the step), so a trial that
    starts worse than the others is pruned on its first folds instead of training them all.
    """

    def __init__(
        self,
        spec: SweepSpec,
        fit_options: list[str],
        study_name: str,
        model_class: type[L.LightningModule],
        default_config: Path,
        folds: int = 0,
    ) -> None:
        self.spec = spec
        self.fit_options = fit_options
        self.study_name = study_name
        self.model_class = model_class
        self.default_config = default_config
        self.folds = folds

    def args(self, values: dict[str, Any], extra: list[str] | None = None) -> list[str]:
        return [
            "fit",
            *self.fit_options,
            *as_options(values),
            *(extra or []),
            "--ckpt_path=last",
            "--allow_fresh_start=true",
        ]

    def __call__(self, trial: optuna.Trial) -> float:
        values = self.spec.suggest(trial)
        print(f"Trial {trial.number}: {', '.join(f'{key}={value}' for key, value in values.items())}", flush=True)
        if not self.folds:
            return self.fit(trial, values, [], prune_by_epoch=True)
        scores = []
        for fold in range(self.folds):
            print(f"Trial {trial.number}: fold {fold + 1} of {self.folds}", flush=True)
            folded = [f"--data.folds={self.folds}", f"--data.fold={fold}"]
            scores.append(self.fit(trial, values, folded, prune_by_epoch=False))
            trial.report(statistics.mean(scores), step=fold)
            if fold + 1 < self.folds and trial.should_prune():
                pruner, mean = type(trial.study.pruner).__name__, statistics.mean(scores)
                print(
                    f"Trial {trial.number} pruned by {pruner} after {fold + 1} of {self.folds} folds "
                    f"({self.spec.metric} {mean:.4f})",
                    flush=True,
                )
                raise optuna.TrialPruned()
        trial.set_user_attr("fold_values", scores)
        return statistics.mean(scores)

    def fit(self, trial: optuna.Trial, values: dict[str, Any], extra: list[str], prune_by_epoch: bool) -> float:
        """One fit of the trial's values (one fold of it, with ``extra``); its metric after the last validation."""
        record = TrialRecord(trial, self.study_name)
        callbacks: list[L.Callback] = [record]
        if prune_by_epoch:
            callbacks.append(PyTorchLightningPruningCallback(trial, monitor=self.spec.metric))
        try:
            cli = TrainerCLI(
                self.model_class,
                default_config=self.default_config,
                args=self.args(values, extra),
                trainer_defaults={"callbacks": callbacks},
            )
        except optuna.TrialPruned:
            record.write(state="pruned")
            print(f"Trial {trial.number} pruned by {type(trial.study.pruner).__name__}: {record.run_dir}", flush=True)
            raise
        except SystemExit:  # stopped by SIGTERM, SIGUSR1 or Ctrl-C, with a checkpoint: the next worker resumes it
            trial.study.enqueue_trial(trial.params, user_attrs={"resumes_trial": trial.number})
            trial.study.tell(trial, state=optuna.trial.TrialState.FAIL)  # Optuna leaves a SystemExit's trial running
            raise
        value = cli.trainer.callback_metrics.get(self.spec.metric)
        if value is None:  # nothing was left to train: the same config finished in an earlier trial
            reused = recorded_value(record.run_dir)
            if reused is None:
                raise UserError(
                    f"trial {trial.number}: the run {record.run_dir} was trained to its end outside this study, so "
                    f"there is no {self.spec.metric} to reuse; sweep a different config or delete that run"
                )
            print(f"Trial {trial.number}: reusing {record.run_dir} ({self.spec.metric} {reused})", flush=True)
            value = reused
        value = float(value)
        record.write(state="complete", value=value)
        return value
