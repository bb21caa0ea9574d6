"""What a command takes from a checkpoint: plain values checked against declared types, never parsed.

A checkpoint is data from anywhere. ``torch.load(weights_only=True)`` keeps pickled code out, but the dicts
and strings it leaves can still be read by parsers that understand far more than values: jsonargparse reads a
string as YAML (a class spec), as a config file's path or as a URL, ``load_from_checkpoint`` merges older
keys and builds what they name, and a dotted name imported from a trusted module may be defined anywhere. No
scan of the raw dict can model all of that, so no value of a checkpoint is ever handed to those parsers.

The model and the DataModule are built from the project's code and the config the user runs. From a
checkpoint a command takes only:

- tensors, once their shapes match what that model expects (``checkpoint_shapes``);
- plain values (numbers, booleans, ``None``, strings of a ``Literal`` or used only as names, lists, tuples and
  string-keyed dicts of those), each checked against the declared type of the constructor argument it goes
  to, and set on the parsed config as a value (never parsed);
- a class spec (the network, the loss, the schedule) that equals the config's, or that passes the strict
  schema: a class *defined* (its ``__module__``) in the project's package or in ``SCHEMA_PACKAGES``, looked
  up by one plain name in its own module, every argument a plain value of its annotated type (an untyped
  argument is refused).

Anything else is refused in one line that names the key and says how to pass the run's own config.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from jsonargparse import Namespace

from ..foundation.errors import UserError
from ..foundation.plain_values import Strings, admits
from ..models.starting_weights import building_for_checkpoint, starting_weights_arguments

# Packages whose own classes (defined there, not merely imported) a checkpoint's class spec may name: the
# library, torch's layers, losses and optimizers, timm's networks and losses. The project's package is added.
SCHEMA_PACKAGES = ("classifier_engine", "torch.nn", "torch.optim", "timm.models", "timm.layers", "timm.loss")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Settings whose strings are labels: data, whatever they spell (a class may be called "os.path" by its owner).
LABEL_KEYS = frozenset({"class_names"})
MAX_CLASSES = 100_000  # more classes than any label set of this kind of project: a bound, not a limit in use
HOW_TO_TRUST = "pass the run's own config.yaml with --config if you trust it, or use a checkpoint of this project"


class CheckpointError(UserError, ValueError):
    """A file that cannot be used as a checkpoint of this project; the message says why."""


def refusal(source: object, key: str, why: str) -> CheckpointError:
    return CheckpointError(f"{source}: {key} {why}; {HOW_TO_TRUST}")


def _constructors(cls: type) -> Iterator[Any]:
    """The ``__init__`` of ``cls``, then of each base class its ``**kwargs`` passes arguments on to."""
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None:
            continue
        yield init
        if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            return


def constructor_arguments(cls: type) -> set[str]:
    """Every named constructor argument of ``cls``, typed or not, following ``**kwargs`` to the base classes."""
    return {
        p.name
        for init in _constructors(cls)
        for p in inspect.signature(init).parameters.values()
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"
    }


def constructor_hints(cls: type) -> dict[str, Any]:
    """The annotated constructor arguments of ``cls``, following ``**kwargs`` to the base classes that take them.

    An argument without an annotation (or one whose annotation cannot be resolved) is left out: untyped.
    """
    hints: dict[str, Any] = {}
    for init in _constructors(cls):
        try:
            resolved = typing.get_type_hints(init)
        except Exception:  # a name the annotation uses is not importable here: the argument counts as untyped
            resolved = {}
        for name in inspect.signature(init).parameters:
            if name in resolved and name != "self":
                hints.setdefault(name, resolved[name])
    return hints


def as_json(value: Any) -> Any:
    """``value`` as the config's JSON dump holds it (tuples as lists, Namespaces as dicts), to compare."""
    if isinstance(value, Namespace):
        value = value.as_dict()
    try:
        return json.loads(json.dumps(value, sort_keys=True))
    except (TypeError, ValueError):
        return object()  # never equal to anything


def is_class_spec(value: Any) -> bool:
    return isinstance(value, dict) and "class_path" in value


