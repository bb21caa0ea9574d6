"""Cross-validate: k folds in one command, every figure with its spread, and the out-of-fold answer for every image.

python cross_validate.py --data.image_dir photos/ [--folds 5] [--fold K] [--output DIR]
    [any main.py fit option, e.g. --config configs/images.yaml --trainer.max_epochs 10]
python cross_validate.py --compare configs/a.yaml configs/b.yaml [--folds 5] [fit options for both]

Each fold is an ordinary ``main.py fit`` run (``data.folds``, ``data.fold``): its own folder, named by its config,
data and fold, continued exactly where it stopped and reused once finished, so the same command run again
trains only the folds and steps left. ``--fold K`` trains fold K alone (one process per GPU, or a SLURM array:
scripts/cross_validate_array.sbatch); the command without ``--fold`` then reuses them and writes the summary.

Writes, by default beside the fold runs (``runs/<name>/cv-<first fold's run>/``):
``cv_summary.csv`` (each figure's mean, standard deviation, 95 % interval and per-fold values),
``oof_predictions.csv`` (every image answered, calibrated, by the fold model that never trained on it),
``cv_report.html`` and ``tensorboard/`` (a scalar per fold). ``check_labels.py`` with the same options ranks
label issues from these same fold runs without training them again.

``--final all`` (the default) then trains the model to ship on every image for the folds' mean best epoch count
(an ordinary run, ``data.fold`` null), calibrates it on the folds' out-of-fold answers, and exports it:
``checkpoints/final.ckpt`` and ``checkpoints/export/`` in that run's folder, the card citing the folds' figures.

``--compare A B`` cross-validates both configs on the same folds (the same images and ``data.split_seed``), then
gives each figure's per-fold difference B - A, its mean and 95 % interval: where the interval excludes 0, these
photos tell the two apart (``cv_compare.csv``, in ``compare-<A's>-<B's>/`` beside B's summary).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import lightning as L

from ..cli.launch import launched_as_rank_zero
from ..foundation.errors import OneLineArgumentParser, UsageError, exit_with
from ..foundation.noise import silence_known_noise
from ..runs.console_log import CONSOLE


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = OneLineArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--folds", type=int, default=5, help="cross-validation folds: one run each (at least 2)")
    add("--fold", type=int, help="train this fold alone (counted from 0) and write no summary: folds side by side")
    add("--output", type=Path, help="the folder of the summary, the report and the answers (default: beside the runs)")
    add("--gallery", type=int, default=48, help="how many wrong answers the report shows")
    add(
        "--final",
        choices=("all", "ensemble", "none"),
        default="all",
        help="all: then train a final model on every image for the folds' mean best epoch count, calibrated on "
        "their out-of-fold answers, and export it; ensemble: export the fold models as one graph (their mean "
        "calibrated probabilities; k passes per image); none: the folds' figures only",
    )
    add(
        "--ckpt_path",
        choices=("last",),
        default="last",
        help="each fold (and the final model) continues its own run where it stopped: last is the one choice",
    )
    add(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("A", "B"),
        help="two configs trained on the same folds: is B better than A? (paired per-fold differences)",
    )
    return parser.parse_known_args(argv)


def checked(options: argparse.Namespace, fit_options: list[str]) -> list[str]:
    """The fit options to run each fold with; a mistake is one line."""
    if options.folds < 2:
        raise UsageError(f"--folds must be at least 2, got {options.folds}")
    if options.compare and options.fold is not None:
        raise UsageError("--compare trains both configs' folds and compares them; run --fold without --compare")
    for config in options.compare or []:
        if not config.is_file():
            raise UsageError(f"--compare {config}: no such config file; give two YAML configs")
    if options.fold is not None and not 0 <= options.fold < options.folds:
        raise UsageError(
            f"--fold must be between 0 and {options.folds - 1} (--folds {options.folds}), got {options.fold}"
        )
    from ..cross_validation.folds import refuse_fold_settings

    refuse_fold_settings("cross_validate.py", fit_options, "use --folds and --fold")
    return fit_options


# What the report says of the model to ship until it is made (each --final choice).
NEXT = {
    "all": "The final model (every image, the folds' mean best epoch count) is trained next; this page names it "
    "once it is exported.",
    "ensemble": "The fold ensemble is exported next; this page names it once it is.",
    "none": "None made (--final none): --final all trains one on every image, --final ensemble exports the fold "
    "models as one.",
}


def cross_validation(
    options: argparse.Namespace,
    fit_options: list[str],
    model_class: type[L.LightningModule],
    default_config: Path,
    output: Path | None,
) -> tuple[dict, Path, list] | None:
    """Every fold trained (or continued, or reused), then the summary's files: (summary, its folder, the folds'
    answers); None with ``--fold``."""
    from ..cross_validation import fold_figures as cv
    from ..cross_validation import folds as fold_runner
    from ..cross_validation.report import write_report

    chosen = range(options.folds) if options.fold is None else [options.fold]
    folds = []
    for fold in chosen:
        print(f"Fold {fold + 1} of {options.folds}", flush=True)
        folds.append(fold_runner.run_fold(fit_options, options.folds, fold, model_class, default_config))
    if options.fold is not None:
        print(
            f"Fold {options.fold} is trained: {folds[0].run_dir}. Once every fold is, the same command without "
            "--fold writes the summary (and trains any fold left)."
        )
        return None
    summary = cv.spreads([cv.fold_figures(fold) for fold in folds])
    output = output or folds[0].run_dir.parent / f"cv-{folds[0].run_dir.name}"
    if not launched_as_rank_zero():  # the other ranks of a multi-GPU fit ran the folds with it; one writes
        return summary, output, folds
    output.mkdir(parents=True, exist_ok=True)
    cv.write_summary(summary, output / "cv_summary.csv")
    cv.write_out_of_fold(folds, output / "oof_predictions.csv")
    write_report(
        folds, summary, output / "cv_report.html", options.gallery, "" if options.compare else NEXT[options.final]
    )
    cv.write_tensorboard(summary, output / "tensorboard")
    print(cv.console_table(summary))
    print(
        f"Cross-validation: {output / 'cv_summary.csv'}, {output / 'cv_report.html'} and "
        f"{output / 'oof_predictions.csv'}",
        flush=True,
    )
    return summary, output, folds


def final_model(
    options: argparse.Namespace,
    fit_options: list[str],
    model_class: type[L.LightningModule],
    default_config: Path,
    folds: list,
    summary: dict,
) -> list[tuple[str, str]] | None:
    """``--final all``: train on every image, calibrate on the folds' answers, export (cross_validation/final_model.py);
    what the report names (None on the ranks but the first)."""
    from ..cross_validation import final_model as final
    from ..foundation.files import sha256

    task = "multilabel" if folds[0].thresholds is not None else "multiclass"
    epochs = final.final_epochs(folds, task)
    verdict = final.probe_verdict(folds)
    probe_alone = verdict is not None and verdict[0] > verdict[1]
    trained_how = f"{epochs} epochs (the folds' mean best)"
    if probe_alone:
        probe, fine_tune = verdict
        trained_how = (
            f"the linear probe alone: it beat the fine-tune on the folds ({probe:.3f} against {fine_tune:.3f})"
        )
    print(f"Final model: every image of the {options.folds} folds, {trained_how}", flush=True)
    cli, run_dir = final.train_final(fit_options, options.folds, epochs, model_class, default_config, probe_alone)
    if not launched_as_rank_zero():
        return None
    checkpoint = final.calibrate_final(cli, run_dir, folds, summary, epochs)
    exported_to = checkpoint.parent / "export"
    if not final.exported_from(exported_to, "checkpoint_sha256", sha256(checkpoint)):
        export_final(checkpoint, model_class, default_config, fit_options)
    print(
        f"Final model: {checkpoint} (calibrated on the folds' out-of-fold answers), exported to {exported_to}",
        flush=True,
    )
    return [
        ("final model", str(checkpoint)),
        ("trained on", f"every image of the {options.folds} folds, {trained_how}"),
        ("calibrated on", "the folds' out-of-fold answers"),
        ("exported to", str(exported_to)),
    ]


def export_final(
    checkpoint: Path,
    model_class: type[L.LightningModule],
    default_config: Path,
    fit_options: list[str],
    **settings: Any,
) -> None:
    """Export the final model in export's default formats (with no test split, int8 is left out: nothing is held
    out to judge it on). Where int8 loses more than export's limit, the model ships in fp32 (ONNX, .pt2) and one
    line says so: the command's product is a model to ship, and int8 can be tried again with export.py.
    ``settings``: other ``ExportOptions`` than export's defaults."""
    from ..export.artifacts import ExportOptions, export_artifacts
    from .export import report

    options = ExportOptions(ckpt_path=checkpoint, int8_optional=True, **settings)
    exported = export_artifacts(options, model_class, default_config, tuple(fit_options))
    if exported.int8_left_out is not None:
        error = exported.int8_left_out
        print(
            f"Final model: int8 left out: it loses {error.drop:.2f} points against fp32 on the test split (limit "
            f"{error.limit}); shipping ONNX and .pt2. To try int8 again: python export.py --ckpt_path {checkpoint} "
            "--calibration_method percentile",
            flush=True,
        )
    report(exported.card, exported.written)


