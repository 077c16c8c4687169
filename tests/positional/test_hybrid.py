"""Per-layer hybrids (posenc_lab/positional/hybrid.py): the composite scores as a model whose every layer is built
as its scheme alone, holds parameters only where a layer uses them, equals one long pass with memory (windows
included), takes every scheme or refuses it with its reason, and names its cell by its pattern."""

from __future__ import annotations

import copy

import pytest
import torch

from posenc_lab.checks import problems
from posenc_lab.model import MemoryTransformer, ModelConfig
from posenc_lab.positional import (
    SCHEME_NAMES,
    SCHEMES,
    AttentionInputs,
    Dims,
    PositionalScheme,
    build_scheme,
    schemes_of_kind,
)
from posenc_lab.positional.hybrid import Hybrid, layer_refusal, pattern_label, primitive
from tests.helpers_train import compose_config
from tests.models import make_model
from tests.schemes import ALIBI, FOX, NOPE, PATH, ROPE, SHAW, T5, XL

HYBRID = Hybrid.name
D, H, V, B = 16, 2, 23, 2
# every kind of per-layer state: ModuleList per layer (fox, xl's W_R), a [n_layer, ...] table (shaw), parameters
# shared by a scheme's layers (xl's u, v; t5's table), none (rope, nope), a score bias, a rotation, its own attend
LAYERS = [FOX, ROPE, SHAW, NOPE, XL, FOX, SHAW, XL, T5, T5]
OPTIONS = {SHAW: {"K": 3}, T5: {"n_buckets": 8, "max_distance": 20}}


def hybrid_model(layers=LAYERS, mem_len: int = 0, **posenc) -> MemoryTransformer:
    kwargs = {"layers": layers, "options": {k: v for k, v in OPTIONS.items() if k in layers}, **posenc}
    return make_model(HYBRID, n_layer=len(layers), mem_len=mem_len, randomize="all", posenc_kwargs=kwargs)


class LayerByLayer(PositionalScheme):
    """The naive reference: layer n is scheme ``layers[n]`` built for one layer, called at its layer 0."""

    def __init__(self, schemes: list[PositionalScheme]):
        super().__init__(schemes[0].dims)
        self.schemes = torch.nn.ModuleList(schemes)

    def attend(self, a: AttentionInputs):
        return self.schemes[a.layer].attend(a.but(layer=0))

    def attention_probs(self, a: AttentionInputs):
        return self.schemes[a.layer].attention_probs(a.but(layer=0))


def alone(part: PositionalScheme, rank: int, name: str) -> PositionalScheme:
    """Scheme ``name`` built for one layer, holding the parameters of layer ``rank`` of ``part`` (a scheme built for
    several): a ModuleList's entry ``rank``, row ``rank`` of a per-layer table, or the shared parameter itself."""
    ref = build_scheme(name, Dims(1, D, H), **OPTIONS.get(name, {}))
    source = dict(part.named_parameters())
    with torch.no_grad():
        for key, p in ref.named_parameters():
            path = key.split(".")
            if "0" in path:  # a ModuleList per layer
                path[path.index("0")] = str(rank)
                p.copy_(source[".".join(path)])
            elif source[key].shape == p.shape:  # shared by the scheme's layers
                p.copy_(source[key])
            else:  # [n_layer, ...]: this layer's row
                assert source[key].shape[0] == part.dims.n_layer and p.shape[0] == 1, key
                p.copy_(source[key][rank : rank + 1])
    return ref


def reference_of(model: MemoryTransformer) -> MemoryTransformer:
    ref = copy.deepcopy(model)
    scheme = model.scheme
    ref.scheme = LayerByLayer([alone(scheme.parts[name], rank, name) for name, rank in scheme.where])
    return ref