def defined_class(class_path: Any, packages: tuple[str, ...], source: object, key: str) -> type:
    """The class ``class_path`` names, if a package of ``packages`` defines it; refused in one line otherwise.

    The name is plain ASCII identifiers (no attribute traversal past the module, no look-alike letters); the
    module is imported only inside a stated package, and the class must be defined there (``__module__``).
    """
    if not isinstance(class_path, str) or not class_path.isascii() or len(class_path) > 200:
        raise refusal(source, key, "names no class this project builds from a checkpoint")
    parts = class_path.split(".")
    if len(parts) < 2 or not all(IDENTIFIER.fullmatch(part) for part in parts):
        raise refusal(source, key, f"names {class_path!r}, which is not a class of a stated package")
    module_name, name = ".".join(parts[:-1]), parts[-1]
    if not any(_in_package(module_name, package) for package in packages):
        raise refusal(source, key, f"names {class_path}, which is not a class of {', '.join(packages)}")
    try:
        found = vars(importlib.import_module(module_name)).get(name)
    except ImportError:
        found = None
    owner = getattr(found, "__module__", None) if isinstance(found, type) else None
    if not isinstance(found, type) or not any(_in_package(owner or "", package) for package in packages):
        raise refusal(source, key, f"names {class_path}, which is not a class defined in {', '.join(packages)}")
    return found


def _in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


def strict_spec(spec: dict, config_spec: Any, packages: tuple[str, ...], source: object, key: str) -> Namespace | None:
    """A checkpoint's class spec as the parsed config would hold it, if it passes the strict schema; refused otherwise.

    The class is the one the config's spec names (the same ``class_path``), or one *defined* in ``packages``;
    every argument is plain data of its annotated type. The arguments that only choose starting weights
    (``starting_weights_arguments``) are never taken: the config's stand. None: the spec is the config's.
    """
    if set(spec) - {"class_path", "init_args"}:
        extra = sorted(set(spec) - {"class_path", "init_args"})[0]
        raise refusal(source, f"{key}.{extra}", "is not part of a class spec this project builds")
    class_path = spec["class_path"]
    arguments = spec.get("init_args") or {}
    if not isinstance(arguments, dict):
        raise refusal(source, f"{key}.init_args", "is not a set of arguments")
    configured = (config_spec.get("init_args") or {}) if is_class_spec(config_spec) else {}
    if is_class_spec(config_spec) and config_spec["class_path"] == class_path and isinstance(class_path, str):
        cls = _config_class(class_path)  # the config names it: imported as the config's parse imported it
    else:
        cls, configured = defined_class(class_path, packages, source, f"{key}.class_path"), {}
    ignored = starting_weights_arguments(cls)
    arguments = {name: value for name, value in arguments.items() if name not in ignored}
    kept = {name: value for name, value in configured.items() if name in ignored}
    if configured and as_json(arguments) == as_json({k: v for k, v in configured.items() if k not in ignored}):
        return None
    hints = constructor_hints(cls)
    for name, value in arguments.items():
        where = f"{key}.init_args.{name}"
        if name not in hints:
            raise refusal(source, where, f"is not a typed argument of {class_path}")
        if not admits(hints[name], value):
            raise refusal(source, where, f"is not plain data of its declared type ({describe(value)})")
    return Namespace(class_path=class_path, init_args=Namespace(**arguments, **kept))


