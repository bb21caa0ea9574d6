"""Find the training images whose labels look wrong: k-fold out-of-sample probabilities, ranked by cleanlab.

python check_labels.py --data.image_dir photos/ [--folds 5] [--output label_issues.csv]
    [--gallery 100] [any main.py fit option, e.g. --trainer.max_epochs 5]

Each fold is an ordinary ``main.py fit`` run (``data.folds``, ``data.fold``), named by its config and
resumed or reused when the same command runs again. Writes the CSV (file, given label, suggested
label, score; worst first) and an HTML gallery beside it, by default beside the fold runs
(``runs/<name>/label_issues-<first fold's hash>.csv`` and ``.html``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import lightning as L

from ..foundation.errors import OneLineArgumentParser, UsageError, exit_with
from ..foundation.noise import silence_known_noise
from ..runs.console_log import CONSOLE

EXTRA = "labels"  # the optional dependencies this command needs: pip install -e ".[labels]"


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = OneLineArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--folds", type=int, default=5, help="cross-validation folds: one run each (at least 2)")
    add("--output", type=Path, help="the CSV; the HTML gallery goes beside it (default: beside the fold runs)")
    add("--gallery", type=int, default=100, help="how many of the worst images the HTML gallery shows")
    return parser.parse_known_args(argv)


def main(model_class: type[L.LightningModule], default_config: Path, argv: list[str] | None = None) -> int:
    """``python check_labels.py ...`` of the project whose LightningModule and default config are given."""
    silence_known_noise()
    options, fit_options = parse_args(argv)
    try:
        try:
            import cleanlab  # noqa: F401  (the optional extra)
        except ImportError:
            raise UsageError(
                f"check_labels.py needs cleanlab, which is not installed; pip install -e '.[{EXTRA}]'"
            ) from None
        if options.folds < 2:
            raise UsageError(f"--folds must be at least 2, got {options.folds}")
        from ..cross_validation import folds as fold_runner
        from ..cross_validation import label_check

        fold_runner.refuse_fold_settings("check_labels.py", fit_options, "leave them out")

        folds = []
        for fold in range(options.folds):
            print(f"Fold {fold + 1} of {options.folds}", flush=True)
            folds.append(fold_runner.run_fold(fit_options, options.folds, fold, model_class, default_config))
        issues = label_check.find_issues(folds)
        class_names = folds[0].class_names
        root = folds[0].image_root
        output = options.output or fold_runner.default_output(folds)
        gallery = output.with_suffix(".html")
        output.parent.mkdir(parents=True, exist_ok=True)
        label_check.write_issues(issues, class_names, output, root)
        label_check.write_gallery(issues, folds, class_names, gallery, root, options.gallery)
    except Exception as error:  # a user's mistake: one line (FULL_ERROR=1: the traceback)
        exit_with(error)
    share = 100 * len(issues.ranked) / max(len(issues.labels), 1)
    print(f"Labels that look wrong: {len(issues.ranked)} of {len(issues.labels)} images ({share:.1f} %), worst first")
    print(f"Label check: {output} and {gallery}")
    return 0


def run(model_class: type[L.LightningModule], default_config: Path) -> None:
    """The command as typed: its output also kept in each fold's logs/console.log; exits with its code."""
    CONSOLE.start()
    sys.exit(main(model_class, default_config))
