"""RESULTS.md and results.json from the comparisons' sections."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson

from bench.common import Section


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |"]
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _met(value: bool | None) -> str:
    return {True: "met", False: "**missed**", None: "not measured"}[value]


def markdown(sections: list[Section], meta: dict[str, Any]) -> str:
    m = meta["machine"]
    gpu = "an NVIDIA GPU present" if m.get("nvidia_gpu") else "no GPU"
    versions = ", ".join(f"{k}: {v}" for k, v in meta["peers"].items())
    out = [
        "# trainwarden benchmarks",
        "",
        "> Generated file, do not edit by hand: rerun the command below to update it.",
        f"> Command: `{meta['command']}` ({meta['mode']} mode), run on {meta['date']}, "
        f"took {meta['seconds']:.0f} s.",
        "",
        f"Machine: {m['cores']} CPU cores ({m['cpu']}), {m['memory_gb']} GB RAM, {gpu}, "
        f"Linux {m['kernel']}, Python {m['python']}, torch {m.get('torch', '?')}; load "
        f"average at start {m['load_average_at_start']}. Peers: {versions}.",
        "",
        "All contenders run in the same session, on the same machine, with the same child "
        "program; where wall-clock latency is compared they take turns, round after round, "
        "so a busy moment on the machine hits all of them alike. On a small shared machine "
        "the absolute times move from run to run; the ratios between contenders are the "
        "result. Percentiles are nearest-rank: with fewer than 100 samples p99 is the "
        "slowest one.",
        "",
        "## Targets",
        "",
    ]
    rows = []
    for section in sections:
        for t in section.targets:
            rows.append([t.goal, t.measured, _met(t.met), t.why])
    out += [table(["target", "measured", "result", "why / note"], rows), ""]
    for section in sections:
        out += [f"## {section.title}", "", section.intro, ""]
        if section.header:
            out += [table(section.header, section.rows), ""]
        if section.extra_markdown:
            out += [section.extra_markdown.rstrip(), ""]
        for plot in section.plots:
            out += [f"![{section.title}]({plot})", ""]
        out += [f"- {note}" for note in section.notes]
        out += [f"- This comparison took {section.seconds:.0f} s.", ""]
    return "\n".join(out).rstrip() + "\n"


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def write(out: Path, sections: list[Section], meta: dict[str, Any]) -> None:
    (out / "RESULTS.md").write_text(markdown(sections, meta))
    document = {
        **meta,
        "sections": {
            s.key: {
                "title": s.title,
                "seconds": s.seconds,
                "header": s.header,
                "rows": s.rows,
                "targets": [vars(t) for t in s.targets],
                "notes": s.notes,
                "plots": s.plots,
                "raw": s.raw,
            }
            for s in sections
        },
    }
    (out / "results.json").write_bytes(
        orjson.dumps(_json_safe(document), option=orjson.OPT_INDENT_2) + b"\n"
    )