def _config_class(class_path: str) -> type:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def describe(value: Any) -> str:
    """A short, printable account of a value from a file (never its whole text)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def settings_to_take(
    stored: Any,
    config: Mapping[str, Any],
    target: type,
    section: str,
    source: object,
    packages: tuple[str, ...],
    only_plain: bool = False,
) -> dict[str, Any]:
    """The settings of ``stored`` (a checkpoint's section) to set on the config's section of class ``target``.

    A setting the config already gives equally is left alone. Any other is taken only as plain data of its
    declared type (a free string only as a name), or as a class spec that passes ``strict_spec``; else the
    checkpoint is refused, as it is for a key ``target`` does not take (a checkpoint of another model). With
    ``only_plain`` (the data's settings, where the config's folders stand), such a key, a class spec, a free
    string or a value of another type is not taken and the config's stands, and a string is taken only from
    a ``Literal``. ``config``: the section as the config's JSON dump holds it.
    """
    if not isinstance(stored, dict):
        raise refusal(source, section, "is not a set of settings")
    hints = constructor_hints(target)
    arguments = constructor_arguments(target)
    taken: dict[str, Any] = {}
    for key, value in stored.items():
        where = f"{section}.{key}"
        if isinstance(key, str) and key.startswith("_"):
            continue  # Lightning's _instantiator and _class_path: nothing reads them
        if not isinstance(key, str) or key not in arguments:
            if only_plain:
                continue  # the data's: not read
            name = key if isinstance(key, str) and key.isprintable() and len(key) <= 60 else describe(key)
            raise refusal(source, f"{section}.{name}", f"is not an argument of {target.__name__}")
        if key in config and as_json(value) == as_json(config[key]):
            continue
        strings: Strings = "any" if key in LABEL_KEYS else "literals" if only_plain else "names"
        if key in hints and admits(hints[key], value, strings):
            taken[key] = value
        elif only_plain:
            continue
        elif is_class_spec(value):
            spec = strict_spec(value, config.get(key), packages, source, where)
            if spec is not None:
                taken[key] = spec
        elif key not in hints:
            raise refusal(source, where, f"differs from the config's and {target.__name__} does not declare its type")
        else:
            raise refusal(source, where, f"is not plain data of its declared type ({describe(value)})")
    names = taken.get("class_names")
    if isinstance(names, list | tuple) and len(names) > MAX_CLASSES:
        raise refusal(source, f"{section}.class_names", f"lists {len(names)} classes, more than {MAX_CLASSES}")
    return taken


def package_of(cls: type | None) -> tuple[str, ...]:
    """The top-level package that defines ``cls`` (the project's), to add to ``SCHEMA_PACKAGES``."""
    if cls is None:
        return ()
    package = cls.__module__.split(".", 1)[0]
    return () if package in ("__main__", "builtins") else (package,)


def run_config_hint(path: Path) -> str:
    """Where the run's own config would be, named (never read) for a refusal's advice."""
    return str(Path(path).parent.parent / "config.yaml")


# The sections a command reads, each a dict when present.
SECTIONS = ("state_dict", "hyper_parameters", "datamodule_hyper_parameters", "loops", "callbacks")
MAX_DEPTH = 32


def check_structure(checkpoint: dict, source: object) -> None:
    """Refuse, in one line, a checkpoint whose sections are not dicts or whose tensors claim more than the file holds.

    A tensor's elements must all be in its storage: a zero-stride view of 2³¹ rows (a few bytes in the file)
    would otherwise ask for terabytes the moment anything copies it.
    """
    for section in SECTIONS:
        if section in checkpoint and not isinstance(checkpoint[section], dict):
            raise refusal(source, section, "is not a set of entries")
    state = checkpoint.get("state_dict", {})
    for key, value in state.items():
        if not isinstance(key, str) or not torch.is_tensor(value):
            raise refusal(source, f"state_dict.{describe(key)}", "is not a named tensor")
    _check_tensors(checkpoint, "", source, 0)
    for name, state in checkpoint.get("callbacks", {}).items():
        if isinstance(state, dict) and "dirpath" in state:
            _check_checkpoint_paths(state, f"callbacks.{name}", source)


# The files a checkpoint writer's state names that it may later delete (as worse than a new one, or as the previous
# last): Lightning restores them only when the state's folder is the writer's own, so they must lie in that folder.
# (Its best_model_path is restored whatever the folder, and a run moved elsewhere keeps the old one: never deleted.)
WRITER_PATHS = ("kth_best_model_path", "last_model_path")


def _check_checkpoint_paths(state: dict, key: str, source: object) -> None:
    """The files a checkpoint writer may delete are in its own folder: a checkpoint never names others to delete."""
    folder = state.get("dirpath")
    best_k = state.get("best_k_models") or {}
    if not isinstance(folder, str | type(None)) or not isinstance(best_k, dict):
        raise refusal(source, key, "is not the state of a checkpoint writer")
    paths = [state.get(name) for name in WRITER_PATHS] + list(best_k)
    for path in paths:
        if path in (None, ""):
            continue
        if (
            not isinstance(path, str)
            or folder is None
            or os.path.dirname(os.path.normpath(path)) != os.path.normpath(folder)
        ):
            raise refusal(source, key, f"names a file outside its checkpoint folder ({describe(path)})")


def _check_tensors(value: Any, key: str, source: object, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise refusal(source, key, f"nests deeper than {MAX_DEPTH} levels")
    if torch.is_tensor(value):
        held = value.untyped_storage().nbytes() if value.device.type != "meta" else 0
        claimed = value.numel() * value.element_size()
        if claimed > held or value.is_sparse or value.device.type == "meta":
            shape = "x".join(str(size) for size in value.shape)
            raise refusal(source, key or "a tensor", f"claims a tensor of {shape} that the file does not hold")
    elif isinstance(value, dict):
        for name, item in value.items():
            _check_tensors(item, f"{key}.{name}" if key else str(name), source, depth + 1)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_tensors(item, f"{key}[{index}]", source, depth + 1)


def check_fits(checkpoint: dict, model: Any, source: object) -> None:
    """Every tensor the model takes from ``checkpoint`` has the shape the model (built from the config) expects.

    The weights, key by key; the bank of training features (2-D, as wide as the model's features, no more
    rows than its bound); the calibration's per-class numbers. Refused in one line naming the key and the
    shape, before anything is copied.
    """
    expected = model.state_dict()
    given = checkpoint.get("state_dict", {})
    for key, tensor in given.items():
        if key not in expected:
            raise refusal(source, f"state_dict.{key}", "is not a weight of the model the config builds")
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise refusal(
                source,
                f"state_dict.{key}",
                f"has shape {list(tensor.shape)} where the model the config builds has {list(expected[key].shape)}",
            )
    _check_calibration(checkpoint, model, source)


def _check_calibration(checkpoint: dict, model: Any, source: object) -> None:
    from ..models.calibration import BANK_KEY, CHECKPOINT_KEY
    from ..models.domain import bank_capacity

    classes = len(model.class_names)
    record = checkpoint.get(CHECKPOINT_KEY)
    if record is not None:
        if not isinstance(record, dict):
            raise refusal(source, CHECKPOINT_KEY, "is not a calibration record")
        for name, allowed in (("temperature", (1, classes)), ("thresholds", (classes,))):
            value = record.get(name)
            numbers = isinstance(value, list) and all(type(item) in (int, float) for item in value)
            if value is not None and (not numbers or len(value) not in allowed):
                raise refusal(source, f"{CHECKPOINT_KEY}.{name}", f"is not {' or '.join(map(str, allowed))} numbers")
    bank = checkpoint.get(BANK_KEY)
    if bank is None:
        return
    if not torch.is_tensor(bank) or bank.ndim != 2 or not bank.is_floating_point():
        raise refusal(source, BANK_KEY, "is not a 2-D tensor of features")
    width = feature_width(model)
    if bank.shape[1] != width or bank.shape[0] > bank_capacity(width):
        raise refusal(
            source,
            BANK_KEY,
            f"has shape {list(bank.shape)} where the model's features are {width} wide and the bank holds at most "
            f"{bank_capacity(width)} rows",
        )


def feature_width(model: Any) -> int:
    """How wide the model's penultimate features are: one blank image through ``features()``, in eval mode."""
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            probe = torch.zeros(1, 3, model.image_size, model.image_size, dtype=torch.uint8, device=model.device)
            return int(model.features(probe).shape[1])
    finally:
        model.train(training)


def labels_and_task(hparams: dict, source: object) -> tuple[list[str] | None, str | None]:
    """The model's class names (labels: any text, at most ``MAX_CLASSES``) and task, checked as plain data."""
    names, task = hparams.get("class_names"), hparams.get("task")
    if not admits(list[str] | None, names, "any") or (names is not None and len(names) > MAX_CLASSES):
        raise refusal(source, "hyper_parameters.class_names", f"is not a list of at most {MAX_CLASSES} class names")
    if not admits(Literal["multiclass", "multilabel"] | None, task, "literals"):
        raise refusal(source, "hyper_parameters.task", f"is not multiclass or multilabel ({describe(task)})")
    return (list(names) if names is not None else None), task


def check_network_size(spec: Namespace, num_classes: int, checkpoint: dict, source: object, key: str) -> None:
    """A network spec taken from a checkpoint builds no more than the weights the file holds.

    The network is built once on the meta device (no memory), so a width of millions in an otherwise plain spec is
    refused in one line before the real build would ask for terabytes. A spec that cannot be built there is left
    to the real build, which says what is wrong.
    """
    module, _, name = spec.class_path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    try:
        with torch.device("meta"), building_for_checkpoint():
            network = cls(num_classes, **spec.init_args.as_dict())
        tensors = [*network.parameters(), *network.buffers()] if isinstance(network, torch.nn.Module) else []
    except Exception:
        return
    size = sum(tensor.numel() * tensor.element_size() for tensor in tensors)
    held = sum(tensor.numel() * tensor.element_size() for tensor in checkpoint.get("state_dict", {}).values())
    if size > held + 2**20:
        raise refusal(
            source,
            key,
            f"builds a network of {size / 2**20:.0f} MiB where the checkpoint holds {held / 2**20:.0f} MiB of weights",
        )
