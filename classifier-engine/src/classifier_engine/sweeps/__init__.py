"""Hyperparameter sweeps on Optuna: a sweep file (``space.py``), trials that are ordinary runs
(``trial.py``), a study shared by any number of workers (``study.py``), and what a study found
(``report.py``). ``sweep.py`` at the project root is the command."""
