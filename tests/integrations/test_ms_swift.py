"""rankscope inside ms-swift (integrations/ms_swift.py): `--external_plugins` with
rankscope's plugin file and `--callbacks rankscope`, on ms-swift's real `sft_main`.

ms-swift is heavy (2 GB with its dependencies) and pins transformers below the version
the rest of the tests run with, so it lives in its own environment: `make
test-frameworks` builds it and runs these tests there. Where ms-swift is not installed
the tests that run it skip by name; the config mapping is tested everywhere.

The model is a 2-layer Qwen2 built from a config, with a byte-level BPE tokenizer
trained here on two sentences (no download); the data set is a local JSONL file.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from rankscope._errors import ConfigError
from rankscope.integrations import ms_swift
from rankscope.testing._gloo import GlooRanks

STEPS, SLOW_RANK, SLOW_FROM, SLEEP_S = 60, 1, 20, 0.02


class _Args:
    """What config_from_args reads of ms-swift's TrainingArguments."""

    def __init__(self, output_dir: str | None) -> None:
        self.output_dir = output_dir


def test_the_run_directory_is_under_ms_swifts_output_dir_and_the_timer_is_on(
    tmp_path: Path,
) -> None:
    config = ms_swift.config_from_args(_Args(str(tmp_path / "v0-1")), environ={})
    assert config.output_dir == str(tmp_path / "v0-1" / "rankscope")
    assert config.timer.enable and not config.trace.enable
    # The RANKSCOPE_* variables win when the Profiler starts; a bad one fails here.
    with pytest.raises(ConfigError, match="RANKSCOPE_TIMER_EVERY"):
        ms_swift.config_from_args(_Args(None), environ={"RANKSCOPE_TIMER_EVERY": "0"})


def test_the_plugin_file_is_a_file_that_registers_by_import() -> None:
    plugin = Path(ms_swift.PLUGIN)
    assert plugin.is_file() and plugin.suffix == ".py"
    assert "register()" in plugin.read_text()


def _tiny_model(root: Path) -> None:
    """A 2-layer Qwen2 and its tokenizer, built here, and 600 chat rows."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    corpus = ["user assistant system what is one plus one two", "hello world the quick fox"]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=alphabet
    )
    tok.train_from_iterator(corpus * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fast.save_pretrained(root)
    config = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(root)
    rows = [
        {
            "messages": [
                {"role": "user", "content": "what is one plus one"},
                {"role": "assistant", "content": "two " * (1 + i % 5)},
            ]
        }
        for i in range(600)
    ]
    (root / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows))


def _swift_job(rank: int, world: int, out: str, model: str, slow: bool) -> None:
    """ms-swift's sft on `world` ranks (it starts the process group from torchrun's
    variables); rank SLOW_RANK's data collator 20 ms slower from step SLOW_FROM."""
    from swift import sft_main
    from swift.template.base import Template
    from transformers.trainer_callback import CallbackHandler

    collate, step_end = Template.data_collator, CallbackHandler.on_step_end
    done = {"steps": 0}  # optimizer steps ended, as the Trainer's callbacks hear them

    slept = {"s": 0.0}

    def slow_collate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if slow and rank == SLOW_RANK and done["steps"] >= SLOW_FROM:
            began = time.perf_counter()
            time.sleep(SLEEP_S)
            slept["s"] += time.perf_counter() - began
        return collate(self, *args, **kwargs)

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        done["steps"] += 1
        return step_end(self, *args, **kwargs)

    Template.data_collator = slow_collate  # type: ignore[method-assign]
    CallbackHandler.on_step_end = counted  # type: ignore[method-assign]
    sft_main(
        [
            *("--model", model, "--model_type", "qwen2", "--template", "qwen"),
            *("--check_model", "false", "--dataset", str(Path(model) / "data.jsonl")),
            *("--tuner_type", "full", "--max_steps", str(STEPS), "--max_length", "64"),
            *("--per_device_train_batch_size", "4", "--output_dir", out),
            *("--report_to", "none", "--save_strategy", "no", "--logging_steps", "1000"),
            *("--dataloader_num_workers", "0", "--torch_dtype", "float32", "--use_cpu", "true"),
            *("--split_dataset_ratio", "0", "--disable_tqdm", "true", "--add_version", "false"),
            # The one line that turns rankscope on: its plugin file, and its name.
            *("--external_plugins", ms_swift.PLUGIN, "--callbacks", ms_swift.NAME),
        ]
    )
    # The truth: the time the slow rank slept a step (its collator runs more than once
    # a step), every other rank waiting for it.
    per_step_ms = 1000 * slept["s"] / (STEPS - SLOW_FROM)
    (Path(out) / f"truth-{rank}.json").write_text(json.dumps(per_step_ms))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("swift", reason="ms-swift is not installed (make test-frameworks)")
    root = tmp_path_factory.mktemp("qwen2-tiny")
    _tiny_model(root)
    return root


def _run(tmp_path_factory: pytest.TempPathFactory, tiny: Path, slow: bool) -> Path:
    out = tmp_path_factory.mktemp("swift-out")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RANKSCOPE_TIMER_EVERY": "1"}
    GlooRanks(tmp_path_factory.mktemp("gloo")).run(
        _swift_job, 3, str(out), str(tiny), slow, init=False, env=env
    )
    return out / "rankscope"


def _stragglers(run: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    from rankscope.cli import main

    capsys.readouterr()
    assert main(["stragglers", str(run), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_ms_swift_sft_with_the_callback_names_the_rank_slow_in_its_collator(
    tmp_path_factory: pytest.TempPathFactory, tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path_factory, tiny, True)
    report = _stragglers(run, capsys)
    slow = [(f["rank"], f["phase"]) for f in report["findings"] if f["role"] == "slow"]
    waits = {f["rank"] for f in report["findings"] if f["role"] == "waits"}
    assert slow == [(SLOW_RANK, "fetch")], report["findings"]
    assert waits == {0, 2}, report["findings"]
    (finding,) = [f for f in report["findings"] if f["role"] == "slow"]
    assert SLOW_FROM <= finding["since_step"] <= SLOW_FROM + 2
    truth = json.loads((run.parent / f"truth-{SLOW_RANK}.json").read_text())
    assert 0.7 <= finding["cost"]["step_ms_saved"] / truth <= 1.4, (finding["cost"], truth)


@pytest.mark.slow
def test_the_same_sft_clean_gets_no_finding(
    tmp_path_factory: pytest.TempPathFactory, tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path_factory, tiny, False)
    report = _stragglers(run, capsys)
    assert report["findings"] == [] and report.get("imbalance", []) == [], report["findings"]
    from rankscope.cli import main

    query = "select count(distinct step) as n, count(distinct rank) as ranks from timings"
    assert main(["sql", str(run), query, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": STEPS, "ranks": 3}]
