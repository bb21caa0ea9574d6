"""Turn a checkpoint into a verified, deployable ONNX model and its model card.

python export.py --ckpt_path runs/{{ cookiecutter.dataset }}/<hash>/checkpoints/last.ckpt [--output model.onnx]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from {{ cookiecutter.import_name }}.export.model_card import build_card, write_card
from {{ cookiecutter.import_name }}.export.onnx_export import ExportError, export_onnx, load_model, verify
from {{ cookiecutter.import_name }}.model_cost import model_cost


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt_path", type=Path, required=True, help="checkpoint written by main.py fit")
    parser.add_argument("--output", type=Path, help="the .onnx file to write (default: beside the checkpoint)")
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (default: the exporter's)")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="max |logit difference| vs PyTorch")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    output = args.output or args.ckpt_path.with_suffix(".onnx")
    try:
        model, checkpoint = load_model(args.ckpt_path)
        export_onnx(model, output, opset=args.opset)
        parity = verify(model, output, tolerance=args.tolerance)
        if not parity.ok:
            output.unlink()
            print(
                f"error: onnxruntime does not reproduce PyTorch: max |logit diff| {parity.max_abs_diff:.3e} "
                f"(tolerance {parity.tolerance:.0e}), argmax equal: {parity.argmax_equal}; {output} was removed",
                file=sys.stderr,
            )
            return 1
        cost = model_cost(model.network())
        card = build_card(model, checkpoint, args.ckpt_path, output, cost, parity)
        json_card, markdown_card = write_card(card, output)
    except ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {output} ({cost.describe()}); parity {parity.max_abs_diff:.2e} at batch sizes {parity.batch_sizes}")
    print(f"model card: {json_card} and {markdown_card}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
