"""Profile a Hugging Face Trainer run with rankscope: a tiny GPT-2 on random tokens, on CPU, in seconds.

    python examples/hf_trainer.py runs/hf
    torchrun --nproc-per-node 2 examples/hf_trainer.py runs/hf-ddp
    rankscope report runs/hf

Every rank times its steps (phases between_steps, forward_backward, optimizer) into
RUN_DIR/timings/, and rank 0 captures a trace of two steps into RUN_DIR/traces/. The
model is built from a config and the data made up here, so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import rankscope
from rankscope.integrations.hf import RankscopeCallback

logger = logging.getLogger("hf_trainer")


class RandomTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Random token sequences; the labels are the inputs (causal language modelling)."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("run_dir", type=Path, help="where rankscope writes its run directory")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps (default 8)")
    parser.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    # The rankscope part: a config and a callback.
    config = rankscope.ProfileConfig(
        output_dir=opts.run_dir,
        timer=rankscope.TimerConfig(enable=True, every_n_steps=1),  # every rank, every step
        trace=rankscope.TraceConfig(
            enable=True, ranks="0", schedule=rankscope.Schedule(wait=2, warmup=1, active=2)
        ),
    )
    callback = RankscopeCallback(config)

    # An ordinary Trainer script.
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=2,
            vocab_size=64,
            n_positions=16,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    scratch = tempfile.TemporaryDirectory()  # the Trainer's own output_dir; nothing is saved
    args = TrainingArguments(
        output_dir=scratch.name,
        use_cpu=True,
        max_steps=opts.steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=opts.grad_accum,
        logging_steps=max(1, opts.steps // 4),
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        ddp_find_unused_parameters=False,  # GPT-2 uses every parameter; saves DDP a graph walk
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=RandomTokens(n=256, seq=16, vocab=64),
        callbacks=[callback],
    )
    trainer.train()
    scratch.cleanup()

    if args.process_index == 0:
        summary = callback.profiler.last_summary() if callback.profiler else None
        if summary is not None:
            top = ", ".join(item["name"] for item in summary["items"][:3])
            logger.info("window %s, top ops: %s", summary["window"], top)
        logger.info(
            "timings and traces are in %s; next: rankscope report %s",
            config.output_dir,
            opts.run_dir,
        )


if __name__ == "__main__":
    main()
