"""What to tell a user whose trainer writes checkpoints under names the configured format
does not read: the `[checkpoints]` option that would match the name. Pure: names in,
one line out.

    ckpt.pt (no step in it)        fixed = "ckpt.pt" and step_key (a file saved in place)
    iter_600.pt                    options = { pattern = '^iter_(\\d+)\\.pt$' }
    checkpoint-600/                format = "hf-trainer"
    epoch=0-step=600.ckpt          format = "torch-pt", options = { preset = "lightning" }
    model_00000600.bin, DONE_...   format = "llmc"
"""

from __future__ import annotations

import re

from trainwarden.supervisor.config_toml import toml_value
from trainwarden.supervisor.contract import LIGHTNING_CHECKPOINT_PATTERN

HF_FOLDER = re.compile(r"^(?:tmp-)?checkpoint-\d+$")
LLMC_NAME = re.compile(r"^(?:DONE_\d{8,}|model_\d{8,}\.bin|state_\d{8,}_\d{5,}\.bin)$")
DIGITS = re.compile(r"\d+")
STEP_DIGITS = re.compile(r"(?:step|iter|it|global_step)[=_-]?(\d+)", re.IGNORECASE)
TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors")
LIGHTNING_SUFFIX = ".ckpt"
LIGHTNING_NAME = re.compile(LIGHTNING_CHECKPOINT_PATTERN)
NOT_IN_A_LITERAL = re.compile(r"['\x00-\x08\x0a-\x1f\x7f]")
"""What a TOML literal string ('...') cannot hold: its quote and control characters but tab."""


def _escape(text: str) -> str:
    """re.escape for a name, sparing what needs no escape (`-`, `=`), so the pattern a user
    pastes reads like the name."""
    return "".join(f"\\{c}" if c in ".^$*+?{}[]\\|()" else c for c in text)


def step_pattern(name: str) -> str | None:
    """A regular expression that matches `name` and names like it at other steps, with the
    step as its one group: the digits after "step"/"iter" if any, else the last digits;
    other digits (an epoch) may vary too. None when the name holds no digits."""
    runs = list(DIGITS.finditer(name))
    if not runs:
        return None
    labelled = STEP_DIGITS.search(name)
    step_at = labelled.start(1) if labelled else runs[-1].start()
    parts, end = ["^"], 0
    for run in runs:
        parts.append(_escape(name[end : run.start()]))
        parts.append(r"(\d+)" if run.start() == step_at else r"\d+")
        end = run.end()
    parts += [_escape(name[end:]), "$"]
    return "".join(parts)


def _toml_literal(text: str) -> str:
    """A TOML literal string ('...': backslashes kept as they are, so a pattern reads as the
    expression it is) when it can be one, else a basic string."""
    return toml_value(text) if NOT_IN_A_LITERAL.search(text) else f"'{text}'"


def unrecognised_hint(name: str, is_dir: bool, fmt: str) -> str:
    """One line: `name` (in the checkpoint directory) matches no name of format `fmt`, and
    the option that would match it."""
    shown = f"{name}/" if is_dir else name
    head = f"{shown} matches no checkpoint name of format {fmt}"
    if is_dir and HF_FOLDER.match(name):
        return f'{head}; a Hugging Face Trainer folder: set [checkpoints] format = "hf-trainer"'
    if LLMC_NAME.match(name):
        return f'{head}; an llm.c checkpoint: set [checkpoints] format = "llmc"'
    pattern = step_pattern(name)
    if is_dir or not name.endswith(TORCH_SUFFIXES):
        return f'{head}; see docs/formats.md, "Other checkpoint formats"'
    if pattern is None:
        prefix = "" if fmt == "torch-pt" else 'format = "torch-pt" and '
        return (
            f"{head}; a file saved in place, its step under a key such as iter_num: set "
            f'[checkpoints] {prefix}fixed = {toml_value(name)} and step_key = "iter_num"'
        )
    if LIGHTNING_NAME.match(name):
        return (
            f'{head}; a Lightning checkpoint: set [checkpoints] format = "torch-pt" and '
            'options = { preset = "lightning" }'
        )
    options = f"options = {{ pattern = {_toml_literal(pattern)} }}"
    if name.endswith(LIGHTNING_SUFFIX):
        return (
            f'{head}; a Lightning checkpoint: set [checkpoints] format = "torch-pt" and {options}'
        )
    prefix = "" if fmt == "torch-pt" else 'format = "torch-pt" and '
    return f"{head}; set [checkpoints] {prefix}{options}"
