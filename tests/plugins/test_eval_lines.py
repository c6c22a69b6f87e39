"""Held-out evaluation lines in the formats of nanoGPT, the Hugging Face Trainer and llm.c.

Each fixture is a log excerpt written from the program's own print statements (quoted
above it); the values are made up, the shapes are not. An evaluation is an EvalRecord,
never a StepRecord: a NaN there is a figure to report, not a training divergence.
"""

from __future__ import annotations

import math

import pytest

from trainwarden.plugins.api import EvalRecord, StepRecord
from trainwarden.plugins.parsers.hf_trainer import HfTrainerParser
from trainwarden.plugins.parsers.llmc import LlmcParser
from trainwarden.plugins.parsers.nanogpt import NanoGptParser


def parse_all(parser, log: str) -> list[StepRecord | EvalRecord | None]:
    # Split at newlines only, as the log follower does: a progress bar's \r stays in the line.
    return [parser.parse(line) for line in log.rstrip("\n").split("\n")]


def evals(records) -> list[tuple[int, float, dict]]:
    return [(r.step, r.loss, dict(r.extras)) for r in records if isinstance(r, EvalRecord)]


def steps(records) -> list[int]:
    return [r.step for r in records if isinstance(r, StepRecord)]


# -- nanoGPT --------------------------------------------------------------------------
# karpathy/nanoGPT train.py, in the training loop:
#   if iter_num % eval_interval == 0 and master_process:
#       losses = estimate_loss()
#       print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
#       ...
#           print(f"saving checkpoint to {out_dir}")
#   ...
#   print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%")
# The evaluation at iter_num comes before that iteration trains: it measures the weights
# after iter_num updates, which is the step it names.
NANOGPT_LOG = """\
tokens per iteration will be: 491,520
number of parameters: 123.59M
compiling the model... (takes a ~minute)
step 0: train loss 10.9882, val loss 10.9889
iter 0: loss 10.9853, time 31415.93ms, mfu -100.00%
iter 10: loss 8.2743, time 301.52ms, mfu 30.12%
step 250: train loss 3.4100, val loss 3.4500
saving checkpoint to out
iter 250: loss 3.3960, time 9871.11ms, mfu 29.80%
step 500: train loss nan, val loss nan
iter 500: loss nan, time 300.01ms, mfu 30.01%
"""


def test_nanogpt_evaluations_and_iterations():
    records = parse_all(NanoGptParser({}), NANOGPT_LOG)
    assert evals(records)[:2] == [
        (0, 10.9889, {"train_loss": 10.9882}),
        (250, 3.45, {"train_loss": 3.41}),
    ]
    nan_eval = evals(records)[2]
    assert nan_eval[0] == 500 and math.isnan(nan_eval[1]) and math.isnan(nan_eval[2]["train_loss"])
    assert steps(records) == [0, 10, 250, 500]
    assert [r for r in records[:3]] == [None, None, None]
    assert records[7] is None  # saving checkpoint to out


# -- the Hugging Face Trainer ---------------------------------------------------------
# transformers/trainer.py, Trainer.evaluate_loop: metrics[f"{metric_key_prefix}_loss"] =
# losses.mean().item(), then every key gets the prefix ("eval_runtime",
# "eval_samples_per_second", "eval_steps_per_second" from speed_metrics); Trainer.log adds
# logs["epoch"] = self.state.epoch and calls the callbacks' on_log, where
# ProgressCallback.on_log does (transformers 5.x):
#   elif isinstance(v, float):
#       shallow_logs[k] = f"{v:.4g}"
#   ...
#   self.training_bar.write(str(shallow_logs))
# and transformers 4.x wrote the floats as they were, with
#   shallow_logs["epoch"] = round(shallow_logs["epoch"], 2)
# The evaluation is logged after the training log of the same global step.
HF_LOG_V5 = """\
{'loss': '3.41', 'grad_norm': '1.2', 'learning_rate': '0.0006', 'epoch': '0.5'}
{'loss': '2.95', 'grad_norm': '1.1', 'learning_rate': '0.0005', 'epoch': '1'}
{'eval_loss': '2.876', 'eval_runtime': '0.5123', 'eval_samples_per_second': '195.2', \
'eval_steps_per_second': '24.4', 'epoch': '1'}
{'train_runtime': '12.5', 'train_samples_per_second': '160', 'train_loss': '3.18', 'epoch': '1'}
"""
HF_LOG_V4 = """\
{'loss': 3.41, 'grad_norm': 1.2, 'learning_rate': 0.0006, 'epoch': 0.5}
{'loss': 2.95, 'grad_norm': 1.1, 'learning_rate': 0.0005, 'epoch': 1.0}
 50%|#####     | 1/2 [00:00<00:00,  9.52it/s]\r{'eval_loss': 2.8761, 'eval_runtime': 0.5123, \
'eval_samples_per_second': 195.2, 'eval_steps_per_second': 24.4, 'epoch': 1.0}
{'train_runtime': 12.5, 'train_samples_per_second': 160.0, 'train_loss': 3.18, 'epoch': 1.0}
"""


