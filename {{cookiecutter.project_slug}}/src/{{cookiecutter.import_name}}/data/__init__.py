{%- if cookiecutter.dataset == 'images' -%}
"""The project's data: your photos' DataModule (over the engine's ``ImageDataModule``)."""

from .photos import PhotoDataModule

__all__ = ["PhotoDataModule"]
{%- else -%}
"""The project's data: CIFAR's memory-mapped DataModule (over the engine's ``ImageDataModule``)."""

from .cifar import CifarDataModule

__all__ = ["CifarDataModule"]
{%- endif %}
