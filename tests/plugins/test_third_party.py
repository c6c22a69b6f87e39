"""A plugin from another distribution, importing only trainwarden.plugins.api, is a full plugin."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import textwrap
from pathlib import Path

from tests.support import PYTHON

PLUGIN = '''\
"""A checkpoint format and a log parser as a third party would ship them."""

import re

from trainwarden.plugins.api import CheckpointInfo, CheckpointInvalid, ConfigError, StepRecord

NAME = re.compile(r"^acme-(\\d+)\\.ckpt$")


class AcmeFormat:
    name = "acme"

    def __init__(self, options):
        if options.get("magic", "ACME") != "ACME":
            raise ConfigError(f"acme: unknown magic {options['magic']!r}")

    def step_of(self, path):
        match = NAME.match(path.name)
        return int(match.group(1)) if match else None

    def is_in_flight(self, path):
        return path.name.endswith(".partial")

    def verify(self, path):
        data = path.read_bytes()
        if not data.startswith(b"ACME"):
            raise CheckpointInvalid(f"{path.name}: no ACME magic")
        return CheckpointInfo(step=self.step_of(path), path=path, bytes=len(data))

    def companions(self, path):
        return []


class AcmeParser:
    def __init__(self, options):
        pass

    def parse(self, line):
        parts = line.split()
        if len(parts) != 3 or parts[0] != "acme":
            return None
        return StepRecord(step=int(parts[1]), loss=float(parts[2]))
'''

DRIVER = """
import json, sys
from pathlib import Path
from trainwarden.supervisor import registry
from trainwarden.supervisor.errors import ConfigError
from trainwarden.supervisor.store.checkpoints import CheckpointStore

folder = Path(sys.argv[1])
store = CheckpointStore(folder, registry.checkpoint_format("acme", {}))
names, in_flight = store.scan()
verdicts = {name: store.verify(name) for name in names}
try:
    registry.checkpoint_format("acme", {"magic": "XYZ"})
    refused = None
except ConfigError as exc:
    refused = str(exc)
record = registry.log_parser("acme", {}).parse("acme 12 3.5")
print(json.dumps({
    "names": names,
    "in_flight": in_flight,
    "steps": {n: v.info.step if v.info else None for n, v in verdicts.items()},
    "reasons": {n: v.reason for n, v in verdicts.items()},
    "refused": refused,
    "record": [record.step, record.loss],
}))
"""


def install_plugin(site: Path) -> Path:
    """The plugin module and the metadata an installer would write, on a path of its own."""
    site.mkdir()
    module = site / "acme_trainwarden.py"
    module.write_text(PLUGIN)
    dist = site / "acme_trainwarden-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-trainwarden\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        textwrap.dedent(
            """\
            [trainwarden.formats]
            acme = acme_trainwarden:AcmeFormat

            [trainwarden.parsers]
            acme = acme_trainwarden:AcmeParser
            """
        )
    )
    return module


def test_a_plugin_that_imports_only_the_api_formats_parses_and_refuses(tmp_path: Path):
    module = install_plugin(tmp_path / "site")
    tree = ast.parse(module.read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {name for name in imported if name.startswith("trainwarden")} == {
        "trainwarden.plugins.api"
    }

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "acme-10.ckpt").write_bytes(b"ACME" + bytes(60))
    (folder / "acme-20.ckpt").write_bytes(b"JUNK" + bytes(60))
    (folder / "acme-30.ckpt.partial").write_bytes(b"ACME")
    path = os.pathsep.join(p for p in (str(tmp_path / "site"), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [PYTHON, "-c", DRIVER, str(folder)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["names"] == ["acme-10.ckpt", "acme-20.ckpt"]
    assert out["in_flight"] == ["acme-30.ckpt.partial"]
    assert out["steps"] == {"acme-10.ckpt": 10, "acme-20.ckpt": None}
    # The daemon's own CheckpointInvalid: the plugin's reason, not "verification failed".
    assert out["reasons"]["acme-20.ckpt"] == "acme-20.ckpt: no ACME magic"
    assert out["refused"] == "acme: unknown magic 'XYZ'"
    assert out["record"] == [12, 3.5]
