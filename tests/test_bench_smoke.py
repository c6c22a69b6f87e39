"""A smoke of the bench: `python -m bench --quick --only verify` exits 0 and writes its
report (RESULTS.md with the section and its target row, results.json with the raw figures).

The whole bench is run by its own command (`python -m bench`, docs/benchmarks.md), not by
the suite; no timing is asserted here (timing figures belong in bench/).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
def test_one_small_section_of_the_bench_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "verify", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    results = (out / "RESULTS.md").read_text()
    assert results.startswith("# trainwarden benchmarks")
    assert "Generated file, do not edit by hand" in results
    assert "python -m bench --quick --only verify" in results
    assert "## Targets\n" in results and "## 8. Checkpoint verification (andrea-bin)\n" in results
    assert "andrea-bin verified at >= 90 % of a raw read" in results
    assert "This comparison failed" not in results

    document = orjson.loads((out / "results.json").read_bytes())
    assert document["mode"] == "quick" and set(document["sections"]) == {"verify"}
    verify = document["sections"]["verify"]["raw"]
    assert set(verify["page cache"]["mb_per_s"]) == {
        "verify",
        "digest",
        "verify + digest",
        "raw read",
    }
    assert all(rate > 0 for rate in verify["page cache"]["mb_per_s"].values())


def test_an_unknown_section_is_refused_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--only", "nonesuch"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "unknown comparison(s) nonesuch" in done.stderr
