"""What a study found: a table of the best trials, ``best.yaml`` for ``main.py fit --config``, and Optuna's plots."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from ..foundation.files import Partial

PLOTS = {
    "history": optuna.visualization.plot_optimization_history,
    "importances": optuna.visualization.plot_param_importances,
    "parallel_coordinates": optuna.visualization.plot_parallel_coordinate,
}


def best_trials(study: optuna.Study, count: int = 5) -> list[optuna.trial.FrozenTrial]:
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return sorted(complete, key=lambda t: t.value, reverse=study.direction == optuna.study.StudyDirection.MAXIMIZE)[
        :count
    ]


def table(study: optuna.Study, metric: str) -> str:
    """The best trials, best first: number, value, parameters, run directory; and the study's counts."""
    states = [trial.state for trial in study.get_trials(deepcopy=False)]
    counts = ", ".join(f"{states.count(state)} {state.name.lower()}" for state in TrialState if states.count(state))
    lines = [f"Study {study.study_name}: {counts or 'no trials'}"]
    best = best_trials(study)
    if best:
        lines.append(f"{'trial':>5}  {metric:>10}  parameters  run")
    for trial in best:
        params = ", ".join(
            f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}"
            for key, value in trial.params.items()
        )
        lines.append(f"{trial.number:>5}  {trial.value:>10.4f}  {params}  {trial.user_attrs.get('run_dir', '?')}")
    return "\n".join(lines)


def write_best_config(study: optuna.Study, output_dir: Path) -> Path | None:
    """``best.yaml``: the best trial's resolved config (its run's ``config.yaml``), which names that run again."""
    best = best_trials(study, 1)
    if not best or "run_dir" not in best[0].user_attrs:
        return None
    trial, path = best[0], output_dir / "best.yaml"
    config = (Path(trial.user_attrs["run_dir"]) / "config.yaml").read_text()
    with Partial(path) as partial:
        partial.write_text(f"# Study {study.study_name}, trial {trial.number}: {trial.value}\n{config}")
    return path


def write_plots(study: optuna.Study, output_dir: Path) -> tuple[list[Path], list[str]]:
    """Optuna's plots as HTML (with plotly.min.js beside them: no network needed); too few trials for one: skipped."""
    written, skipped = [], []
    for name, plot in PLOTS.items():
        try:
            figure = plot(study)
        except (ValueError, RuntimeError) as error:  # e.g. importances need two finished trials
            skipped.append(f"{name} ({str(error).splitlines()[0]})")
            continue
        path = output_dir / f"{name}.html"
        figure.write_html(str(path), include_plotlyjs="directory")
        written.append(path)
    return written, skipped
