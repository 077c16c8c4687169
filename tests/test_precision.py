"""bf16 where the hardware has it: a bf16 run on a device without bf16 units is warned about, or refused."""

from __future__ import annotations

import warnings

import pytest

from posenc_lab import precision
from posenc_lab.errors import ConfigError
from posenc_lab.train import train
from tests.helpers_train import compose_config, tiny

AVX2 = {"fpu", "sse2", "avx", "avx2", "fma"}


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16 amx_tile\nbugs\t\t: spectre_v1\n")
    assert precision.cpu_flags(str(info)) == {"fpu", "avx2", "amx_bf16", "amx_tile"}
    assert precision.cpu_flags(str(tmp_path / "missing")) is None


@pytest.mark.parametrize(
    "flags, has_bf16", [(AVX2, False), (AVX2 | {"amx_bf16"}, True), (AVX2 | {"avx512_bf16"}, True), (None, True)]
)
def test_bf16_hardware_on_cpu(monkeypatch, flags, has_bf16):
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    reason = precision.bf16_hardware("cpu")
    assert (reason is None) == has_bf16  # None flags: cannot tell, so no warning
    if not has_bf16:
        assert "amx_bf16" in reason and "avx512_bf16" in reason and "emulated" in reason


def test_check_precision_policies():
    with pytest.warns(UserWarning, match=r"trainer.precision=bf16-mixed on cpu: this CPU has no bf16 instructions"):
        precision.check_precision("bf16-mixed", "cpu", "warn", flags=AVX2)
    with pytest.raises(ConfigError, match="bf16_check=off to run it anyway"):
        precision.check_precision("bf16-true", "cpu", "error", flags=AVX2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        precision.check_precision("bf16-mixed", "cpu", "off", flags=AVX2)
        precision.check_precision("32-true", "cpu", "error", flags=AVX2)
        precision.check_precision("bf16-mixed", "cpu", "error", flags=AVX2 | {"amx_bf16"})
    with pytest.raises(ConfigError, match="bf16_check must be one of warn, error, off, got 'loud'"):
        precision.check_precision("32-true", "cpu", "loud")


def test_train_refuses_bf16_without_hardware_before_writing(monkeypatch, tmp_path, cache):
    monkeypatch.setattr(precision, "cpu_flags", lambda: AVX2)
    run = tmp_path / "run"
    cfg = compose_config("train", tiny(run, cache, "trainer.precision=bf16-mixed", "bf16_check=error"))
    with pytest.raises(ConfigError, match="no bf16 instructions"):
        train(cfg)
    assert not (run / "checkpoints").exists() and not (run / "results.json").exists()


def test_bad_bf16_check_value_is_named(tmp_path, cache):
    cfg = compose_config("train", tiny(tmp_path / "run", cache, "bf16_check=sometimes"))
    with pytest.raises(ConfigError, match="bf16_check must be one of warn, error, off, got 'sometimes'"):
        train(cfg)
