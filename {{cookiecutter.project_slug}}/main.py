"""Train, validate, test or predict: ``python main.py fit --config configs/{{ cookiecutter.dataset }}.yaml``.

Every subcommand starts from ``configs/{{ cookiecutter.dataset }}.yaml``; ``--config`` files and options go on top.
"""

from pathlib import Path

from {{ cookiecutter.import_name }}.machinery.cli import main

if __name__ == "__main__":  # guarded so that spawned DDP workers can import this file
    main(default_config=Path(__file__).resolve().parent / "configs" / "{{ cookiecutter.dataset }}.yaml")
