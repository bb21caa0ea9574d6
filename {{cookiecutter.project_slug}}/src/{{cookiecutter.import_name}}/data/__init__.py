{%- if cookiecutter.dataset == 'images' -%}
"""The project's data: your photos' DataModule (the engine's parts are in ``classifier_engine.data``)."""

from .photos import PhotoDataModule

__all__ = ["PhotoDataModule"]
{%- else -%}
"""The project's data: CIFAR's memory-mapped DataModule (the engine's parts are in ``classifier_engine.data``)."""

from .cifar import CifarDataModule

__all__ = ["CifarDataModule"]
{%- endif %}
