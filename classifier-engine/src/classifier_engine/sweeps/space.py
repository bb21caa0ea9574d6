"""A sweep file: what to optimize, and the search space as data (dotted ``main.py fit`` keys).

.. code-block:: yaml

    metric: val/top1
    direction: maximize
    n_trials: 20
    sampler: {class_path: TPESampler, init_args: {seed: 0}}        # an optuna.samplers class, or a dotted path
    pruner: {class_path: MedianPruner, init_args: {n_warmup_steps: 2}}  # an optuna.pruners class, or a dotted path
    space:
      model.optimizer.init_args.lr: {type: float, low: 0.01, high: 0.5, log: true}
      data.cutout: {type: int, low: 0, high: 12, step: 4}
      model.label_smoothing: {type: categorical, choices: [0.0, 0.1, 0.2]}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import optuna
import yaml
from jsonargparse import ArgumentParser, Namespace
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from ..foundation.errors import UsageError, parse_error_line
from ..runs.loggers import class_of

DISTRIBUTIONS = {"float": FloatDistribution, "int": IntDistribution, "categorical": CategoricalDistribution}
Direction = Literal["maximize", "minimize"]


def sweep_file_parser() -> ArgumentParser:
    """The sweep file's keys and types; sampler and pruner in the ``class_path``/``init_args`` of every config."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--metric", type=str, required=True, help="the logged metric to optimize, e.g. val/top1")
    parser.add_argument("--direction", type=Direction, required=True, help="maximize or minimize the metric")
    parser.add_argument("--n_trials", type=int | None, default=None, help="trials the study should have")
    parser.add_argument("--sampler", type=optuna.samplers.BaseSampler | None, default=None, help="an Optuna sampler")
    parser.add_argument("--pruner", type=optuna.pruners.BasePruner | None, default=None, help="an Optuna pruner")
    parser.add_argument("--space", type=dict[str, dict[str, Any]], required=True, help="dotted key -> distribution")
    return parser


def _build(settings: Namespace | None) -> Any:
    """A new object from its parsed ``class_path``/``init_args`` (a constructor's refusal keeps its own words)."""
    if settings is None:
        return None
    return class_of(settings)(**(settings.get("init_args") or Namespace()).as_dict())


@dataclass
class SweepSpec:
    """A parsed and checked sweep file."""

    path: Path
    metric: str
    direction: Literal["maximize", "minimize"]
    space: dict[str, BaseDistribution]
    n_trials: int | None = None
    parsed: Namespace | None = None  # the file as parsed: the sampler and pruner are built anew from it for each study

    @classmethod
    def read(cls, path: Path) -> SweepSpec:
        """Read and check a sweep file; every mistake is a ``UsageError`` naming the key."""
        where = f"sweep file {path}"
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as error:
            raise UsageError(f"{where}: {error.strerror}; give the path of a sweep file (configs/sweeps/)") from None
        except yaml.YAMLError as error:
            raise UsageError(f"{where} is not valid YAML ({str(error).splitlines()[0]}); fix it") from None
        if not isinstance(data, dict):
            raise UsageError(f"{where} must be a mapping with metric, direction and space; see configs/sweeps/")
        try:
            parsed = sweep_file_parser().parse_object(data)
        except Exception as error:  # jsonargparse's report on the key and value it refused
            raise UsageError(f"{where}: {parse_error_line(str(error))}; fix it (see configs/sweeps/)") from None
        n_trials = parsed.n_trials
        if n_trials is not None and n_trials < 1:
            raise UsageError(f"{where}: n_trials must be a positive whole number, not {n_trials!r}")
        if not parsed.space:
            raise UsageError(f"{where}: space must map dotted config keys to distributions")
        space = {key: cls._distribution(where, key, spec) for key, spec in parsed.space.items()}
        spec = cls(path, parsed.metric, parsed.direction, space, n_trials, parsed)
        try:
            spec.make_sampler(), spec.make_pruner()  # built now, before any trial: a constructor's own check
        except (TypeError, ValueError) as error:
            raise UsageError(f"{where}: {error}; fix the sampler's or the pruner's init_args") from None
        return spec

    @staticmethod
    def _distribution(where: str, key: str, spec: Any) -> BaseDistribution:
        if not isinstance(spec, dict) or spec.get("type") not in DISTRIBUTIONS:
            raise UsageError(
                f"{where}: space.{key} needs a type of {', '.join(DISTRIBUTIONS)}, "
                "e.g. type: float, low: 0.01, high: 0.1, log: true"
            )
        args = {name: value for name, value in spec.items() if name != "type"}
        try:
            return DISTRIBUTIONS[spec["type"]](**args)
        except (TypeError, ValueError) as error:
            raise UsageError(f"{where}: space.{key}: {error}") from None

    def make_sampler(self) -> optuna.samplers.BaseSampler | None:
        return _build(self.parsed.sampler)

    def make_pruner(self) -> optuna.pruners.BasePruner | None:
        return _build(self.parsed.pruner)

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """The trial's values, drawn by the sampler, by dotted key."""
        values: dict[str, Any] = {}
        for key, distribution in self.space.items():
            if isinstance(distribution, FloatDistribution):
                d = distribution
                values[key] = trial.suggest_float(key, d.low, d.high, step=d.step, log=d.log)
            elif isinstance(distribution, IntDistribution):
                d = distribution
                values[key] = trial.suggest_int(key, d.low, d.high, step=d.step, log=d.log)
            else:
                values[key] = trial.suggest_categorical(key, distribution.choices)
        return values

    def probes(self) -> list[dict[str, Any]]:
        """Value sets that together touch every end of every range and every choice (to check them on the parser)."""
        rounds = max([2] + [len(d.choices) for d in self.space.values() if isinstance(d, CategoricalDistribution)])
        probes = []
        for index in range(rounds):
            values = {}
            for key, distribution in self.space.items():
                if isinstance(distribution, CategoricalDistribution):
                    values[key] = distribution.choices[index % len(distribution.choices)]
                else:
                    values[key] = distribution.low if index % 2 == 0 else distribution.high
            probes.append(values)
        return probes


def as_options(values: dict[str, Any]) -> list[str]:
    """``{key: value}`` as ``main.py fit`` options (JSON values, which jsonargparse reads for every type)."""
    return [f"--{key}={json.dumps(value) if not isinstance(value, str) else value}" for key, value in values.items()]
