"""The command line: LightningCLI wired to the data, the model, the run directories and what the run relies on.

Which run a command continues and where its files go is decided before any class is built
(``resolution.py``, ``run.py``), so a refused command writes nothing. What resume and a clean
stop rest on is installed here whatever the config's lists say (``guarantees.py``). Mistakes
are reported in one line (``errors.py``); a finished command says where everything went
(``summary.py``), a stopped one where it left its state (``ending.py``).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, NoReturn

import lightning as L
from jsonargparse import Namespace
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from ..checkpoints.checkpoint_io import read_checkpoint
from ..checkpoints.checkpoint_values import (
    SCHEMA_PACKAGES,
    check_fits,
    check_network_size,
    labels_and_task,
    package_of,
    refusal,
    settings_to_take,
)
from ..contract import check_model, check_model_class, linked_settings
from ..data import Fingerprinted, ImageDataModule
from ..data.preprocessing import Preprocessing
from ..faults.ending import end_early
from ..faults.error_report import write_error_log
from ..faults.known_faults import FaultError, describe_fault, how_it_diverged
from ..foundation.errors import UsageError, UserError, exit_with, full_error_wanted, parse_error_line
from ..foundation.files import NoSpaceError
from ..foundation.noise import silence_known_noise
from ..foundation.process_lifetime import exit_when_launcher_dies
from ..models.starting_weights import building_for_checkpoint
from ..runs.console_log import CONSOLE
from ..runs.identity import RunIdentity
from ..runs.loggers import check_tracker_packages, experiment_dir
from ..runs.resolution import resolve_checkpoint
from ..runs.run import Run
from ..runs.run_record import RunRecord
from ..runs.summary import evaluation_summary, fit_summary
from .config_layers import config_files, replaced_callbacks_notes
from .guarantees import Safety, as_list, check_user_parts, with_atomic_writes
from .launch import launched_as_rank_zero, leave_the_process_group
from .monitors import monitor_what_the_labels_have
from .recipe import Recipe, probe_alone

SUBCOMMANDS = ("fit", "validate", "test", "predict")
# Model settings that choose how a trained model's answers are read, not what it learnt: at test and predict
# the command's own config sets them, where every other model setting comes from the checkpoint.
EVALUATION_CHOICES = ("reject_with",)


def resolved_config(parser: LightningArgumentParser, config: Namespace) -> dict:
    return json.loads(parser.dump(config, format="json", skip_check=True))


def imported(class_path: str) -> Any:
    """The class a config names by ``class_path`` (jsonargparse has imported its module already)."""
    module, name = class_path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def data_fingerprint(subcommand: str, data: Namespace) -> str:
    """What the command reads, as the data module says (a data module that cannot say: its config stands for it)."""
    datamodule_class = imported(data.class_path)
    if isinstance(datamodule_class, Fingerprinted):
        settings = data.init_args.as_dict() if data.get("init_args") is not None else {}
        fingerprint = datamodule_class.data_fingerprint(settings, subcommand)
        # Since 1.4 the folds deal every training image, where a fold run of 1.3 left the validation share out:
        # such a run is another run, never continued on the new folds.
        return f"{fingerprint}:folds-deal-all" if settings.get("folds") else fingerprint
    return ""


def fill_expected_input(config: Namespace) -> None:
    """Data settings left null take what the network's pretrained weights expect (``expected_input`` of the backbone).

    Before the run is named and anything is packed: the packed copy, the normalization, ``predict``
    and the export all follow the weights (a network trained with mean 0.5 is not fed ImageNet's).
    """
    backbone, data = config.model.get("backbone"), config.data.get("init_args")
    if not isinstance(backbone, Namespace) or not backbone.get("class_path") or data is None:
        return
    expected = getattr(imported(backbone.class_path), "expected_input", None)
    settings = backbone.init_args.as_dict() if backbone.get("init_args") is not None else {}
    for key, value in ((expected(settings) or {}) if callable(expected) else {}).items():
        if key in data and data[key] is None:
            data[key] = value


def constructor_error(error: ValueError) -> Exception:
    """The constructor's own error under jsonargparse's wrapping of a subclass (``data.class_path``): a ValueError
    of a config value, or a ``UserError`` that already says what to do."""
    inner: Exception = error
    while isinstance(inner.__cause__, ValueError | UserError):
        inner = inner.__cause__
    return inner


class OneLineErrorParser(LightningArgumentParser):
    """LightningCLI's parser, with a bad option or value reported in one line instead of a page of usage."""

    @override
    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or full_error_wanted():  # jsonargparse is trying alternatives, or asked to
            super().error(message, ex)
        command = " ".join(self.prog.replace("[options]", "").split())
        raise UsageError(f"{parse_error_line(message)}; see {command} --help (FULL_ERROR=1: the full report)")


# Trainer settings Lightning accepts at 0 and later divides by, mid-run (a modulo by zero after the first step).
COUNTS = ("val_check_interval", "check_val_every_n_epoch", "log_every_n_steps")


def check_counts(trainer: Namespace) -> None:
    """A count of 0 or less is one line before the run starts, rather than a failure after its first step."""
    for name in COUNTS:
        value = trainer.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
            raise UsageError(
                f"trainer.{name} must be above 0, got {value}; fix that value in the config or on the command line"
            )


class TrainerCLI(LightningCLI):
    """``python main.py {fit,validate,test,predict} [--config configs/...yaml] ...``."""

    def __init__(
        self,
        model_class: type[L.LightningModule],
        default_config: Path | None = None,
        checkpoint: tuple[Path, dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        """``model_class``: the project's LightningModule (``model:`` in the configs are its arguments).

        ``default_config``: the YAML every subcommand starts from, so a bare command has the full setup.

        With ``run=False`` (no subcommand) it only builds the data, the model and the trainer from the
        config (``cli.datamodule``, ``cli.model``, ``cli.trainer``), e.g. in a notebook or a benchmark;
        ``checkpoint`` (its path and the dict read from it once): the settings of the model and the data that
        trained it are taken from it as ``checkpoint_values`` admits them, so that its weights fit.
        """
        silence_known_noise()
        check_model_class(model_class)
        # Whose classes a checkpoint's class spec may name (checkpoint_values' strict schema): the stated
        # packages' and the project's own.
        self.schema_packages = (*SCHEMA_PACKAGES, *package_of(model_class))
        self.checkpoint_read: tuple[Path, dict[str, Any]] | None = checkpoint
        CONSOLE.detach()  # a new command (a sweep's next trial) records into its own run
        runs = kwargs.get("run", True)
        kwargs.setdefault("save_config_callback", RunRecord if runs else None)
        # The model takes its optimizer as an argument (model.optimizer), so no top-level group.
        kwargs.setdefault("auto_configure_optimizers", False)
        kwargs.setdefault("parser_class", OneLineErrorParser)
        if default_config is not None:
            defaults = {"default_config_files": [str(default_config)]}
            # Every option can also come from the environment (PL_FIT__TRAINER__NUM_NODES=2, ...; --help lists
            # the names), so a launcher sets what it knows without editing a file; the command line wins.
            per_subcommand = {**dict.fromkeys(SUBCOMMANDS, defaults), "default_env": True}
            kwargs.setdefault("parser_kwargs", per_subcommand if runs else defaults)
        # The data is any ImageDataModule the config names (data.class_path): CIFAR, your own images, or yours.
        super().__init__(model_class, ImageDataModule, subclass_mode_data=True, **kwargs)

    @override
    def setup_parser(
        self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]
    ) -> None:
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        if not add_subcommands:
            # A run's config.yaml records fit's own options (ckpt_path, ...): such a file builds the classes without
            # a subcommand too (export.py --config runs/.../config.yaml), where those options are not used.
            self.parser.add_method_arguments(
                Trainer, "fit", skip={"model", "train_dataloaders", "val_dataloaders", "datamodule"}
            )

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for key in linked_settings(self.model_class):  # the contract's LinkedFromData the model takes
            parser.link_arguments(f"data.{key}", f"model.{key}", apply_on="instantiate")
        for action in parser._actions:  # argparse's list; no public route to an action (test_private_routes)
            # The help names the project's networks (the docstring); jsonargparse would append every
            # nn.Module subclass that torch and torchvision define, some 600 lines.
            if action.dest in ("model.backbone", "model.loss"):
                action.extra_help = lambda: ""
        parser.add_class_arguments(Safety, "safety")
        parser.add_argument(
            "--allow_config_change",
            type=bool,
            default=False,
            help="Resume a run whose config differs (e.g. more max_epochs to extend it); both configs are recorded.",
        )
        parser.add_argument(
            "--recipe",
            type=Recipe,
            default="finetune",
            help="fit: finetune (a config's LinearProbe fits the head, then the fine-tune; the better is kept) or "
            "probe (the linear probe alone, one epoch of one dropped step: a calibrated model, no fine-tune).",
        )
        parser.add_argument(
            "--allow_fresh_start",
            type=bool,
            default=False,
            help="With --ckpt_path last: start a new run when there is none to resume (for self-resubmitting jobs).",
        )

    @override
    def _parse_ckpt_path(self) -> None:
        """Decide the run (and the checkpoint file behind ``last``) before anything is built or written.

        LightningCLI's own step between parsing and building (protected; its place in ``__init__`` is
        checked by tests/test_private_routes.py), where it reads the checkpoint's hyperparameters.
        """
        subcommand = self.config.get("subcommand")  # self.subcommand is set only after this runs
        if subcommand is None:  # run=False: nothing is resumed or written
            self.run = None
            if self.checkpoint_read is not None:
                fill_expected_input(self.config)
                self._take_checkpoint_settings(self.parser, self.config, *self.checkpoint_read, data_settings=True)
            return
        config = self.config[subcommand]
        check_user_parts(config.trainer)
        fill_expected_input(config)
        parser = self._parser(subcommand)
        data = data_fingerprint(subcommand, config.data)
        own_config = resolved_config(parser, config)
        identity = RunIdentity.of(own_config, data)
        experiment = experiment_dir(config.trainer)
        allow_fresh_start = subcommand == "fit" and config.allow_fresh_start
        checkpoint = resolve_checkpoint(subcommand, config.ckpt_path, experiment, identity, allow_fresh_start)
        stored = read_checkpoint(checkpoint) if isinstance(checkpoint, Path) else {}
        if isinstance(checkpoint, Path):
            self.checkpoint_read = (checkpoint, stored)  # read once: Lightning's restore gets this very dict
        config.ckpt_path = str(checkpoint) if checkpoint is not None else None
        if subcommand == "fit" and isinstance(checkpoint, Path):
            # A resumed fit takes no setting from the checkpoint: its config is compared with the checkpoint's
            # instead, and changes are refused unless allowed, so a change is never silently undone. What the file
            # says is still held to the schema: a checkpoint that is not data of this project is refused here too.
            self._hold_to_schema(stored, checkpoint)
        if subcommand != "fit":
            # Evaluation takes the model's settings from the checkpoint, as checkpoint_values admits them.
            if isinstance(checkpoint, Path):
                self._take_checkpoint_settings(parser, config, checkpoint, stored, data_settings=False)
            data = data_fingerprint(subcommand, self.config[subcommand].data)
            identity = RunIdentity.of(resolved_config(parser, self.config[subcommand]), data)
        allow_change = subcommand == "fit" and config.allow_config_change
        self.run = Run.plan(subcommand, identity, experiment, checkpoint, stored, allow_change)
        if launched_as_rank_zero():  # the process that writes the run holds it from here on
            self.run.take()

    def _hold_to_schema(self, stored: dict[str, Any], path: object) -> None:
        """Refuse, in one line, a checkpoint whose model settings ``checkpoint_values`` would not admit."""
        subcommand = self.config.get("subcommand")
        parser, config = (
            (self._parser(subcommand), self.config[subcommand]) if subcommand else (self.parser, self.config)
        )
        model = resolved_config(parser, config).get("model") or {}
        settings_to_take(
            stored["hyper_parameters"], model, self.model_class, "hyper_parameters", path, self.schema_packages
        )

    def _take_checkpoint_settings(
        self,
        parser: LightningArgumentParser,
        config: Namespace,
        path: Path,
        stored: dict[str, Any],
        data_settings: bool,
    ) -> None:
        """Set on ``config`` (never parse) the model's settings ``checkpoint_values`` admits from ``stored``.

        The images are made as the model saw them in training (its preprocessing record: a model trained at 64 px
        is evaluated at 64 px), and the classes are the model's (a new folder needs only the checkpoint). With
        ``data_settings`` (export), the data's plain settings too, so that the run's split is drawn again; the
        data's folders stay the config's.
        """
        resolved = resolved_config(parser, config)
        hparams = {key: value for key, value in stored["hyper_parameters"].items() if key not in EVALUATION_CHOICES}
        taken = settings_to_take(
            hparams, resolved.get("model") or {}, self.model_class, "hyper_parameters", path, self.schema_packages
        )
        class_names, task = labels_and_task(hparams, path)
        if "backbone" in taken:  # the contract's network: bounded by the weights the file holds before it is built
            classes = len(class_names) if class_names else taken.get("num_classes", hparams.get("num_classes"))
            if isinstance(classes, int) and not isinstance(classes, bool):
                check_network_size(taken["backbone"], classes, stored, path, "hyper_parameters.backbone")
        for key, value in taken.items():
            config.model[key] = value
        data = config.data
        if data.get("init_args") is None:
            return
        try:
            record = Preprocessing.of_checkpoint(stored)
        except UserError as error:
            raise refusal(path, "preprocessing", f"is not a record of this project ({error})") from error
        trained = {"class_names": class_names, "task": task, **(record.as_dict() if record else {})}
        recorded = {key: value for key, value in trained.items() if value is not None}  # None: not recorded
        if data_settings:
            stored_data = stored.get("datamodule_hyper_parameters") or {}
            recorded_class = stored_data.get("_class_path") if isinstance(stored_data, dict) else None
            if recorded_class is not None and recorded_class != data.class_path:
                raise refusal(
                    path,
                    "datamodule_hyper_parameters._class_path",
                    f"is not {data.class_path}, the DataModule the config builds",
                )
            settings = resolved["data"].get("init_args") or {}
            # The split's settings as recorded, None included (data.fold: null, no fold held out).
            recorded = (
                settings_to_take(
                    stored_data,
                    settings,
                    imported(data.class_path),
                    "datamodule_hyper_parameters",
                    path,
                    self.schema_packages,
                    only_plain=True,
                )
                | recorded
            )
        for key, value in recorded.items():
            if key in data.init_args:
                data.init_args[key] = value

    @override
    def before_instantiate_classes(self) -> None:
        for note in replaced_callbacks_notes(
            config_files(self.config[self.subcommand] if self.subcommand else self.config)
        ):
            rank_zero_info(note)
        if self.run is None:
            return
        self.run.place(self.config[self.subcommand].trainer)
        self.save_config_kwargs["run"] = self.run

    @override
    def instantiate_classes(self) -> None:
        try:
            trainer = self.config[self.subcommand].trainer if self.subcommand else self.config.trainer
            check_tracker_packages(trainer)
            check_counts(trainer)
            # A model built to evaluate or export a checkpoint takes its weights from it: no pretrained ones read.
            with building_for_checkpoint(self.checkpoint_read is not None and self.subcommand != "fit"):
                super().instantiate_classes()
            check_model(self.model)
        except BaseException as error:
            if self.run is not None and launched_as_rank_zero():
                self.run.undo()
            if isinstance(error, ValueError) and isinstance(constructor_error(error), UserError):
                raise constructor_error(error) from error  # says what to do already
            if isinstance(error, ValueError):  # the constructors' checks of config values
                raise UsageError(
                    f"{constructor_error(error)}; fix that value in the config or on the command line"
                ) from error
            if isinstance(error, MisconfigurationException):  # the Trainer's own checks of its settings
                reason = " ".join(str(error).split()).rstrip(".")
                raise UsageError(f"trainer: {reason}; fix that value in the config or on the command line") from error
            raise

    @override
    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The trainer with the user's callbacks and plugins, plus what the project's guarantees rest on."""
        trainer = self._get(self.config_init, "trainer", default={})
        safety: Safety = self._get(self.config_init, "safety")
        run_dir = self.run.directory if self.run is not None else Path(trainer.get("default_root_dir") or ".")
        callbacks = [*as_list(trainer.get("callbacks")), *safety.callbacks(run_dir)]
        plugins, self.checkpoint_writer = with_atomic_writes(trainer.get("plugins"))
        if self.checkpoint_read is not None:
            self.checkpoint_writer.hand_over(*self.checkpoint_read)
        model, read = self.model, self.checkpoint_read

        def fits(checkpoint: dict[str, Any], source: object) -> None:
            """What Lightning restores (the dict read already, or a file it found itself: hpc) fits the model."""
            if read is None or checkpoint is not read[1]:
                self._hold_to_schema(checkpoint, source)
            check_fits(checkpoint, model, source)

        self.checkpoint_writer.fits = fits
        built = super().instantiate_trainer(**{"callbacks": callbacks, "plugins": plugins, **kwargs})
        if self.subcommand == "fit" and self.config.fit.recipe == "probe":
            probe_alone(built)
        monitor_what_the_labels_have(built, self.model)
        return built

    @override
    def _run_subcommand(self, subcommand: str) -> None:
        session = self.run.session
        keep = (lambda: session.trained) if subcommand == "fit" else (lambda: False)
        try:
            if self.trainer.is_global_zero:
                with self.run.held(keep):
                    super()._run_subcommand(subcommand)
            else:
                super()._run_subcommand(subcommand)
        except BaseException as error:
            safety = self._get(self.config_init, "safety")
            safety.peers.stop_watching()  # Lightning skips callbacks' teardown on this way out
            code = end_early(error, self.trainer, self.run, safety.stop, self.checkpoint_writer, trained=keep())
            if code is not None:  # a stopped run is not a finished one: say so in the exit status
                if keep():
                    CONSOLE.attach(self.run.directory, self.trainer.global_rank)
                leave_the_process_group()  # every rank stopped at the same batch
                raise SystemExit(code) from None
            if not isinstance(error, Exception) or is_a_decision(error):
                raise
            raise self._failure(error, trained=keep()) from error
        if self.trainer.is_global_zero and not self.trainer.interrupted:
            summary = fit_summary if subcommand == "fit" else evaluation_summary
            print(summary(self.trainer, self.run))
        CONSOLE.attach(self.run.directory, self.trainer.global_rank)
        CONSOLE.detach()
        leave_the_process_group()

    def _failure(self, error: Exception, trained: bool) -> Exception:
        """What to raise for ``error``: a mistake before training as itself, anything else as one line with a report.

        A mistake refused before the first step leaves the disk as it was (``Run.undo`` has run). Any other
        error keeps the run's ``logs/``: ``console.log`` and ``error.log`` (traceback, machine state).
        """
        mistake = isinstance(error, UserError) and not isinstance(error, NoSpaceError)
        if mistake and not trained:
            CONSOLE.discard()
            return error
        safety = self._get(self.config_init, "safety")
        guard, peers = safety.divergence, safety.peers
        line = describe_fault(error, self.trainer, self.run.directory, guard.first_step)
        if peers.failed_first is not None:  # under DDP: which rank, since every rank's output shares the screen
            line = f"rank {peers.failed_first} failed: {line}"
        if isinstance(error, FloatingPointError) and self.trainer.is_global_zero and self.run.subcommand == "fit":
            self.run.session.diverged = how_it_diverged(error, guard.first_step)
            print(fit_summary(self.trainer, self.run))
        CONSOLE.attach(self.run.directory, self.trainer.global_rank)
        report, problem = write_error_log(self.run.directory, error, line)
        peers.reported()
        where = f"full report: {report}" if report is not None else "no report could be written"
        if problem and report is not None:
            where += f", cut short: {problem}"
        elif problem:
            where += f": {problem}"
        return FaultError(f"{line} (FULL_ERROR=1 prints the traceback here; {where})")


def is_a_decision(error: BaseException) -> bool:
    """An exception that ends a command by design, not by failing: a sweep's pruned trial."""
    return type(error).__name__ == "TrialPruned" and type(error).__module__.startswith("optuna")


def main(
    model_class: type[L.LightningModule], default_config: Path | None = None, args: list[str] | None = None
) -> None:
    """Run the CLI on the project's LightningModule; a mistake ends in one ``error:`` line and exit code 2 or 1."""
    exit_when_launcher_dies()
    CONSOLE.start()  # what the run prints is also kept in its logs/console.log
    try:
        TrainerCLI(model_class, default_config=default_config, args=args)
    except Exception as error:
        exit_with(error)
