"""The study every worker shares: its storage, and the loop that takes trials until the study has its count.

Workers started with the same ``--study`` and ``--storage`` share the study; Optuna's storage
hands each trial to one worker only. A worker killed mid-trial stops sending heartbeats; after
the grace period its trial is marked failed and re-queued with the same values
(``RetryHeartbeatStaleTrialCallback``), and the worker that takes it resumes the killed trial's run from
its ``last.ckpt`` (the same values make the same config, so the same run directory).
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from ..foundation.errors import UsageError
from .space import SweepSpec

JOURNAL_PREFIX = "journal:"


def without_password(url: str) -> str:
    """A storage URL fit to print: ``postgresql://user:***@host/db``."""
    if url.startswith(JOURNAL_PREFIX):
        return url
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:  # not a URL at all: nothing in it to hide
        return url


@contextmanager
def _heartbeats() -> Iterator[None]:
    """Optuna marks heartbeats and trial retries experimental (since 2.9); they are used here on purpose."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        yield


def open_storage(url: str, heartbeat_interval: int, grace_period: int) -> optuna.storages.BaseStorage:
    """``sqlite:///...`` or any SQLAlchemy URL (with heartbeats), or ``journal:PATH`` (Optuna's journal file)."""
    if url.startswith(JOURNAL_PREFIX):
        path = Path(url.removeprefix(JOURNAL_PREFIX))
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    try:
        with _heartbeats():
            return RDBStorage(
                url,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=3),
            )
    except Exception as error:  # an unknown dialect, a missing driver, a server that does not answer
        reason = str(error).splitlines()[0]
        shown = without_password(url)
        raise UsageError(f"--storage {shown}: {reason}; give sqlite:///PATH, a database URL or journal:PATH") from None


def open_study(spec: SweepSpec, name: str, storage: optuna.storages.BaseStorage) -> optuna.Study:
    """Create the study, or join it if it exists (its direction must match the sweep file's).

    A worker that joins draws from its own random stream: workers seeded alike would otherwise
    draw the same values, and train the same config, side by side.
    """
    joining = name in optuna.get_all_study_names(storage)
    try:
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            direction=spec.direction,
            sampler=spec.make_sampler(),
            pruner=spec.make_pruner(),
            load_if_exists=True,
        )
    except ValueError as error:
        raise UsageError(f"study {name}: {error}; use another --study name") from None
    if joining:
        study.sampler.reseed_rng()
    return study


def run_worker(study: optuna.Study, objective, n_trials: int, heartbeat_interval: int | None) -> None:
    """Take trials one at a time until the study (all workers together) has ``n_trials`` finished ones.

    A re-queued trial (of a killed worker) is taken before a new one. With heartbeats (database
    storages: ``heartbeat_interval`` is not None), a worker with nothing left to start waits for
    the trials other workers are running: each either finishes, or stops beating and is failed and
    re-queued here.
    """
    while True:
        with _heartbeats():
            optuna.storages.fail_stale_trials(study)  # a killed worker's trial: failed, then re-queued
        count = Counter(trial.state for trial in study.get_trials(deepcopy=False))
        finished = count[TrialState.COMPLETE] + count[TrialState.PRUNED]
        if finished >= n_trials:
            return
        if count[TrialState.WAITING] or finished + count[TrialState.RUNNING] < n_trials:
            study.optimize(objective, n_trials=1, gc_after_trial=True)
        elif heartbeat_interval and count[TrialState.RUNNING]:
            time.sleep(heartbeat_interval)
        else:
            return