def test_the_composite_scores_as_every_layer_built_as_its_scheme_alone():
    """Two segments with memory, the logits, the attention and the gradients of the shared weights: equal to a model
    whose layer n is its scheme built for one layer with the parameters of that layer."""
    model = hybrid_model(mem_len=5).train()  # train: xl's and fox's parameters in the graph, no dropout here (0)
    ref = reference_of(model).train()
    x = torch.randint(V, (B, 12))
    mems_a = mems_b = None
    for t in range(2):
        seg, tgt = x[:, t * 6 : t * 6 + 5], x[:, t * 6 + 1 : t * 6 + 6]
        a = model(seg, tgt, mems=mems_a, offset=t * 5, return_attention=True)
        b = ref(seg, tgt, mems=mems_b, offset=t * 5, return_attention=True)
        torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
        for pa, pb in zip(a.attention, b.attention):
            torch.testing.assert_close(pa, pb, atol=1e-5, rtol=1e-5)
        mems_a, mems_b = a.mems, b.mems
    ga = torch.autograd.grad(a.loss, [model.blocks[0].q_proj.weight, model.embedding.weight])
    gb = torch.autograd.grad(b.loss, [ref.blocks[0].q_proj.weight, ref.embedding.weight])
    for u, w in zip(ga, gb):
        torch.testing.assert_close(u, w, atol=1e-5, rtol=1e-4)
    assert (a.logits - make_model(ROPE, n_layer=len(LAYERS), randomize="all")(x[:, 6:11]).logits).abs().max() > 1e-3


def test_parameters_exist_only_where_a_layer_uses_them():
    """Each scheme is built for its own layers: its parameters are those of a model of that many layers (a pattern
    that repeats: those of its layers at this depth)."""
    scheme = hybrid_model().scheme
    count = {name: LAYERS.count(name) for name in dict.fromkeys(LAYERS)}
    assert {n: p.dims.n_layer for n, p in scheme.parts.items()} == count
    built = [build_scheme(n, Dims(c, D, H), **OPTIONS.get(n, {})) for n, c in count.items()]
    alone_params = sum(p.numel() for scheme_alone in built for p in scheme_alone.parameters())
    assert sum(p.numel() for p in scheme.parameters()) == alone_params
    repeated = build_scheme(HYBRID, Dims(6, D, H), layers=[ROPE, ROPE, FOX])
    assert {n: p.dims.n_layer for n, p in repeated.parts.items()} == {ROPE: 4, FOX: 2}
    fox_alone = build_scheme(FOX, Dims(2, D, H))
    assert sum(p.numel() for p in repeated.parameters()) == sum(p.numel() for p in fox_alone.parameters()) > 0


def test_a_pattern_repeats_over_the_layers():
    scheme = build_scheme(HYBRID, Dims(8, D, H))  # the default: [rope, rope, rope, nope]
    assert [n for n, _ in scheme.where] == [ROPE, ROPE, ROPE, NOPE] * 2
    assert [r for _, r in scheme.where] == [0, 1, 2, 0, 3, 4, 5, 1]
    assert scheme.parts[ROPE].dims.n_layer == 6 and scheme.parts[NOPE].dims.n_layer == 2


def test_options_reach_only_their_scheme():
    scheme = build_scheme(HYBRID, Dims(4, D, H), layers=[ROPE, ALIBI], options={ROPE: {"base": 500.0}})
    assert scheme.parts[ROPE].base == 500.0 and not hasattr(scheme.parts[ALIBI], "base")
    sized = SCHEMES[HYBRID].sized_options({"layers": [ROPE, NOPE], "options": None}, segment_len=8, mem_len=4)
    assert sized["options"] == {ROPE: {"original_len": 12}}  # rope's own sizing, kept for the checkpoint


@pytest.mark.parametrize(
    "posenc",
    [
        {"layers": [ROPE, NOPE, FOX]},
        {"layers": [ROPE, ROPE, NOPE], "windows": {ROPE: 3}},
        {"layers": [XL, T5, PATH], "windows": {T5: 4}},
    ],
    ids=["rope-nope-fox", "windowed-rope", "xl-t5-path"],
)
@pytest.mark.parametrize("same_length", [False, True])
def test_memory_equals_one_long_pass(posenc, same_length):
    """With memory covering everything before, the last segment's logits equal those of one pass over the stream."""
    L, M, n_seg = 4, 8, 3
    model = hybrid_model(mem_len=M, **posenc)
    stream = torch.randint(V, (B, n_seg * L))
    mems = None
    for t in range(n_seg):
        out = model(stream[:, t * L : (t + 1) * L], mems=mems, offset=t * L, same_length=same_length)
        mems = out.mems
    window = model(stream, offset=0, mem_len=M, same_length=same_length).logits[:, -L:]
    torch.testing.assert_close(out.logits, window, atol=1e-5, rtol=1e-4)