@pytest.mark.parametrize(
    ("log", "loss", "runtime"),
    [(HF_LOG_V5, 2.876, "0.5123"), (HF_LOG_V4, 2.8761, 0.5123)],
    ids=["transformers-5", "transformers-4"],
)
def test_hf_eval_dict_at_the_last_counted_step(log, loss, runtime):
    records = parse_all(HfTrainerParser({"logging_steps": 20}), log)
    assert steps(records) == [20, 40]
    [(step, value, extras)] = evals(records)
    assert (step, value) == (40, loss)
    assert extras["eval_runtime"] == runtime and "eval_loss" not in extras
    assert records[3] is None  # the end-of-training summary


def test_hf_eval_counts_no_step_and_follows_resume():
    parser = HfTrainerParser({"logging_steps": 10})
    parser.resume_at(500)
    first = parser.parse("{'eval_loss': 2.5, 'eval_runtime': 0.4, 'epoch': 3.0}")
    assert isinstance(first, EvalRecord) and first.step == 500
    assert parser.parse("{'loss': 2.4, 'epoch': 3.1}").step == 510  # the eval did not count


def test_hf_eval_with_the_callbacks_step():
    # trainwarden.integrations.hf adds the Trainer's global_step to every logged dict.
    record = HfTrainerParser({}).parse(
        "{'eval_loss': 2.5, 'eval_runtime': 0.4, 'epoch': 3.0, 'step': 1200}"
    )
    assert isinstance(record, EvalRecord) and (record.step, record.loss) == (1200, 2.5)
    assert "step" not in record.extras


@pytest.mark.parametrize("value", ["nan", "'nan'", "inf"])
def test_hf_non_finite_eval_loss_is_an_eval(value):
    record = HfTrainerParser({}).parse(f"{{'eval_loss': {value}, 'epoch': 1.0}}")
    assert isinstance(record, EvalRecord) and not math.isfinite(record.loss)


def test_hf_eval_dict_without_a_loss_is_nothing():
    # compute_metrics only, no labels for a loss: nothing to plot as a validation loss.
    assert HfTrainerParser({}).parse("{'eval_accuracy': 0.81, 'eval_runtime': 0.4}") is None


# -- llm.c ----------------------------------------------------------------------------
# karpathy/llm.c train_gpt2.cu, the training loop (step counts updates done so far):
#   if (step % val_loss_every == 0 || last_step) {
#       ...
#       printf0("val loss %f\n", val_loss);
#   ...
#   printf0("HellaSwag: %d/%d = %f\n", (int)eval_acc_norm, eval_loader.num_examples, ...);
#   ...
#   printf0("step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms
#            | %.1f%% bf16 MFU | %.0f tok/s\n", step + 1, train_num_batches, ...);
# so "val loss" follows the step line of the update it measures (1-based), and opens the
# run before any step line. train_gpt2.c (the CPU reference) prints the same "val loss %f"
# and "step %d: train loss %f (took %f ms)" with step 0-based: there too the evaluation
# takes the step of the line before it.
LLMC_LOG = """\
val loss 11.009556
step    1/74 | loss 11.010923 (+nanz)| norm 15.3295 (+nanz)| lr 8.57e-06 | 3521.37 ms \
| -100.0% bf16 MFU | 148895 tok/s
step    2/74 | loss 9.985467 (+nanz)| norm 8.9021 (+nanz)| lr 1.71e-05 | 351.20 ms \
| 38.1% bf16 MFU | 149002 tok/s
val loss 9.512345
HellaSwag: 2544/10042 = 0.253336
generating:
---
step   74/74 | loss 3.287771 (-0.51z)| norm 0.4012 (-0.22z)| lr 0.00e+00 | 350.02 ms \
| 38.2% bf16 MFU | 149310 tok/s
val loss -nan
total average iteration time: 350.512000 ms
"""
LLMC_CPU_LOG = """\
val loss 5.325522
step 0: train loss 5.356189 (took 1452.121000 ms)
step 1: train loss 4.300641 (took 1287.368000 ms)
val loss 4.167834
"""


def test_llmc_val_loss_takes_the_last_step():
    records = parse_all(LlmcParser({}), LLMC_LOG)
    found = evals(records)
    assert found[:2] == [(0, 11.009556, {}), (2, 9.512345, {})]
    assert found[2][0] == 74 and math.isnan(found[2][1])
    assert steps(records) == [1, 2, 74]
    assert records[4:7] == [None, None, None]
    assert records[-1] is None


def test_llmc_cpu_reference():
    records = parse_all(LlmcParser({}), LLMC_CPU_LOG)
    assert evals(records) == [(0, 5.325522, {}), (1, 4.167834, {})]
    assert steps(records) == [0, 1]


@pytest.mark.parametrize(
    "line", ["val loss", "val loss abc", "best val loss 3.2", "val loss 3.2 ms"]
)
def test_llmc_lines_that_are_not_val_losses(line):
    assert LlmcParser({}).parse(line) is None
