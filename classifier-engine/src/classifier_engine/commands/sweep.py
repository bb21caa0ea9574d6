"""Search hyperparameters with Optuna; every trial is an ordinary ``main.py fit`` run.

python sweep.py --sweep configs/sweeps/<config>.yaml [--n_trials N] [--storage URL] [--study NAME] [fit options ...]
python sweep.py --sweep configs/sweeps/<config>.yaml --show     (the table, best.yaml and plots of a study so far)

Fit options (``--config ...``, ``--trainer.max_epochs 5``, ...) apply to every trial. Start the
same command again, on this machine or another with the same ``--storage``, to add a worker.
``--folds k`` scores each trial by the mean of k cross-validation fold runs, pruned on its first folds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import lightning as L

from ..foundation.errors import OneLineArgumentParser, UsageError, exit_with
from ..foundation.noise import silence_known_noise
from ..runs.console_log import CONSOLE

EXTRA = "sweep"  # the optional dependencies this command needs: pip install -e ".[sweep]"


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = OneLineArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--sweep", type=Path, required=True, help="the sweep file: metric, direction, space (see configs/sweeps/)")
    add("--n_trials", type=int, help="trials the study should have, all workers together (default: the sweep file's)")
    add("--storage", default="sqlite:///runs/sweeps.db", help="sqlite:///PATH, a database URL, or journal:PATH")
    add("--study", help="the study's name; workers with the same name and storage share it (default: the file's stem)")
    add("--show", action="store_true", help="run no trial: print the table, write best.yaml and the plots")
    add("--heartbeat_interval", type=int, default=60, help="seconds between a running trial's heartbeats")
    add("--grace_period", type=int, default=180, help="seconds without a heartbeat before a trial counts as dead")
    add("--folds", type=int, default=0, help="score each trial by its mean over this many folds (a run each); 0: off")
    return parser.parse_known_args(argv)


def main(model_class: type[L.LightningModule], default_config: Path, argv: list[str] | None = None) -> int:
    """``python sweep.py ...`` of the project whose LightningModule and default config are given."""
    silence_known_noise()
    options, fit_options = parse_args(argv)
    try:
        try:
            import optuna  # noqa: F401  (the optional extra)
            import optuna_integration  # noqa: F401
            import plotly  # noqa: F401
        except ImportError as error:
            raise UsageError(f"sweeps need {error.name}, which is not installed; pip install -e '.[{EXTRA}]'") from None
        from ..cross_validation.folds import refuse_fold_settings
        from ..sweeps import report, space, study, trial, validate

        if options.folds == 1 or options.folds < 0:
            raise UsageError(f"--folds must be 0 (one validation split) or at least 2, got {options.folds}")
        refuse_fold_settings("sweep.py", fit_options, "give --folds and leave them out")
        spec = space.SweepSpec.read(options.sweep)
        name = options.study or options.sweep.stem
        n_trials = options.n_trials or spec.n_trials
        if not options.show:
            if n_trials is None or n_trials < 1:
                raise UsageError("how many trials? give --n_trials N (a positive number) or n_trials in the sweep file")
            validate.check_space(
                spec, fit_options, model_class, default_config
            )  # every key and end of range, before any trial
        storage = study.open_storage(options.storage, options.heartbeat_interval, options.grace_period)
        shared = study.open_study(spec, name, storage)
        if not options.show:
            heartbeats = None if options.storage.startswith(study.JOURNAL_PREFIX) else options.heartbeat_interval
            objective = trial.TrialObjective(spec, fit_options, name, model_class, default_config, options.folds)
            study.run_worker(shared, objective, n_trials, heartbeats)
        output_dir = Path("runs") / "sweeps" / name
        output_dir.mkdir(parents=True, exist_ok=True)
        print(report.table(shared, spec.metric))
        best = report.write_best_config(shared, output_dir)
        plots, skipped = report.write_plots(shared, output_dir)
        dashboard_url = study.without_password(options.storage)
    except Exception as error:  # a user's mistake: one line (FULL_ERROR=1: the traceback)
        exit_with(error)
    if best:
        print(f"Best config: {best} (python main.py fit --config {best})")
    skipped_line = f"; skipped {'; '.join(skipped)}" if skipped else ""
    print(f"Plots: {', '.join(str(path) for path in plots) or 'none'}{skipped_line}")
    print(f"Live view: optuna-dashboard {dashboard_url}")
    return 0


def run(model_class: type[L.LightningModule], default_config: Path) -> None:
    """The command as typed: its output also kept in each trial's logs/console.log; exits with its code."""
    CONSOLE.start()
    sys.exit(main(model_class, default_config))
