"""Drop-in pieces that let the trainers people already use speak the trainer contract.

- `hf`: a callback for the Hugging Face Trainer;
- `lightning`: a callback for PyTorch Lightning;
- `loop`: signal flags, an atomic torch.save and the resume path for hand-written
  (nanoGPT-style) loops, torchrun included.

Each module imports its framework only when used; none of them is a dependency of the daemon.
Outside the daemon (TRAINWARDEN_RUN_DIR unset) they change nothing.
"""
