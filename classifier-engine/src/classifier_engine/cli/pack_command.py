"""``pack.py``: your own images packed by litdata into object storage (or a folder), by one machine or many.

The options are ``fit``'s, from the project's default config and ``--config`` files on, and the images go
through the project's own DataModule class, so the packed images are exactly those ``fit`` would pack:
same listing, held-out split (its ``split()``), size, resize rule and interpolation.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser, instantiate_class
from typing_extensions import override

from ..data.errors import DataSettingError
from ..data.folder import ImageFolderDataModule
from ..data.packing import default_workers
from ..data.streams.object_store import check_location, is_remote
from ..foundation.errors import UsageError, exit_with
from ..foundation.noise import silence_known_noise
from .trainer_cli import TrainerCLI, constructor_error, fill_expected_input, imported

# Where a launcher says which of how many processes this is: (count, rank) variable names.
LAUNCHERS = (
    ("DATA_OPTIMIZER_NUM_NODES", "DATA_OPTIMIZER_NODE_RANK"),  # litdata's own, set by hand
    ("WORLD_SIZE", "RANK"),  # torchrun, Lightning's launcher, Kubeflow's PyTorchJob / TrainJob through torchrun
    ("SLURM_NTASKS", "SLURM_PROCID"),  # srun
    ("PET_NNODES", "PET_NODE_RANK"),  # a Kubeflow TrainJob's command without torchrun
)
PROCESSES_PER_MACHINE = ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE")


def packing_node(environ: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """(processes packing, this one's rank) from the launcher's variables; (1, 0) when started by hand."""
    for count, rank in LAUNCHERS:
        if count in environ:
            nodes, node = int(environ[count]), int(environ.get(rank, 0))
            if not 0 <= node < nodes:
                raise UsageError(f"{rank}={node} is not a rank of {count}={nodes}; check the launcher's variables")
            return nodes, node
    return 1, 0


def workers_per_process(environ: Mapping[str, str] = os.environ) -> int:
    """Decoding processes for this packer: the machine's cores shared by the packers started on it."""
    sharing = next((int(environ[name]) for name in PROCESSES_PER_MACHINE if environ.get(name, "").isdigit()), 1)
    return max(1, default_workers() // max(1, sharing))


class PackCLI(TrainerCLI):
    """``fit``'s command line (the project's default config, ``--config`` files, ``--data.*``) plus where to pack.

    Only the DataModule is built: the project's own class, so its ``split()`` holds out what ``fit`` would.
    """

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        where = "where the dataset goes: s3://bucket/prefix, gs://..., or a folder"
        parser.add_argument("--output", type=str, required=True, help=where)
        parser.add_argument(
            "--images_per_item",
            type=int | None,
            default=None,
            help="images stored together in one litdata item; default: about 128 KiB of pixels (16 at 48 px, 1 at 224)",
        )
        parser.add_argument("--workers", type=int | None, default=None, help="decoding processes; default: the cores")
        parser.add_argument(
            "--storage_options",
            type=dict[str, Any] | None,
            default=None,
            help="options for the store's client beyond the AWS_* variables (endpoint_url, aws_access_key_id, ...)",
        )

    @override
    def _parse_ckpt_path(self) -> None:
        # Nothing is resumed or written here; the data settings the config leaves null take what the network's
        # weights expect, as fit's would (the packed images are fit's images).
        self.run = None
        fill_expected_input(self.config)

    @override
    def _set_seed(self) -> None:
        # LightningCLI's protected step that seeds (and prints "Seed set to N"); packing draws nothing at random
        # from it (the split has its own seed), so a one-line answer stays one line. Checked by test_private_routes.
        pass

    @override
    def instantiate_classes(self) -> None:
        data = self.config.data
        kind = imported(data.class_path)
        if not issubclass(kind, ImageFolderDataModule):
            raise UsageError(
                f"pack.py packs your own images, but data.class_path is {data.class_path}; "
                "use a config whose data is an ImageFolderDataModule (configs/images.yaml)"
            )
        source = data.init_args.get("source") if data.get("init_args") is not None else None
        if source:
            raise UsageError(
                f"data.source is {source}: a store to stream from; pack.py packs data.image_dir into --output "
                "(leave the streaming preset and data.source out)"
            )
        try:
            self.datamodule = instantiate_class((), data.as_dict())
        except ValueError as error:
            line = f"{constructor_error(error)}; fix that value in the config or on the command line"
            raise UsageError(line) from None


def run(data: ImageFolderDataModule, options: Namespace) -> None:
    output = check_location(options.output, "--output")
    if options.images_per_item is not None and options.images_per_item < 1:
        raise UsageError(f"--images_per_item must be 1 or more, got {options.images_per_item}")
    try:
        import litdata  # noqa: F401  (the optional extra)
    except ImportError:
        raise UsageError('pack.py needs litdata; pip install -e ".[streaming]"') from None
    from ..data.streams.packing import pack_to_store

    if data.found is None:
        raise DataSettingError(f"data.image_dir {data.image_dir} does not exist; point it at your images")
    nodes, node = packing_node()
    workers = options.workers or workers_per_process()
    record = pack_to_store(
        data.found,
        data.settings,
        output,
        val_fraction=data.val_fraction,
        test_fraction=data.test_fraction,
        split_seed=data.split_seed,
        split=data.split,
        images_per_item=options.images_per_item,
        workers=workers,
        strict=data.on_bad_image == "error",
        storage_options=options.storage_options or {},
        nodes=nodes,
        node_rank=node,
    )
    counts = ", ".join(f"{split} {count:,}" for split, count in record["counts"].items())
    share = f" (process {node} of {nodes})" if nodes > 1 else ""
    where = "object storage" if is_remote(output) else "a folder"
    stored = sum(record["counts"].values())
    skipped = data.found.count() - stored if node == nodes - 1 else 0  # the record of the last process counts all
    listed = "listed in skipped-<split>-<process>.txt beside dataset.json"
    left_out = f"; {skipped:,} unreadable files left out ({listed})" if skipped > 0 else ""
    print(
        f"Packed {stored:,} images ({counts}) of {len(record['class_names'])} classes at "
        f"{record['image_size']} px, {record['images_per_item']} per item, into {output} ({where}){share}{left_out}"
    )
    if node == nodes - 1:
        print(
            "Train on it: python main.py fit --config configs/images.yaml --config configs/presets/streaming.yaml "
            f"--data.source {output}"
        )


def main(model_class: type[L.LightningModule], default_config: Path, argv: list[str] | None = None) -> None:
    """``python pack.py ...`` of the project whose LightningModule and default config are given."""
    silence_known_noise()
    try:
        cli = PackCLI(model_class, default_config, run=False, args=argv, parser_kwargs=parser_settings(default_config))
        run(cli.datamodule, cli.config)
    except Exception as error:
        exit_with(error)


def parser_settings(default_config: Path) -> dict[str, Any]:
    """The project's default config first, then ``PACK_*`` variables; this file's docstring as the description."""
    return {
        "default_config_files": [str(default_config)],
        "default_env": True,
        "env_prefix": "PACK",
        "description": sys.modules["__main__"].__doc__ or __doc__,
    }
