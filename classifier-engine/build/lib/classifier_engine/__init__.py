"""The engine of an image-classifier project: runs that resume exactly, the data path, export, sweeps, reports.

A project (rendered from the template in this repository) keeps its LightningModule, networks, DataModule,
recipe callbacks and configs; it reaches this library through ``class_path``s and the protocols of
``classifier_engine.data.interfaces``, and this library never imports the project.
"""

from importlib.metadata import version

__version__ = version("classifier-engine")  # pyproject.toml states it once
