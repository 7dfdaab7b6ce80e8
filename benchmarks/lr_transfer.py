"""Does the trainer's per-width learning rate keep the best rate in place as width grows?

Run: python benchmarks/lr_transfer.py [--tokens 150000] [--widths 64,256,512]

The trainer gives hidden matrices `lr * base_width / d_model` (µP's Adam rule, see
`trainer.param_groups`). This sweeps the peak rate for several widths twice: with that scaling,
and with one rate for every parameter (base_width = d_model, the standard parametrisation). A
rule that transfers puts the best rate of every width at about the same `lr`; without it the
best rate drifts down as width grows. Prints the held-out loss of every run and each width's
best rate, for both rules, measured in one run on the bundled corpus.
"""

from __future__ import annotations

import argparse

from archsearch.evaluators.data import load_dataset
from archsearch.evaluators.trainer import TrainSettings, train
from archsearch.space.knobs import config_from_knobs

LRS = (1e-3, 3e-3, 1e-2, 3e-2)
BASE_WIDTH = 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=150_000)
    parser.add_argument("--widths", default="64,256,512")
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the script works")
    args = parser.parse_args()
    lrs = LRS[:2] if args.smoke else LRS
    if args.smoke:
        args.tokens, args.widths = 2048, "64"
    widths = [int(w) for w in args.widths.split(",")]
    data = load_dataset(None)
    print(f"{args.tokens:,} tokens per run, batch 16 x 128, 2 layers, head_dim 32; lr at width {BASE_WIDTH}")
    header = "rule          width " + " ".join(f"{lr:>9.0e}" for lr in lrs) + "   best lr"
    print(header)
    for rule in ("per-width", "one rate"):
        for width in widths:
            cfg = config_from_knobs(d_model=width, n_layers=2, head_dim=32, vocab_size=256, seq_len=128)
            losses = []
            for lr in lrs:
                settings = TrainSettings(
                    tokens=args.tokens, batch_size=16, lr=lr, evals=1, eval_batches=8,
                    base_width=BASE_WIDTH if rule == "per-width" else width,
                )  # fmt: skip
                result = train(cfg, data, settings)
                losses.append(result.val_loss if result.val_loss is not None else float("inf"))
            best = lrs[losses.index(min(losses))]
            cells = " ".join(f"{loss:>9.4f}" for loss in losses)
            print(f"{rule:<13} {width:>5} {cells}   {best:.0e}")


if __name__ == "__main__":
    main()
