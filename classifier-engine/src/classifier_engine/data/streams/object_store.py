"""Where a streamed dataset lies: a local folder, or a prefix in object storage (``s3://``, ``gs://``, ``r2://``).

The store is reached as litdata reaches it, so the small files of a dataset (``dataset.json``) go
where its chunks go, with the same credentials: the standard variables of the store's own tools
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ...;
``GOOGLE_APPLICATION_CREDENTIALS``), and ``storage_options`` for what they cannot say (passed to
the client as litdata passes it: ``endpoint_url``, ``aws_access_key_id``, ...).
"""

from __future__ import annotations

import logging
import os
import random
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lightning.pytorch.utilities.seed import isolate_rng

from ..errors import DataError, DataSettingError

REMOTE_SCHEMES = ("s3", "gs", "r2")

# A decorator for what reads or writes the store in a training process. Store clients draw from Python's global
# random (s3transfer names its temporary files with it) as often as caches and timing make them reach the store,
# so a run's random stream, and a resumed run's equality to an uninterrupted one, would depend on them.
random_state_kept = isolate_rng(include_cuda=False)


def configure_store_client() -> None:
    """Set what the project needs of litdata's store client in this process; no public option reaches either.

    - ``allow_http``: litdata builds obstore's S3 client from a module-level options dict without it, so an
      ``http://`` endpoint (a store on the local network, a test server) fails at once with ``BadScheme``
      (``AWS_ALLOW_HTTP`` is not read there). The endpoint's scheme stays the user's choice.
    - Its own random source: litdata jitters credential refreshes with Python's global ``random`` each time a
      client is made, lazily and in loader threads, so the global state a resumed run restores would depend
      on timing. The jitter is drawn from the operating system instead; the global state stays the run's.

    - Its chunk prefetch thread's crash report: a loader worker prints it, traceback and all, on the screen;
      the reader hands the same error to the training process, whose one line (and error.log) report it.
      The report goes to litdata's logger instead, at debug level.

    Called in every process that reaches the store (spawned processes import litdata afresh). Each of the
    three is a private name of litdata's (pyproject.toml bounds litdata below its next minor); each is pinned
    by tests/test_private_routes.py, and a name gone fails here at once, never silently.
    """
    from litdata.streaming import client, downloader, reader

    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"
    if client.random is random:
        client.random = random.SystemRandom()
    reader.PrepareChunksThread._report_crash = _log_prefetch_crash


def _log_prefetch_crash(thread: Any, error: BaseException) -> None:
    logging.getLogger("litdata.streaming.reader").debug("chunk prefetch stopped", exc_info=error)


def is_remote(location: str) -> bool:
    return urlparse(location).scheme in REMOTE_SCHEMES


def check_location(location: str, what: str) -> str:
    """``location`` without a trailing slash, or a one-line refusal of a scheme litdata cannot write or read."""
    scheme = urlparse(location).scheme
    if scheme and len(scheme) > 1 and scheme not in REMOTE_SCHEMES:
        raise DataSettingError(
            f"{what} {location}: {scheme}:// is not a store this project reads; use s3://, gs://, r2:// or a folder"
        )
    if not is_remote(location):
        return str(Path(location).expanduser())
    if not urlparse(location).netloc:
        raise DataSettingError(f"{what} {location} names no bucket; write it as {scheme}://<bucket>/<prefix>")
    return location.rstrip("/")


def join(location: str, *names: str) -> str:
    return "/".join([location.rstrip("/"), *names]) if is_remote(location) else str(Path(location, *names))


def _provider(url: str, options: Mapping[str, Any]) -> Any:
    # litdata exports no public reader of one file of a store; this is the route its optimize() writes
    # index files by (same client, same credentials and endpoint as the chunks).
    from litdata.streaming.fs_provider import _get_fs_provider

    configure_store_client()
    if urlparse(url).scheme == "s3":
        # litdata's S3 client retries up to 1000 times (right for chunks under throttling); a store that
        # does not answer the first read of a command should be said in seconds, not after a quarter of an hour.
        import botocore.config

        answer_soon = botocore.config.Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=10)
        options = {"config": answer_soon, **options}  # a config of the user's own wins
    return _get_fs_provider(url, dict(options))


