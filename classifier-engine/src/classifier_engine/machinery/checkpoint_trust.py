"""Which classes a checkpoint may name: a checkpoint is data, and a class it names is built only if trusted.

``torch.load(weights_only=True)`` refuses pickled code, but a checkpoint of plain dicts and strings still
names classes: the model's and the DataModule's hyperparameters hold ``class_path``s (``optimizer``,
``backbone``, ...) and Lightning's ``_instantiator``, and jsonargparse or ``load_from_checkpoint`` import and
call whatever they name (``{"class_path": "os.system", "init_args": {"command": ...}}`` runs a command). A
bare dotted string where a class is expected is read as a ``class_path`` too.

So every name a checkpoint gives is checked before anything is built from it. It is trusted when the
command's own config names it (a config is code the user runs), or when it is a class of a package the
project states (``TRUSTED_PACKAGES``, the project's own package, and what ``--trust`` adds); anything else
is refused in one line naming the key and the class, and nothing is imported from it.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

# Packages whose classes a checkpoint may name: the library, torch's optimizers and layers, timm's networks and
# losses, and Lightning's callbacks. (The project's own package is added by each command: ``for_project``.)
TRUSTED_PACKAGES = (
    "classifier_engine",
    "torch.optim",
    "torch.nn",
    "timm.models",
    "timm.loss",
    "lightning.pytorch.callbacks",
)
# Lightning's own allowlist (lightning.pytorch.core.saving) admits this one instantiator, which LightningCLI records.
TRUSTED_INSTANTIATOR = "lightning.pytorch.cli.instantiate_module"
# The sections of a checkpoint that are turned back into objects: the model's and the DataModule's arguments.
BUILT_SECTIONS = ("hyper_parameters", "datamodule_hyper_parameters")
CLASS_KEYS = ("class_path", "_class_path")
# Values that are data whatever they look like (a class may be called "os.path" by its owner).
DATA_KEYS = frozenset({"class_names"})
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def names_a_module(value: str) -> bool:
    """Whether a dotted string could be read as ``module.Class``: its first part is an importable module.

    ``find_spec`` of a top-level name looks the module up without running it. A namespace package (a plain
    folder such as ``photos/`` beside ``photos.csv``) holds no code of its own and does not count.
    """
    if not DOTTED.fullmatch(value):
        return False
    try:
        spec = importlib.util.find_spec(value.split(".", 1)[0])
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin not in (None, "namespace")


def named_classes(value: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """(key, name) of every class ``value`` names: ``class_path``s, ``_instantiator``s, and bare dotted names."""
    if isinstance(value, dict):
        for name, item in value.items():
            where = f"{key}.{name}" if key else str(name)
            if name in DATA_KEYS:
                continue
            if (name in CLASS_KEYS or name == "_instantiator") and isinstance(item, str):
                yield where, item
            else:
                yield from named_classes(item, where)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from named_classes(item, f"{key}[{index}]")
    elif isinstance(value, str) and names_a_module(value):
        yield key, value


def strings_in(value: Any) -> Iterator[str]:
    """Every string in a nested config (a dict, a list, a jsonargparse Namespace)."""
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    if isinstance(value, dict):
        for item in value.values():
            yield from strings_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from strings_in(item)
    elif isinstance(value, str):
        yield value


def _in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


def _is_class(name: str) -> bool:
    """Whether ``name`` (in a trusted package, so importing its module is safe) is a class: ``module.Class``."""
    module, _, attribute = name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(found, type)


@dataclass(frozen=True)
class ClassTrust:
    """The classes a command builds from a checkpoint: those its config names, and those of trusted packages."""

    packages: tuple[str, ...] = TRUSTED_PACKAGES
    named: frozenset[str] = field(default_factory=frozenset)
    named_by: str = "the command's config"

    def for_project(self, project_class: type | None) -> ClassTrust:
        """Also trust the package that defines ``project_class`` (the project's LightningModule)."""
        if project_class is None:
            return self
        package = project_class.__module__.split(".", 1)[0]
        if package in ("__main__", "builtins") or package in self.packages:
            return self
        return replace(self, packages=(*self.packages, package))

    def naming(self, config: Any = None, classes: Iterable[str] = (), named_by: str | None = None) -> ClassTrust:
        """Also trust every class the command's own ``config`` names, and ``classes`` (``named_by``: e.g. --trust)."""
        named = self.named | frozenset(strings_in(config)) | frozenset(classes)
        return replace(self, named=named, named_by=named_by or self.named_by)

    def trusts(self, key: str, name: str) -> bool:
        if key.endswith("_instantiator"):
            return name == TRUSTED_INSTANTIATOR
        if name in self.named:
            return True
        return any(_in_package(name, package) for package in self.packages) and _is_class(name)

    def refusal(self, checkpoint: dict[str, Any], path: object, how_to_trust: str) -> str | None:
        """Why ``checkpoint`` (read from ``path``) is refused, in one line, or None if it names only trusted classes.

        ``how_to_trust``: what the user can do when they do trust the file (in the command's own words).
        """
        for section in BUILT_SECTIONS:
            for key, name in named_classes(checkpoint.get(section), section):
                if not self.trusts(key, name):
                    packages = ", ".join(self.packages)
                    return (
                        f"{path} names {name} at {key}, which is not built from a checkpoint (only classes of "
                        f"{packages}, and those {self.named_by} names); use a checkpoint from a source you trust, "
                        f"or {how_to_trust}"
                    )
        return None