def ensemble_model(
    model_class: type[L.LightningModule],
    default_config: Path,
    fit_options: list[str],
    folds: list,
    summary: dict,
    output: Path,
) -> list[tuple[str, str]]:
    """``--final ensemble``: the fold models as one exported graph (cross_validation/fold_ensemble.py), in ``output``;
    what the report names."""
    from ..cross_validation import fold_ensemble as ensembles
    from ..cross_validation.final_model import exported_from, figures_record
    from ..export.artifacts import ExportOptions, check_options, export_model
    from ..export.model_loading import load_model
    from ..export.run_data import load_run_data
    from .export import report

    checkpoints = [fold.run_dir / "checkpoints" / "last.ckpt" for fold in folds]
    sources = ensembles.member_sources(checkpoints)
    if not exported_from(output, "ensemble_of", sources):
        loaded = [load_model(path, model_class, default_config, fit_options) for path in checkpoints]
        ensemble = ensembles.FoldEnsemble([member.model for member in loaded])
        checkpoint = ensembles.ensemble_checkpoint(
            loaded[0].checkpoint, ensemble, figures_record(summary, len(folds), None), sources
        )
        data = load_run_data(loaded[0], checkpoints[0], ensemble.class_names, None, "evaluation on the test split")
        judged = data.held_out.split == "test"  # else the held-out images are fold 0's, which the others trained on
        options = ExportOptions(ckpt_path=checkpoints[0], output_dir=output)
        check_options(options)
        skipped = (
            None
            if judged
            else (
                f"no test split: each image trained {len(folds) - 1} of the {len(folds)} fold "
                "models; the card's cross-validated figures stand for it"
            )
        )
        exported = export_model(options, ensemble, checkpoint, data if judged else None, skipped)
        report(exported.card, exported.written)
    print(f"Fold ensemble: {output} (the mean of the {len(folds)} fold models' calibrated probabilities)", flush=True)
    return [
        ("fold ensemble", str(output)),
        ("made of", f"the mean of the {len(folds)} fold models' calibrated probabilities"),
        *((f"fold {k}", str(path)) for k, path in enumerate(checkpoints)),
    ]


