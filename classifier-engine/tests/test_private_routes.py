"""The private Lightning, torch and argparse names the project relies on, where no public route exists.

Each is used in one place, with a comment saying why; if an upgrade moves one, this test names it
(the behaviour it serves is tested elsewhere, where a failure would be harder to read).
"""

from __future__ import annotations

import inspect

import lightning as L
import pytest
import torch
from lightning.pytorch.cli import LightningCLI
from torch.utils.tensorboard import SummaryWriter

from classifier_engine.cli.trainer_cli import TrainerCLI
from classifier_engine.testing import write_image_folder
from classifier_engine.testing.reference import REFERENCE_CONFIG, ReferenceClassifier


def test_the_trainer_has_the_sigterm_flag_and_the_logged_step_counter():
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert trainer._signal_connector.received_sigterm is False  # StopOnSignal sets it
    assert trainer.received_sigterm is False  # ... and Lightning's loops read it here
    assert trainer.fit_loop.epoch_loop._batches_that_stepped == 0  # foundation/logging_steps.metrics_step


def test_lightning_cli_still_parses_the_checkpoint_between_parsing_and_building():
    steps = inspect.getsource(LightningCLI.__init__)
    order = [
        steps.index(name) for name in ("self.parse_arguments", "self._parse_ckpt_path", "self.instantiate_classes")
    ]
    assert order == sorted(order)
    for name in ("_parse_ckpt_path", "_run_subcommand"):
        assert callable(getattr(LightningCLI, name)) and name in TrainerCLI.__dict__


def test_lightnings_restore_reads_through_the_checkpoint_io_which_returns_the_dict_a_command_read():
    """One read per command: the CLI hands the dict it checked to ``AtomicCheckpointIO``, and Lightning's restore
    (``_CheckpointConnector.resume_start``, private) asks the strategy, which asks its checkpoint IO, for the path."""
    from lightning.pytorch.strategies import Strategy
    from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

    assert "strategy.load_checkpoint(" in inspect.getsource(_CheckpointConnector.resume_start)
    assert "checkpoint_io.load_checkpoint(" in inspect.getsource(Strategy.load_checkpoint)


def test_argparse_actions_and_the_file_writer_and_foreach_kernels_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    photos = write_image_folder(tmp_path / "photos")
    args = ["--trainer.accelerator=cpu", f"--data.image_dir={photos}"]
    parser = TrainerCLI(ReferenceClassifier, default_config=REFERENCE_CONFIG, run=False, args=args).parser
    assert any(action.dest == "model.width" for action in parser._actions)
    writer = SummaryWriter(tmp_path)
    assert callable(writer._get_file_writer().add_summary)  # callbacks/model_report.py
    writer.close()
    slow, weights = [torch.zeros(2)], [torch.ones(2)]
    torch._foreach_lerp_(slow, weights, 0.5)  # callbacks/lookahead.py
    torch._foreach_copy_(weights, slow)
    assert weights[0].tolist() == pytest.approx([0.5, 0.5])


def test_a_fork_server_hands_its_alive_pipe_to_its_workers_where_they_close_it():
    from multiprocessing import forkserver

    assert hasattr(
        forkserver._forkserver, "_forkserver_alive_fd"
    )  # foundation/process_lifetime.end_with_the_rank closes it
    assert "_forkserver._forkserver_alive_fd" in inspect.getsource(forkserver._serve_one)  # ... set in each worker


def test_lightning_clis_config_reader_parser_and_seeding_keep_their_signatures():
    # cli/trainer_cli.py reads the built config with _get and each subcommand's parser with _parser;
    # machinery/sweeps/validate.py and cli/pack_command.py override _set_seed to parse without seeding.
    assert list(inspect.signature(LightningCLI._get).parameters) == ["self", "config", "key", "default"]
    assert list(inspect.signature(LightningCLI._parser).parameters) == ["self", "subcommand"]
    assert list(inspect.signature(LightningCLI._set_seed).parameters) == ["self"]
    assert "self._set_seed()" in inspect.getsource(LightningCLI.__init__)


def test_the_dataloader_draws_its_batches_from_its_index_sampler():
    # data/loader.py replaces _index_sampler (a property) to start an epoch at a given batch.
    from torch.utils.data import DataLoader
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    assert isinstance(inspect.getattr_static(DataLoader, "_index_sampler"), property)
    assert "loader._index_sampler" in inspect.getsource(_BaseDataLoaderIter.__init__)


def test_litdatas_store_client_options_random_source_crash_report_and_fs_provider():
    # data/streams/object_store.py: the S3 client's options (allow_http), the credential jitter's random source, the
    # prefetch thread's crash report, and the one-file reader its optimize() uses.
    import random

    from litdata.streaming import client, downloader, fs_provider, reader

    assert isinstance(downloader._OBSTORE_CLIENT_OPTIONS, dict)
    assert client.random is random or isinstance(client.random, random.SystemRandom)
    assert "random." in inspect.getsource(client)  # the jitter still draws from the module-level name
    assert callable(reader.PrepareChunksThread._report_crash)
    assert list(inspect.signature(fs_provider._get_fs_provider).parameters)[:2] == [
        "remote_filepath",
        "storage_options",
    ]
