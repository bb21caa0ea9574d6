"""The service wing: run identity and resume, locks, signals, atomic files, errors, export and sweep internals.

Nothing here needs reading to train; README.md beside this file lists what it guarantees.
"""
