"""A scheme's options: their one owner (conf/posenc/<name>.yaml, the Python keyword defaults held equal to it) and
their types (the annotations of the keyword-only arguments), checked by the registry before a scheme is built."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from posenc_lab.positional import SCHEME_NAMES, Dims, build_scheme, scheme_options
from posenc_lab.positional.registry import option_problem, option_types
from tests.schemes import ROPE, SHAW, XL

ALL = SCHEME_NAMES
CONF = Path(__file__).resolve().parents[2] / "conf" / "posenc"
D, H = 16, 4


@pytest.mark.parametrize("name", ALL)
def test_keyword_defaults_equal_the_yaml_by_value(name):
    """The one owner of a scheme's defaults is conf/posenc/<name>.yaml (training and the benchmark read it); the
    keyword defaults of the Python API hold the same values, key for key (positional/ imports only torch, so it
    cannot read the yaml itself)."""
    conf = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    conf.pop("name")
    assert conf == scheme_options(name)


@pytest.mark.parametrize("name", ALL)
def test_every_option_declares_a_checked_type(name):
    """Each keyword option is annotated with a type the registry checks (bool, int, float, str, or null)."""
    assert set(option_types(name)) == set(scheme_options(name))


@pytest.mark.parametrize(
    "name, option", [(name, option) for name in ALL for option in scheme_options(name)], ids=lambda x: str(x)
)
def test_a_value_of_the_wrong_type_is_refused_naming_option_value_and_type(name, option):
    """Before the scheme is built: a bool is only true or false, an integer is no float and no bool."""
    wrong = 1.5 if str in option_types(name)[option] else "maybe"
    with pytest.raises(ValueError, match=rf"^{name}: posenc\.{option} must be .+, got {wrong!r}$"):
        build_scheme(name, Dims(1, D, H), **{option: wrong})


def test_option_types_bools_integers_and_numbers():
    assert option_problem(XL, "share_uv", 1) == "xl: posenc.share_uv must be true or false, got 1"
    assert option_problem(SHAW, "K", True) == "shaw: posenc.K must be an integer, got True"
    assert option_problem(SHAW, "K", 4.0) == "shaw: posenc.K must be an integer, got 4.0"
    assert option_problem(XL, "clamp_len", "8") == "xl: posenc.clamp_len must be an integer or null, got '8'"
    assert option_problem(ROPE, "factor", 4) is None and option_problem(XL, "clamp_len", None) is None


def test_option_types_lists_of_numbers():
    """RoPE's longrope factors: a list (or tuple) of numbers, each an integer or a float but never a bool."""
    assert option_problem(ROPE, "long_factor", [1, 2.5]) is None and option_problem(ROPE, "long_factor", (1.0,)) is None
    assert option_problem(ROPE, "long_factor", None) is None
    wrong = "rope: posenc.long_factor must be a list of numbers or null, got "
    assert option_problem(ROPE, "long_factor", [1.0, "x"]) == wrong + "[1.0, 'x']"
    assert option_problem(ROPE, "long_factor", [True]) == wrong + "[True]"
    assert option_problem(ROPE, "long_factor", 2.0) == wrong + "2.0"
