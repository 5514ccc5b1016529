"""Profile a Lightning Trainer with rankscope: a tiny MLP on random data, on the CPU.

::

    python examples/lightning_trainer.py runs/lightning                # one process
    python examples/lightning_trainer.py runs/lightning --devices 2    # DDP over gloo (ddp_spawn)
    rankscope report runs/lightning
    rankscope stragglers runs/lightning

Every rank times forward, backward and optimizer on every second step; rank 0 records
one trace window. Finishes in seconds. Needs `pip install "rankscope[lightning,cli]"`.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

import rankscope
from rankscope.integrations.lightning import RankscopeCallback

logger = logging.getLogger("lightning_trainer")


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def teardown(self, stage: str) -> None:
        # Lightning leaves a gloo process group open until interpreter exit, where a rank
        # that exits while its peer is still connected can abort inside gloo. Close it
        # together instead (nothing to do with rankscope; harmless without it).
        dist = torch.distributed
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="the run directory rankscope writes")
    parser.add_argument("--devices", type=int, default=1, help="processes (ranks); default 1")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps; default 12")
    parser.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    config = rankscope.ProfileConfig(
        output_dir=args.run_dir,
        timer=rankscope.TimerConfig(enable=True, every_n_steps=2),
        trace=rankscope.TraceConfig(
            enable=True, ranks="0", schedule=rankscope.Schedule(wait=4, warmup=1, active=2)
        ),
    )
    pl.seed_everything(0, verbose=False)
    batches = args.steps * args.accumulate * args.devices
    data = TensorDataset(torch.randn(batches * 16, 32), torch.randn(batches * 16, 1))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp_spawn" if args.devices > 1 else "auto",
        max_steps=args.steps,
        accumulate_grad_batches=args.accumulate,
        callbacks=[RankscopeCallback(config)],
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regression(), DataLoader(data, batch_size=16))
    logger.info(
        "rankscope wrote %s; next: rankscope report %s; rankscope stragglers %s",
        config.output_dir,
        config.output_dir,
        config.output_dir,
    )


if __name__ == "__main__":
    main()