def main(model_class: type[L.LightningModule], default_config: Path, argv: list[str] | None = None) -> int:
    """``python cross_validate.py ...`` of the project whose LightningModule and default config are given."""
    silence_known_noise()
    options, fit_options = parse_args(argv)
    try:
        fit_options = checked(options, fit_options)
        if not options.compare:
            done = cross_validation(options, fit_options, model_class, default_config, options.output)
            if done is None or options.final == "none":
                return 0
            summary, output, folds = done
            if options.final == "all":
                shipped = final_model(options, fit_options, model_class, default_config, folds, summary)
            else:
                shipped = (
                    ensemble_model(model_class, default_config, fit_options, folds, summary, output / "ensemble")
                    if launched_as_rank_zero()
                    else None
                )
            if shipped:
                from ..cross_validation.report import write_report

                write_report(folds, summary, output / "cv_report.html", options.gallery, shipped)
            return 0
        from ..cross_validation import fold_figures as cv

        summaries, outputs = [], []
        for name, config in zip("AB", options.compare, strict=True):
            print(f"{name}: {config}", flush=True)
            output = options.output / f"cv-{name}" if options.output else None
            summary, folder, _ = cross_validation(
                options, [f"--config={config}", *fit_options], model_class, default_config, output
            )
            summaries.append(summary)
            outputs.append(folder)
        comparison = cv.paired(*summaries)
        if not launched_as_rank_zero():
            return 0
        names = (folder.name.removeprefix("cv-") for folder in outputs)
        output = options.output or outputs[1].parent / f"compare-{'-'.join(names)}"
        output.mkdir(parents=True, exist_ok=True)
        cv.write_comparison(comparison, output / "cv_compare.csv")
    except Exception as error:  # a user's mistake: one line (FULL_ERROR=1: the traceback)
        exit_with(error)
    a, b = options.compare
    print(f"B ({b}) against A ({a}), fold by fold on the same folds:")
    print(cv.comparison_table(comparison))
    print(f"Comparison: {output / 'cv_compare.csv'}")
    return 0


def run(model_class: type[L.LightningModule], default_config: Path) -> None:
    """The command as typed: its output also kept in each fold's logs/console.log; exits with its code."""
    CONSOLE.start()
    sys.exit(main(model_class, default_config))
