"""The built-in checkpoint formats (entry point group `trainwarden.formats`).

- `andrea_bin`: `andrea-bin`, the reference trainer's `step_NNNNNN.bin`
- `torch_pt`: `torch-pt`, one `torch.save` file per checkpoint, checked in a worker process
- `torch_probe`: that worker, a long-lived `python -I` that loads one file at a time with torch
- `hf_trainer`: `hf-trainer`, the Hugging Face Trainer's `checkpoint-N/` folders
- `llmc`: `llmc`, llm.c's model and state files, committed by the `DONE_` marker
"""
