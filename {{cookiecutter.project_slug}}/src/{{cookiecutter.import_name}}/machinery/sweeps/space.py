"""A sweep file: what to optimize, and the search space as data (dotted ``main.py fit`` keys).

.. code-block:: yaml

    metric: val/top1
    direction: maximize
    n_trials: 20
    sampler: {class_name: TPESampler, init_args: {seed: 0}}        # an optuna.samplers class, or a dotted path
    pruner: {class_name: MedianPruner, init_args: {n_warmup_steps: 2}}  # an optuna.pruners class, or a dotted path
    space:
      model.optimizer.init_args.lr: {type: float, low: 0.01, high: 0.5, log: true}
      data.cutout: {type: int, low: 0, high: 12, step: 4}
      model.label_smoothing: {type: categorical, choices: [0.0, 0.1, 0.2]}
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import optuna
import yaml
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from ..errors import UsageError

DISTRIBUTIONS = {"float": FloatDistribution, "int": IntDistribution, "categorical": CategoricalDistribution}
SPEC_KEYS = {"metric", "direction", "n_trials", "sampler", "pruner", "space"}


def _optuna_object(module: Any, spec: Any, what: str) -> Any:
    """``{class_name: X, init_args: {...}}`` (or just ``X``) as an instance of ``module.X``."""
    if spec is None:
        return None
    if isinstance(spec, str):
        spec = {"class_name": spec}
    name, args = str(spec.get("class_name")), spec.get("init_args") or {}
    if "." in name:  # your own, by import path
        module_name, _, name = name.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise UsageError(f"{what}: cannot import {module_name} ({error}); check the class_name") from None
    kind = getattr(module, name, None)
    if not isinstance(kind, type):
        raise UsageError(f"{what}: {name!r} is not a class of {module.__name__}; name one, e.g. TPESampler")
    try:
        return kind(**args)
    except (TypeError, ValueError) as error:
        raise UsageError(f"{what}: {name}({args}): {error}; fix its init_args") from error


@dataclass
class SweepSpec:
    """A parsed and checked sweep file."""

    path: Path
    metric: str
    direction: Literal["maximize", "minimize"]
    space: dict[str, BaseDistribution]
    n_trials: int | None = None
    sampler: dict | str | None = None
    pruner: dict | str | None = None

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
        unknown = sorted(set(data) - SPEC_KEYS)
        if unknown:
            raise UsageError(f"{where}: unknown key {unknown[0]!r}; the keys are {', '.join(sorted(SPEC_KEYS))}")
        for key in ("metric", "direction", "space"):
            if key not in data:
                raise UsageError(f"{where} has no {key}; add it (see configs/sweeps/)")
        if data["direction"] not in ("maximize", "minimize"):
            raise UsageError(f"{where}: direction must be maximize or minimize, not {data['direction']!r}")
        n_trials = data.get("n_trials")
        if n_trials is not None and (not isinstance(n_trials, int) or n_trials < 1):
            raise UsageError(f"{where}: n_trials must be a positive whole number, not {n_trials!r}")
        if not isinstance(data["space"], dict) or not data["space"]:
            raise UsageError(f"{where}: space must map dotted config keys to distributions")
        space = {key: cls._distribution(where, key, spec) for key, spec in data["space"].items()}
        sampler, pruner = data.get("sampler"), data.get("pruner")
        spec = cls(path, str(data["metric"]), data["direction"], space, n_trials, sampler, pruner)
        spec.make_sampler(), spec.make_pruner()  # checked now, before any trial
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
        return _optuna_object(optuna.samplers, self.sampler, "sampler")

    def make_pruner(self) -> optuna.pruners.BasePruner | None:
        return _optuna_object(optuna.pruners, self.pruner, "pruner")

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
