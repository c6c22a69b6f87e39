"""The built-in log parsers (entry point group `trainwarden.parsers`).

- `step_line`: `step-line`, `step: 120, loss: 3.41, dt: 0.25`
- `jsonl`: `jsonl`, one JSON object per step
- `hf_trainer`: `hf-trainer`, the dicts the Hugging Face Trainer prints
- `nanogpt`: `nanogpt`, nanoGPT's `train.py` iteration lines
- `llmc`: `llmc`, llm.c's per-step lines
- `_common`: helpers the parsers share: value conversion, a fast StepRecord builder
"""
