"""`python -m bench --quick` keeps working: it exits 0 and writes a complete RESULTS.md.

No timing is asserted here (timing figures belong in bench/, not in the test suite).
Set TRAINWARDEN_SKIP_BENCH=1 to skip it (it takes a minute or two and needs network
access once, to install supervisord into a throwaway environment).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parent.parent
HEADINGS = [
    "## Targets",
    "## 1. Crash -> trainer restarted",
    "## 2. Bad loss written -> trainer killed",
    "## 3. Supervision overhead",
    "## 4. History scale",
    "## 5. Checkpoint write",
    "## 6. Parsers and history internals (bench_parse.py)",
    "## 7. Log following at 10, 100 and 10,000 lines/s",
    "## 8. Checkpoint verification (andrea-bin)",
    "## 9. Checkpoint verification (torch-pt), per checkpoint",
    "## 10. Long runs",
    "## 11. Control-plane load: NaN -> kill and status under 200 misbehaving clients",
    "## 12. Loss spike -> trainer killed",
]

pytestmark = pytest.mark.skipif(
    os.environ.get("TRAINWARDEN_SKIP_BENCH") == "1", reason="TRAINWARDEN_SKIP_BENCH=1"
)


@pytest.mark.timeout(300)
def test_quick_bench_writes_every_section_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    results = (out / "RESULTS.md").read_text()
    assert results.startswith("# trainwarden benchmarks")
    assert "Generated file, do not edit by hand" in results
    assert "python -m bench --quick" in results
    for heading in HEADINGS:
        assert heading + "\n" in results, f"missing section {heading!r}"
    assert "This comparison failed" not in results

    plots = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", results)
    assert len(set(plots)) >= 6, plots
    for plot in plots:
        png = out / plot
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{plot} is not a PNG"

    document = orjson.loads((out / "results.json").read_bytes())
    assert document["mode"] == "quick"
    assert set(document["sections"]) == {
        "restart", "divergence", "overhead", "history", "checkpoint", "parse", "follow", "verify",
        "torch-verify", "long-runs", "control-load", "spikes", "stall",
    }  # fmt: skip
    stall = document["sections"]["stall"]["raw"]
    assert {size["preset"] for size in stall["sizes"]} >= {"tiny", "tiny-scaled-115mb"}
    assert all(run["saves"] > 0 and run["returncode"] == 0 for run in stall["trainer"].values())
    # Each latency comparison measured trainwarden itself, not only its peers.
    assert document["sections"]["restart"]["raw"]["summary"]["trainwarden"]["n"] > 0
    assert document["sections"]["divergence"]["raw"]["summary"]["trainwarden"]["n"] > 0
    assert document["sections"]["control-load"]["raw"]["nan"]["n"] > 0
    # The follow section matched lines the daemon saw at every rate.
    follow = document["sections"]["follow"]["raw"]["figures"]
    assert set(follow) == {"10", "100", "10000"}, follow.keys()
    assert all(f["latency"]["n"] > 0 for f in follow.values())
    # Section 8 timed the digest beside the check; section 9 timed both torch-pt ways.
    verify = document["sections"]["verify"]["raw"]
    assert set(verify["page cache"]["mb_per_s"]) == {
        "verify",
        "digest",
        "verify + digest",
        "raw read",
    }
    torch_verify = document["sections"]["torch-verify"]["raw"]
    assert (
        torch_verify["worker, warm (now)"]
        and torch_verify["fresh interpreter per checkpoint (before)"]
    )
