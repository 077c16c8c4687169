"""What the benchmark times: a model preset of ``conf/model/`` (its one owner of sizes) at a segment length
and a batch, and each scheme with the options of ``conf/posenc/<name>.yaml``, as training takes them (so that
editing a yaml changes what is trained and what is benchmarked alike).

The segment length defaults to the preset's memory length (the Transformer-XL convention, L = M) and the
batch to ``TOKENS_PER_STEP // segment_len`` streams, so every preset is timed on the same tokens per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from .. import config_dir
from ..defaults import group_option, group_options
from ..model import ModelConfig
from ..positional import sized_options

CONF_MODEL = Path(config_dir()) / "model"
CONF_POSENC = Path(config_dir()) / "posenc"
TOKENS_PER_STEP = 2048
BYTE_VOCAB_SIZE = 256
# A preset with an adaptive softmax (txl_wt103_base) is sized with the vocabulary its cutoffs were made for:
# WikiText-103's 267,735 words (then the xl model has the published 151,107,538 parameters).
ADAPTIVE_VOCAB_SIZE = 267_735
PRECISIONS = ("fp32", "bf16-mixed")


def model_presets() -> tuple[str, ...]:
    """Names of the options of conf/model/, sorted (the base they inherit aside)."""
    return group_options("model")


def scheme_conf(scheme: str) -> dict:
    """The options of conf/posenc/``scheme``.yaml (without its name); a scheme without a file there (a plugin's,
    whose yaml sits on a Hydra search path the benchmark does not compose) runs with its keyword defaults."""
    path = CONF_POSENC / f"{scheme}.yaml"
    if not path.is_file():
        return {}
    options = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    options.pop("name", None)
    return options


@dataclass(frozen=True)
class BenchConfig:
    """A model preset (``ModelConfig`` fields but the scheme) plus the lengths and batch it is timed at."""

    name: str
    model: dict = field(hash=False)
    segment_len: int
    batch_size: int
    vocab_size: int = BYTE_VOCAB_SIZE

    @property
    def mem_len(self) -> int:
        return int(self.model.get("mem_len", 0))

    @classmethod
    def preset(
        cls,
        name: str,
        segment_len: int | None = None,
        batch_size: int | None = None,
        vocab_size: int | None = None,
        **model_overrides,
    ) -> BenchConfig:
        """conf/model/``name``.yaml with ``model_overrides`` (e.g. n_layer=2); lengths as in the module doc.
        vocab_size: None is bytes (256), or WikiText-103's 267,735 words for a preset with an adaptive softmax."""
        presets = model_presets()
        if name not in presets:
            raise ValueError(f"unknown model preset {name!r}; valid (conf/model/): {', '.join(presets)}")
        model = {**group_option("model", name), **model_overrides}
        L = int(segment_len or model.get("mem_len") or 128)
        if vocab_size is None:
            vocab_size = ADAPTIVE_VOCAB_SIZE if model.get("adaptive_cutoffs") else BYTE_VOCAB_SIZE
        return cls(name, model, L, int(batch_size or max(1, TOKENS_PER_STEP // L)), vocab_size)

    def model_config(
        self,
        scheme: str,
        memory: bool = True,
        segment_len: int | None = None,
        options: dict | None = None,
        **overrides,
    ) -> ModelConfig:
        """The ModelConfig of ``scheme`` at this size, with its conf/posenc options (``scheme_conf``) and ``options``
        over them, those left null sized to ``segment_len`` (default: this config's); memory off unless ``memory``."""
        mem_len = self.mem_len if memory else 0
        given = {**scheme_conf(scheme), **(options or {})}
        options = sized_options(scheme, given, segment_len or self.segment_len, mem_len)
        kw = {
            **self.model,
            "vocab_size": self.vocab_size,
            "mem_len": mem_len,
            "posenc": scheme,
            "posenc_kwargs": options,
            **overrides,
        }
        if not kw["mem_len"]:
            kw["same_length"] = False
        return ModelConfig(**kw)
