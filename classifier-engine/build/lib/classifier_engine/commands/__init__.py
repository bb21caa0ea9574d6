"""The project's commands, as ``main.py``, ``export.py``, ``sweep.py``, ``check_labels.py`` and ``pack.py`` call them.

Each takes the project's parts (its LightningModule, its default config) as arguments: this library never
imports a project.
"""