@random_state_kept
def read_text(location: str, name: str, options: Mapping[str, Any]) -> str | None:
    """The text of ``name`` under ``location``, or None when there is no such file."""
    path = join(location, name)
    if not is_remote(location):
        return Path(path).read_text(encoding="utf-8") if Path(path).is_file() else None
    provider = _provider(path, options)
    try:
        if not provider.exists(path):
            _check_bucket(provider, location)
            return None
    except Exception as error:
        raise store_error(error, location) from error
    with tempfile.TemporaryDirectory() as folder:
        local = os.path.join(folder, name)
        try:
            provider.download_file(path, local)
        except Exception as error:
            raise store_error(error, location) from error
        return Path(local).read_text(encoding="utf-8")


def _check_bucket(provider: Any, location: str) -> None:
    """Raise the store's own error when the bucket of ``location`` does not exist (S3; others say it on read)."""
    client = getattr(getattr(provider, "client", None), "client", None)
    if client is not None and urlparse(location).scheme == "s3":
        client.head_bucket(Bucket=urlparse(location).netloc)


@random_state_kept
def write_text(location: str, name: str, text: str, options: Mapping[str, Any]) -> None:
    """Put ``text`` at ``name`` under ``location`` whole (an object store's put is atomic; a folder's rename is)."""
    path = join(location, name)
    if not is_remote(location):
        from ...foundation.files import Partial

        Path(location).mkdir(parents=True, exist_ok=True)
        with Partial(path) as partial:
            partial.write_text(text, encoding="utf-8")
        return
    with tempfile.TemporaryDirectory() as folder:
        local = os.path.join(folder, name)
        Path(local).write_text(text, encoding="utf-8")
        try:
            _provider(path, options).upload_file(local, path)
        except Exception as error:
            raise store_error(error, location) from error


@random_state_kept
def remove_prefix(location: str, options: Mapping[str, Any]) -> None:
    """Delete every object under ``location`` (what a refused packing wrote there); a store's refusal is ignored."""
    try:
        _provider(location, options).delete_file_or_directory(location)
    except Exception:  # nothing there, or the store refuses: the command's own error says what went wrong
        return


def store_error(error: BaseException, location: str) -> DataError:
    """One line for a store that cannot be used: not answering, no such bucket, credentials refused."""
    text = f"{type(error).__name__}: {error}"
    code = ""
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", ""))
    bucket = urlparse(location).netloc
    if "NoSuchBucket" in (code + text) or (code in ("404", "NotFound") and "HeadBucket" in text):
        return DataError(f"{location}: the bucket {bucket} does not exist; create it, or check the URL's bucket name")
    keys = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or data.storage_options"
    if "NoCredentialsError" in text or "Unable to locate credentials" in text:
        return DataError(f"{location}: no credentials for the store were found; set {keys}")
    credentials = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "Forbidden", "403", "ExpiredToken")
    if any(word in code for word in credentials):
        return DataError(
            f"{location}: the store refused the credentials ({code}); set {keys}, to keys that may read and write it"
        )
    unreachable = ("EndpointConnectionError", "ConnectTimeout", "ConnectionError", "Could not connect", "timed out")
    if any(word in text for word in unreachable):
        endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
        at = f" at {endpoint}" if endpoint else ""
        return DataError(
            f"{location}: the store{at} does not answer ({type(error).__name__}); check the network, "
            "AWS_ENDPOINT_URL or data.storage_options' endpoint_url"
        )
    return DataError(
        f"{location}: the store could not be used ({text.splitlines()[0][:200]}); check the URL and access"
    )
