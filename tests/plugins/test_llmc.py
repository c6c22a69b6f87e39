import math

import pytest

from trainwarden.plugins.parsers.llmc import LlmcParser


@pytest.fixture
def parser():
    return LlmcParser({})


def test_train_gpt2cu_line(parser):
    record = parser.parse(
        "step   12/5000 | train loss 3.412345 | norm 1.2000 | lr 6.00e-04 | 250.12 ms"
        " | 31.2% bf16 MFU | 131072 tok/s"
    )
    assert (record.step, record.loss) == (12, 3.412345)
    assert record.dt == pytest.approx(0.25012)
    assert record.extras == {
        "total": 5000,
        "norm": 1.2,
        "lr": 0.0006,
        "mfu": pytest.approx(0.312),
        "tok_s": 131072.0,
    }


def test_zscore_variant_and_unknown_mfu(parser):
    record = parser.parse(
        "step    1/74 | loss 11.010923 (+nanz)| norm 15.3295 (+nanz)| lr 8.57e-06 | 3521.37 ms"
        " | -100.0% bf16 MFU | 148895 tok/s"
    )
    assert (record.step, record.loss, record.dt) == (1, 11.010923, pytest.approx(3.52137))
    assert "mfu" not in record.extras  # llm.c prints -100% when it does not know the GPU
    assert record.extras["norm"] == 15.3295


def test_cpu_reference_line(parser):
    record = parser.parse("step 0: train loss 5.356189 (took 1452.121000 ms)")
    assert (record.step, record.loss, record.dt) == (0, 5.356189, pytest.approx(1.452121))


@pytest.mark.parametrize("word", ["nan", "-nan", "inf", "-inf"])
def test_printf_non_finite(parser, word):
    record = parser.parse(f"step 3/10 | train loss {word} | norm nan | lr 1.00e-04 | 20.00 ms")
    assert record.step == 3 and not math.isfinite(record.loss)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "+-----------------------+----------------------------------------------------+",
        "| Parameter             | Value                                              |",
        "generating:",
        "allocated 474 MiB for model parameters",
        "num_parameters: 124475904 => bytes: 248951808",
        "step 12/5000 | train loss",
        "[CUDA ERROR] at file train_gpt2.cu:1234: out of memory",
    ],
)
def test_banners_and_other_lines(parser, line):
    assert parser.parse(line) is None