def test_a_window_hides_the_keys_beyond_it_in_its_layers_only():
    """W = 2: a query of a windowed layer sees itself and the key before; the other layers see every key."""
    model = hybrid_model([ROPE, NOPE], windows={ROPE: 2})
    probs = model(torch.randint(V, (B, 6)), return_attention=True).attention
    seen = [(p[0, 0] > 0).sum(-1) for p in probs]  # keys each query sees, layer by layer
    assert seen[0].tolist() == [1, 2, 2, 2, 2, 2] and seen[1].tolist() == [1, 2, 3, 4, 5, 6]


def test_every_scheme_takes_a_layer_or_is_refused_with_its_reason():
    """The absolute schemes act on the one input embedding; a hybrid cannot nest. Every other scheme builds in a
    hybrid with nope and trains a step through it."""
    refused = {n for n in SCHEME_NAMES if layer_refusal(n)}
    assert refused == {*schemes_of_kind("absolute"), HYBRID}
    for name in sorted(refused):
        with pytest.raises(ValueError, match=rf"^hybrid: posenc.layers cannot take {name}: .+"):
            build_scheme(HYBRID, Dims(2, D, H), layers=[name, NOPE])
    for name in sorted(set(SCHEME_NAMES) - refused):
        kwargs = SCHEMES[HYBRID].sized_options({"layers": [name, NOPE]}, segment_len=5, mem_len=0)  # cope, fire
        model = make_model(HYBRID, n_layer=2, posenc_kwargs=kwargs, randomize=None).train()
        x = torch.randint(V, (B, 5))
        model(x, x, offset=0).loss.backward()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"layers": []}, r"posenc.layers must be a non-empty list of scheme names"),
        ({"layers": "rope"}, r"posenc.layers must be a list, got 'rope'"),
        ({"layers": [ROPE, "ropee"]}, r"posenc.layers names unknown scheme 'ropee'; a layer takes one of: .*rope"),
        ({"layers": [ROPE, NOPE], "options": {FOX: {}}}, r"posenc.options names fox, which no layer takes"),
        ({"layers": [ROPE, NOPE], "options": {ROPE: {"bse": 2.0}}}, r"posenc.options.rope: .*no option\(s\) \['bse'\]"),
        ({"layers": [ROPE, NOPE], "windows": {ROPE: 0}}, r"posenc.windows.rope must be an integer >= 1 .*got 0"),
        ({"layers": [ROPE, NOPE], "options": {ROPE: {"drop_at_step": 3}}}, r"set posenc.drop_at_step on the hybrid"),
    ],
)
def test_bad_options_are_one_line_naming_the_key(options, message):
    with pytest.raises(ValueError, match=message) as e:
        build_scheme(HYBRID, Dims(4, D, H), **options)
    assert "\n" not in str(e.value)


def test_a_pattern_longer_than_the_model_is_refused_by_the_validator_in_one_line():
    """Eight schemes on two layers would build the first two and name the cell by all eight: the config check refuses
    it (one line: the pattern, its length, the layers and what is valid) before anything is built; a pattern that
    repeats a shorter one that fits is that one."""
    eight = [ROPE, NOPE, ALIBI, T5, FOX, ROPE, NOPE, XL]
    overrides = [f"posenc={HYBRID}", "model=tiny", "model.n_layer=2"]
    cfg = compose_config("train", [*overrides, f"posenc.layers=[{','.join(eight)}]"])
    assert problems(cfg) == [
        f"posenc: hybrid: posenc.layers=[{', '.join(eight)}] is a pattern of 8 schemes for model.n_layer=2 layers: "
        f"the last 6 would take no layer; list at most 2 (one per layer, or a pattern that repeats over them) or set "
        f"model.n_layer >= 8"
    ]
    assert problems(compose_config("train", [*overrides, f"posenc.layers=[{ROPE},{NOPE},{ROPE},{NOPE}]"])) == []
    assert (
        problems(compose_config("train", [*overrides, "model.n_layer=8", f"posenc.layers=[{','.join(eight)}]"])) == []
    )


