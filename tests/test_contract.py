"""The trainer contract module: andrea-bin naming, torch-free, and the only way to the trainer's rules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import PYTHON
from trainwarden.plugins.formats import andrea_bin
from trainwarden.plugins.formats.andrea_bin import AndreaBin
from trainwarden.supervisor import contract
from trainwarden.supervisor.errors import CheckpointInvalid

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return names


@pytest.mark.parametrize("step", [0, 7, 100, 999_999, 1_234_567])
def test_checkpoint_names_round_trip(step: int):
    name = contract.checkpoint_name(step)
    assert (
        name.startswith("step_") and name.endswith(".bin") and len(name) >= len("step_000000.bin")
    )
    assert contract.step_of_name(name) == step
    assert contract.is_in_flight_name(contract.in_flight_path(Path(name)).name)
    sidecar = contract.sidecar_path(Path("/run/checkpoints") / name)
    assert sidecar.name == f"step_{step:06d}.json"
    assert contract.is_in_flight_name(sidecar.name + contract.TMP_SUFFIX)


@pytest.mark.parametrize(
    "name",
    ["step_000100.bin.tmp", "step_000100.json", "step_100.bin", "step_000100.bin.bak", "ckpt.pt"],
)
def test_other_names_have_no_step(name: str):
    assert contract.step_of_name(name) is None


def test_only_checkpoint_and_sidecar_temporaries_are_in_flight():
    assert contract.is_in_flight_name("step_000100.bin.tmp")
    assert contract.is_in_flight_name("step_000100.json.tmp")
    assert not contract.is_in_flight_name("step_000100.bin")
    assert not contract.is_in_flight_name("notes.tmp")
    assert not contract.is_in_flight_name("step_1.bin.tmp")


def test_the_layout_is_header_then_three_float32_regions(tmp_path: Path):
    assert contract.ANDREA_BIN_HEADER.format == "<ii" and contract.ANDREA_BIN_HEADER.size == 8
    assert contract.BYTES_PER_PARAM == 12
    assert contract.expected_size(1000) == 8 + 12 * 1000
    # The format plugin verifies exactly what the contract lays out, nothing else.
    assert andrea_bin.HEADER is contract.ANDREA_BIN_HEADER
    path = tmp_path / contract.checkpoint_name(40)
    path.write_bytes(contract.ANDREA_BIN_HEADER.pack(40, 10) + bytes(contract.BYTES_PER_PARAM * 10))
    info = AndreaBin().verify(path)
    assert (info.step, info.n_params, info.bytes) == (40, 10, contract.expected_size(10))
    assert AndreaBin().companions(path) == [contract.sidecar_path(path)]
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(CheckpointInvalid, match=r"expected 8 \+ 12 x 10 = 128"):
        AndreaBin().verify(path)


def test_the_contract_imports_only_the_standard_library():
    for name in imported_modules(ROOT / "supervisor" / "contract.py"):
        assert name.split(".")[0] in sys.stdlib_module_names, name


def test_the_contract_and_the_protocol_load_without_torch():
    code = (
        "import sys\n"
        "import trainwarden.supervisor.contract, trainwarden.supervisor.protocol\n"
        "import trainwarden.plugins.api, trainwarden.plugins.formats.andrea_bin\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'textual')))\n"
    )
    result = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_nothing_but_the_trainer_imports_the_trainer():
    importers = []
    for folder in ("supervisor", "tui", "plugins"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name in imported_modules(path):
                if name == "trainwarden.trainer" or name.startswith("trainwarden.trainer."):
                    importers.append(f"{path.relative_to(ROOT)}: {name}")
    assert importers == []


def test_the_trainer_takes_its_names_from_the_contract():
    # Whatever the trainer spells for itself would drift from what the daemon reads.
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for literal in ('"TRAINWARDEN_', '"policy.json"', '".state.json"', '".samples.json"'):
            assert literal not in text, f"{path.name} spells {literal}"
        assert 'struct.Struct("<ii")' not in text and '"step_{' not in text
