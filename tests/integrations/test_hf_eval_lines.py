"""A real Hugging Face Trainer run with evaluation, read by the hf-trainer parser: its
eval dicts become EvalRecords at the step they were made, and count no step."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.support.runs import PYTHON, REPO
from trainwarden.plugins.api import EvalRecord, StepRecord
from trainwarden.plugins.parsers.hf_trainer import HfTrainerParser

pytest.importorskip("transformers")

STEPS = 12
EVAL_STEPS = 4

TRAIN_SCRIPT = f"STEPS = {STEPS}\nEVAL_STEPS = {EVAL_STEPS}\n" + textwrap.dedent(
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    SEQ = 32
    TEXT = b"Held-out text is never trained on; its loss says how the model generalises. " * 40


    class Bytes(torch.utils.data.Dataset):
        def __init__(self, first):
            self.first = first

        def __len__(self):
            return 16

        def __getitem__(self, i):
            start = (self.first + i) * SEQ
            ids = torch.tensor(list(TEXT[start : start + SEQ]), dtype=torch.long)
            return {"input_ids": ids, "labels": ids}


    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=SEQ,
    )
    args = TrainingArguments(
        output_dir="out", max_steps=STEPS, per_device_train_batch_size=4,
        per_device_eval_batch_size=8, learning_rate=3e-3, logging_steps=2,
        eval_strategy="steps", eval_steps=EVAL_STEPS, save_strategy="no", seed=0,
        use_cpu=True, report_to="none", disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=LlamaForCausalLM(config), args=args, train_dataset=Bytes(0), eval_dataset=Bytes(40)
    )
    trainer.train()
    """
)


def test_real_trainer_eval_dicts(tmp_path: Path):
    (tmp_path / "train.py").write_text(TRAIN_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINWARDEN_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(REPO))
    out = subprocess.run(
        [PYTHON, str(tmp_path / "train.py")], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=600, check=True,
    )  # fmt: skip
    parser = HfTrainerParser({"logging_steps": 2})
    records = [parser.parse(line) for line in out.stdout.split("\n")]

    assert [r.step for r in records if isinstance(r, StepRecord)] == list(range(2, STEPS + 1, 2))
    evaluations = [r for r in records if isinstance(r, EvalRecord)]
    assert [r.step for r in evaluations] == list(range(EVAL_STEPS, STEPS + 1, EVAL_STEPS))
    assert all(0 < r.loss < 6 for r in evaluations)
    assert "eval_runtime" in evaluations[0].extras