def test_the_cell_label_names_the_pattern():
    assert primitive([ROPE, NOPE, ROPE, NOPE]) == [ROPE, NOPE] and primitive([ROPE, ROPE, NOPE]) == [ROPE, ROPE, NOPE]
    assert pattern_label([ROPE, ROPE, ROPE, NOPE] * 2) == "rope3+nope1"
    assert pattern_label([NOPE, ROPE, ROPE, ROPE]) == "nope1+rope3"  # the order is the model's
    assert pattern_label([ROPE, ROPE, ROPE, NOPE], {ROPE: 32}) == "rope3w32+nope1"
    assert build_scheme(HYBRID, Dims(4, D, H), layers=[FOX, NOPE, FOX, NOPE]).label == "fox1+nope1"


def test_a_checkpoint_of_another_layer_list_is_refused(tmp_path):
    """Resume compares the model's settings: a hybrid saved with one pattern does not continue under another."""
    from posenc_lab.checkpoints import CheckpointError
    from posenc_lab.lit import LitLM
    from posenc_lab.resume import check_resumable

    def lit(layers):
        model = dict(vocab_size=V, n_layer=4, d_model=D, n_head=H, d_inner=32, posenc=HYBRID)
        return LitLM(model={**model, "posenc_kwargs": {"layers": layers}})

    saved = lit([ROPE, NOPE])
    path = tmp_path / "hybrid.ckpt"
    state = {"hyper_parameters": dict(saved.hparams), "state_dict": saved.state_dict(), "global_step": 3}
    torch.save({**state, "posenc_lab": {}}, path)
    assert check_resumable(path, lit([ROPE, NOPE]), datamodule=None) == 3
    with pytest.raises(CheckpointError, match=r"another model: posenc_kwargs: .*'layers': \['rope', 'nope'\]"):
        check_resumable(path, lit([ROPE, ROPE, ROPE, NOPE]), datamodule=None)


def test_the_model_sets_the_path_of_every_layer():
    model = MemoryTransformer(ModelConfig(n_layer=2, d_model=D, n_head=H, posenc=HYBRID, attention_impl="unfused",
                                          posenc_kwargs={"layers": [T5, FOX]}))  # fmt: skip
    assert {p.attention_impl for p in model.scheme.parts.values()} == {"unfused"}


def test_a_layer_that_cannot_compile_refuses_compile_for_the_hybrid(monkeypatch):
    from posenc_lab.checks import compile_problem

    monkeypatch.setattr(SCHEMES[FOX], "compile_refused", "its gates read the host")
    scheme = build_scheme(HYBRID, Dims(2, D, H), layers=[ROPE, FOX])
    assert (
        compile_problem(HYBRID, scheme)
        == "compile=true cannot serve posenc=hybrid: its gates read the host (set compile=false)"
    )
    assert compile_problem(HYBRID, build_scheme(HYBRID, Dims(2, D, H), layers=[ROPE, NOPE])) is None


def test_a_hybrid_trains_and_resumes_exactly(tmp_path, cache):
    """Steps 1..8 in one go against 1..4, a checkpoint, then 5..8 (tests/test_lit.py's check: dropout on, the memory
    and data position carried): a hybrid with a parameterised layer (fox) and a windowed one."""
    from tests.test_lit import resume_is_exact

    state = resume_is_exact(
        tmp_path, cache, f"posenc={HYBRID}", f"posenc.layers=[{FOX},{ROPE}]", "posenc.windows={rope:8}"
    )
    assert state["hyper_parameters"]["model"]["posenc_kwargs"]["layers"] == [FOX, ROPE]
    assert any(k.startswith("model.scheme.parts.fox.") for k in state["state_dict"])
