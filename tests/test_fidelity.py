"""The published Transformer-XL: each model option against naive math, the adaptive softmax against a
full softmax, the published parameter counts, and the presets that train and evaluate it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from posenc_lab.adaptive_softmax import AdaptiveSoftmax
from posenc_lab.build import model_config
from posenc_lab.model import MemoryTransformer, ModelConfig
from posenc_lab.positional import SCHEME_NAMES, sinusoid_table, sized_options
from posenc_lab.positional.base import PositionDropout
from tests.helpers_train import compose_config
from tests.schemes import HYBRID, HYBRID_OF_TWO

V, B = 29, 2
# The published model's options on a test-sized model; the dropout sites that existed before are off, so
# that the naive reference sees only the new sites (through recorded masks).
PUBLISHED = dict(
    ff_activation="relu",
    output_bias=True,
    pre_norm=False,
    ff_inner_dropout=0.5,
    pos_dropout=0.5,
    final_dropout=0.5,
    dropout=0.0,
    attn_dropout=0.0,
    same_length_keys="mem_len",
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def build(posenc: str = "xl", randomize: bool = True, **cfg) -> MemoryTransformer:
    cfg = {
        "vocab_size": V,
        "n_layer": 2,
        "d_model": 16,
        "n_head": 2,
        "d_inner": 24,
        "mem_len": 4,
        "posenc": posenc,
        **cfg,
    }
    given = cfg.get("posenc_kwargs", HYBRID_OF_TWO if posenc == HYBRID else {})
    cfg["posenc_kwargs"] = sized_options(posenc, given, 16, cfg["mem_len"])  # learned's table
    model = MemoryTransformer(ModelConfig(**cfg))
    if randomize:  # u, v, biases and LayerNorms start at 0 / 1: make every term count
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "embedding" not in name:
                    p.add_(0.3 * torch.randn_like(p))
    return model


class RecordedDropout:
    """Forward hooks that replace every dropout of the given modules by a recorded random mask."""

    def __init__(self, modules: dict[str, torch.nn.Module]):
        self.masks: dict[str, list[torch.Tensor]] = {name: [] for name in modules}
        self.handles = [m.register_forward_hook(self._hook(name)) for name, m in modules.items()]

    def _hook(self, name):
        def hook(module, inputs, output):
            x = inputs[0]
            mask = (torch.rand_like(x) >= module.p).to(x.dtype) / (1 - module.p)
            self.masks[name].append(mask)
            return x * mask

        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def published_mask(L: int, M: int, mem_len: int, same_length: bool) -> torch.Tensor:
    """[L, M + L] True = hidden, as the published code builds it: causal, and with same_length also every key
    mem_len or more before the query (klen = M + L; hidden below the diagonal -(L - (klen - mem_len)))."""
    klen = M + L
    ones = torch.ones(L, klen)
    hidden = torch.triu(ones, diagonal=1 + M).bool()
    if same_length:
        mask_len = klen - mem_len
        shift = L - mask_len if mask_len > 0 else L
        hidden |= torch.tril(ones, diagonal=-shift).bool()
    return hidden


def naive_published(model: MemoryTransformer, x: torch.Tensor, mems: list[torch.Tensor], masks: dict) -> dict:
    """The published Transformer-XL forward written out: post-LN blocks, per-pair R_{i-j} (no relative shift),
    the recorded dropout masks at the new sites. Returns log-probs [B, L, V] and the new memory."""
    cfg, scheme = model.cfg, model.scheme
    D, H = cfg.d_model, cfg.n_head
    dh = D // H
    L, M = x.shape[1], (mems[0].shape[1] if mems else 0)
    N = M + L
    act = F.relu if cfg.ff_activation == "relu" else F.gelu
    h = model.embedding.weight[x] * math.sqrt(D)
    d = (M + torch.arange(L))[:, None] - torch.arange(N)[None, :]  # [L, N] distance i - j, key index j
    # R: one row per key index (distance N-1 .. 0) and its dropout mask, shared by every layer
    rows = torch.arange(N - 1, -1, -1)
    if scheme.clamp_len is not None:
        rows = rows.clamp(max=scheme.clamp_len)
    R = sinusoid_table(rows, D)
    if masks.get("pos"):
        R = R * masks["pos"][0][:N]
    R_ij = R[(N - 1 - d).clamp(0, N - 1)]  # [L, N, D]: R_{i-j} of each pair
    hidden = published_mask(L, M, model.mem_len, cfg.same_length)
    new_mems = []
    for layer, blk in enumerate(model.blocks):
        ctx = torch.cat([mems[layer], h], 1) if mems else h
        new_mems.append(ctx[:, -model.mem_len :])
        q = (h @ blk.q_proj.weight.T).view(B, L, H, dh)
        kv = ctx @ blk.kv_proj.weight.T
        k, v = kv[..., :D].reshape(B, N, H, dh), kv[..., D:].reshape(B, N, H, dh)
        r = (R_ij @ scheme.w_kr[layer].weight.T).view(L, N, H, dh)
        u, vb = scheme.u, scheme.v
        scores = torch.einsum("bihd,bjhd->bhij", q + u, k) + torch.einsum("bihd,ijhd->bhij", q + vb, r)
        scores = scores / math.sqrt(dh)
        probs = scores.masked_fill(hidden, float("-inf")).softmax(-1)
        attn = torch.einsum("bhij,bjhd->bihd", probs, v).reshape(B, L, D) @ blk.out_proj.weight.T
        h = F.layer_norm(h + attn, (D,), blk.ln_attn.weight, blk.ln_attn.bias)
        inner = act(h @ blk.ff[0].weight.T + blk.ff[0].bias) * masks["ff_inner"][layer]
        ff = inner @ blk.ff[-1].weight.T + blk.ff[-1].bias
        h = F.layer_norm(h + ff, (D,), blk.ln_ff.weight, blk.ln_ff.bias)
    h = h * masks["final"][0]
    E, b = model.embedding.weight, model.head.bias
    if cfg.adaptive_cutoffs is None:
        return {"log_probs": torch.log_softmax(h @ E.T + b, -1), "mems": new_mems}
    # adaptive softmax in probability space: p(w) = p(cluster of w | head) p(w | cluster)
    bounds = [0, *cfg.adaptive_cutoffs, V]
    head = torch.softmax(
        torch.cat(
            [h @ E[: bounds[1]].T + b[: bounds[1]], h @ model.head.cluster_weight.T + model.head.cluster_bias], -1
        ),
        -1,
    )
    parts = [head[..., : bounds[1]]]
    for k in range(1, len(bounds) - 1):
        lo, hi = bounds[k], bounds[k + 1]
        parts.append(head[..., bounds[1] + k - 1 : bounds[1] + k] * torch.softmax(h @ E[lo:hi].T + b[lo:hi], -1))
    return {"log_probs": torch.cat(parts, -1).log(), "mems": new_mems}


@pytest.mark.parametrize(
    "options",
    [
        dict(ff_activation="relu", same_length=True, same_length_keys="mem_len"),
        dict(ff_activation="gelu", posenc_kwargs={"clamp_len": 3}),
        dict(
            ff_activation="relu",
            adaptive_cutoffs=[8, 20],
            same_length=True,
            same_length_keys="mem_len",
            posenc_kwargs={"clamp_len": 5},
        ),
    ],
)
def test_published_options_equal_the_naive_published_model(options):
    """Training mode, with memory: every new option (ReLU/GELU, post-LN, output bias, dropout after the FF
    activation / on R (once per segment) / on the final state, clamp_len, the published same-length window,
    the adaptive softmax) equals the written-out math with the same dropout masks."""
    model = build(**{**PUBLISHED, **options}).train()
    L = 5
    x0, x, y = torch.randint(V, (B, 6)), torch.randint(V, (B, L)), torch.randint(V, (B, L))
    with torch.no_grad():
        mems = model.eval()(x0).mems  # a full memory of mem_len states
    model.train()
    pos_drops = [m for m in model.scheme.modules() if isinstance(m, PositionDropout)]
    rec = RecordedDropout(
        {"pos": pos_drops[0], "final": model.final_drop, **{f"ff{i}": blk.ff[2] for i, blk in enumerate(model.blocks)}}
    )
    try:
        out = model(x, y, mems=mems, offset=6)
    finally:
        rec.remove()
    assert len(rec.masks["pos"]) == 1, "R must be dropped once per segment and shared by the layers"
    masks = {
        "pos": rec.masks["pos"],
        "final": rec.masks["final"],
        "ff_inner": [rec.masks[f"ff{i}"][0] for i in range(len(model.blocks))],
    }
    ref = naive_published(model, x, mems, masks)
    torch.testing.assert_close(
        out.logits if model.cfg.adaptive_cutoffs else torch.log_softmax(out.logits, -1),
        ref["log_probs"],
        atol=2e-5,
        rtol=1e-4,
    )
    torch.testing.assert_close(
        out.token_loss, -ref["log_probs"].gather(-1, y[..., None]).squeeze(-1), atol=2e-5, rtol=1e-4
    )
    for a, b in zip(out.mems, ref["mems"]):
        torch.testing.assert_close(a, b)


def test_each_option_changes_the_output():
    """Every option is wired: flipping it alone (eval mode, same weights) changes the log-probs."""
    x = torch.randint(V, (B, 7))
    base = build(**PUBLISHED).eval()
    ref = torch.log_softmax(base(x).logits, -1)
    changes = {"ff_activation": "gelu", "output_bias": False, "pre_norm": True}
    for key, value in changes.items():
        other = build(**{**PUBLISHED, key: value}, randomize=False).eval()
        state = {k: v for k, v in base.state_dict().items() if k in other.state_dict()}
        other.load_state_dict(state, strict=False)
        assert (torch.log_softmax(other(x).logits, -1) - ref).abs().max() > 1e-3, key


def test_dropout_sites_act_in_training_only():
    model = build(**PUBLISHED)
    x = torch.randint(V, (B, 6))
    model.eval()
    a, b = model(x).logits, model(x).logits
    torch.testing.assert_close(a, b)
    off = build(**{**PUBLISHED, "ff_inner_dropout": 0.0, "pos_dropout": 0.0, "final_dropout": 0.0}, randomize=False)
    off.load_state_dict(model.state_dict())
    torch.testing.assert_close(off.eval()(x).logits, a)
    model.train()
    assert (model(x).logits - a).abs().max() > 1e-3


def test_published_init_differs_from_gpt2_where_the_published_code_does():
    """published: residual projections N(0, 0.02) unscaled, LayerNorm gains N(1, 0.02), u, v N(0, 0.02);
    gpt2: residual projections N(0, 0.02 / sqrt(2 n_layer)), gains 1, u = v = 0."""
    kw = dict(vocab_size=V, n_layer=8, d_model=128, n_head=4, d_inner=256, pre_norm=False)
    pub, gpt = (MemoryTransformer(ModelConfig(**kw, init=init)) for init in ("published", "gpt2"))
    assert pub.blocks[0].out_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert gpt.blocks[0].out_proj.weight.std().item() == pytest.approx(0.02 / 4, rel=0.05)
    gains = torch.cat([b.ln_attn.weight for b in pub.blocks])
    assert gains.mean().item() == pytest.approx(1.0, abs=0.005) and gains.std().item() == pytest.approx(0.02, rel=0.1)
    assert all(torch.equal(b.ln_attn.weight, torch.ones(128)) for b in gpt.blocks)
    uv = torch.cat([pub.scheme.u.flatten(), pub.scheme.v.flatten()])
    assert uv.std().item() == pytest.approx(0.02, rel=0.15) and not gpt.scheme.u.any()
    with pytest.raises(ValueError, match=r"model.init must be one of gpt2, published, got 'xavier'"):
        ModelConfig(init="xavier")


# --------------------------------------------------------------------------------------------
# clamp_len and the same-length window
# --------------------------------------------------------------------------------------------


def test_clamp_len_zero_is_refused_with_the_published_meaning():
    with pytest.raises(ValueError, match=r"clamp_len.*got 0.*published.*no clamp.*null"):
        build(posenc_kwargs={"clamp_len": 0})
    with pytest.raises(ValueError, match=r"clamp_len.*integer >= 1.*-1"):
        build(posenc_kwargs={"clamp_len": -1})


def test_clamp_len_caps_the_distance_and_null_does_not():
    """clamp_len = c: every distance >= c uses R_c; a clamp past every distance is no clamp (= null)."""
    x = torch.randint(V, (B, 9))
    free = build(**PUBLISHED).eval()
    far = build(**PUBLISHED, posenc_kwargs={"clamp_len": 8}, randomize=False).eval()
    near = build(**PUBLISHED, posenc_kwargs={"clamp_len": 2}, randomize=False).eval()
    for m in (far, near):
        m.load_state_dict(free.state_dict())
    torch.testing.assert_close(far(x).logits, free(x).logits)
    out_near = near(x).logits
    torch.testing.assert_close(out_near[:, :3], free(x).logits[:, :3])  # distances up to 2 only
    assert (out_near[:, 3:] - free(x).logits[:, 3:]).abs().max() > 1e-4


@pytest.mark.parametrize("name", SCHEME_NAMES)
@pytest.mark.parametrize("keys", ["mem_len", "mem_len+1"])
def test_same_length_window_for_every_scheme(name, keys):
    """Published ("mem_len"): each query sees mem_len keys, itself included; "mem_len+1": one more.
    The published mask construction gives the first."""
    L, M = 6, 4
    model = build(name, mem_len=M, same_length=True, same_length_keys=keys).eval()
    out = model(torch.randint(V, (B, L)), mems=model(torch.randint(V, (B, 8))).mems, offset=8, return_attention=True)
    want = M if keys == "mem_len" else M + 1
    if name == "stickbreaking":  # its own key takes no share of the stick (attend_current: false, the authors')
        want -= 1
    for probs in out.attention:
        assert ((probs > 0).sum(-1) == want).all()
    visible = model.positions(L, M, torch.zeros(B, dtype=torch.long), torch.device("cpu")).visible
    if keys == "mem_len":
        assert torch.equal(visible, ~published_mask(L, M, M, True))


# --------------------------------------------------------------------------------------------
# Adaptive softmax
# --------------------------------------------------------------------------------------------


def test_adaptive_softmax_without_tails_is_the_full_softmax():
    h, W, b = torch.randn(3, 5, 16), torch.randn(V, 16), torch.randn(V)
    head = AdaptiveSoftmax(16, V, [], weight=torch.nn.Parameter(W))
    with torch.no_grad():
        head.bias.copy_(b)
    full = torch.log_softmax(h @ W.T + b, -1)
    torch.testing.assert_close(head.log_probs(h), full)
    y = torch.randint(V, (3, 5))
    torch.testing.assert_close(head.token_nll(h, y), -full.gather(-1, y[..., None]).squeeze(-1))


def test_adaptive_softmax_is_a_distribution_and_token_nll_matches_it():
    head = AdaptiveSoftmax(16, V, [6, 15, 20])
    with torch.no_grad():
        head.bias.normal_()
        head.cluster_bias.normal_()
    h = torch.randn(4, 7, 16)
    logp = head.log_probs(h)
    torch.testing.assert_close(logp.logsumexp(-1), torch.zeros(4, 7), atol=1e-5, rtol=0)
    y = torch.arange(28).view(4, 7) % V  # every cluster has targets
    torch.testing.assert_close(head.token_nll(h, y), -logp.gather(-1, y[..., None]).squeeze(-1))
    # tail word: p(w) = p(cluster | head) p(w | cluster), head = [words 0..5 ; the 3 clusters]
    scores = torch.cat([h @ head.weight[:6].T + head.bias[:6], h @ head.cluster_weight.T + head.cluster_bias], -1)
    p_cluster = scores.softmax(-1)[..., 6 + 1]  # the second tail: words 15..19
    p_word = (h @ head.weight[15:20].T + head.bias[15:20]).softmax(-1)[..., 17 - 15]
    torch.testing.assert_close(logp[..., 17], (p_cluster * p_word).log())


def test_adaptive_softmax_is_tied_and_bad_cutoffs_are_refused():
    model = build(adaptive_cutoffs=[8, 20], output_bias=True)
    assert model.head.weight is model.embedding.weight
    x, y = torch.randint(V, (B, 6)), torch.tensor([[0, 9, 25, 3, 21, 7]] * B)
    model(x, y).loss.backward()
    assert model.embedding.weight.grad[25].abs().sum() > 0  # a tail word's row learns through the softmax
    assert model.head.cluster_weight.grad.abs().sum() > 0
    for cutoffs in ([20, 8], [8, V], [0, 8]):
        with pytest.raises(ValueError, match=r"adaptive_cutoffs.*vocab_size=29"):
            build(adaptive_cutoffs=cutoffs)


# --------------------------------------------------------------------------------------------
# The published sizes (meta device: nothing allocated)
# --------------------------------------------------------------------------------------------


def preset_model(preset: str, vocab_size: int, posenc: str = "xl") -> MemoryTransformer:
    cfg = compose_config("train", [f"model={preset}", f"posenc={posenc}"])
    with torch.device("meta"):
        return MemoryTransformer(model_config(cfg, vocab_size))


def test_wt103_base_has_the_published_parameter_count():
    model = preset_model("txl_wt103_base", 267_735)
    assert model.num_params() == 151_107_538
    layers = sum(p.numel() for p in model.blocks.parameters()) + sum(p.numel() for p in model.scheme.w_kr.parameters())
    assert layers == 41_066_400


def test_enwik8_base_has_the_published_count_and_26676_more_at_byte_level():
    """Published: 204 symbols, 41,055,436 parameters. Bytes: 52 more embedding rows (512) and output biases."""
    assert preset_model("txl_enwik8_base", 204).num_params() == 41_055_436
    assert preset_model("txl_enwik8_base", 256).num_params() == 41_055_436 + 52 * (512 + 1) == 41_082_112


def test_bench_sizes_the_txl_presets_as_published():
    """`posenc-lab bench --configs txl_wt103_base,txl_enwik8_base`: the word preset at WikiText-103's vocabulary."""
    from posenc_lab.bench import BenchConfig

    with torch.device("meta"):
        sizes = {
            name: MemoryTransformer(BenchConfig.preset(name).model_config("xl")).num_params()
            for name in ("txl_wt103_base", "txl_enwik8_base")
        }
    assert sizes == {"txl_wt103_base": 151_107_538, "txl_enwik8_base": 41_082_112}


# --------------------------------------------------------------------------------------------
# Every scheme keeps every option
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCHEME_NAMES)
def test_every_scheme_takes_the_published_options(name):
    model = build(name, **PUBLISHED, adaptive_cutoffs=[8, 20], same_length=True)
    x, y = torch.randint(V, (B, 6)), torch.randint(V, (B, 6))
    out = model.train()(x, y, mems=model(x).mems, offset=6)
    out.loss.backward()
    assert torch.isfinite(out.loss) and model.head.cluster_weight.grad is not None
    assert isinstance(model.blocks[0].ff[1], torch.nn.ReLU) and model.blocks[0].ff[2].p == 0.5
    assert model.final_drop.p == 0.5 and model.head.bias is not None
    model.eval()
    out = model(x, y)
    torch.testing.assert_close(out.logits.logsumexp(-1), torch.zeros(B, 6), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.token_loss, -out.logits.gather(-1, y[..., None]).squeeze(-1))


# --------------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------------


def test_training_presets_hold_the_published_settings():
    for name, (seg, batch, steps) in {
        "txl_wt103_base": (150, 60, 200_000),
        "txl_enwik8_base": (512, 22, 400_000),
    }.items():
        cfg = compose_config("train", [f"experiment={name}"])
        assert cfg.model == compose_config("train", [f"model={name}"]).model  # the model preset, unchanged
        assert (cfg.data.segment_len, cfg.model.mem_len, cfg.data.batch_size, cfg.trainer.max_steps) == (
            seg,
            seg,
            batch,
            steps,
        )
        assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.min_lr_ratio, cfg.optim.weight_decay) == (
            2.5e-4,
            0,
            0.0,
            0.0,
        )
        assert cfg.trainer.gradient_clip_val == 0.25 and cfg.posenc.name == "xl" and cfg.posenc.clamp_len is None
        assert (cfg.model.pre_norm, cfg.model.ff_activation, cfg.model.output_bias, cfg.model.init) == (
            False,
            "relu",
            True,
            "published",
        )
    table6 = compose_config("train", ["experiment=wt103_table6"])
    wt103 = compose_config("train", ["experiment=txl_wt103_base"])
    assert table6.model == wt103.model and table6.optim == wt103.optim
    assert (table6.data.segment_len, table6.data.batch_size, table6.trainer.gradient_clip_val) == (150, 60, 0.25)


@pytest.mark.parametrize(
    "preset, seg, mem, clamp", [("txl_wt103_base", 64, 640, 400), ("txl_enwik8_base", 80, 2100, 820)]
)
def test_eval_presets_hold_the_published_settings(preset, seg, mem, clamp):
    cfg = compose_config("eval", ["ckpt=x.ckpt", f"preset={preset}"])
    assert (cfg.data.segment_len, cfg.model.mem_len, cfg.posenc.clamp_len, cfg.split) == (seg, mem, clamp, "test")
    assert cfg.model.same_length is True and cfg.model.same_length_keys == "mem_len"


def test_adaptive_model_trains_and_evaluates_with_per_token_losses(tmp_path):
    """The WikiText-103 preset, shrunk, on a small word corpus: training, then the published-style evaluation
    (clamp_len changed at evaluation, the published window) with per-token losses and predictions."""
    from posenc_lab.evaluate import evaluate_checkpoint, output_name
    from posenc_lab.train import train

    words = ["the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be"]
    gen = torch.Generator().manual_seed(0)
    folder = tmp_path / "cache" / "wikitext103" / "wikitext-103"
    folder.mkdir(parents=True)
    for split, n in (("train", 300), ("valid", 40), ("test", 40)):
        idx = torch.randint(len(words), (n, 12), generator=gen).tolist()
        (folder / f"wiki.{split}.tokens").write_text("\n".join(" ".join(words[i] for i in row) for row in idx) + "\n")
    cfg = compose_config(
        "train",
        [
            "experiment=txl_wt103_base",
            f"run_dir={tmp_path / 'run'}",
            f"data.root={tmp_path / 'cache'}",
            "model.n_layer=2",
            "model.d_model=32",
            "model.n_head=2",
            "model.d_inner=64",
            "model.mem_len=16",
            "model.adaptive_cutoffs=[4,10]",
            "data.segment_len=16",
            "data.batch_size=4",
            "data.eval_batch_size=4",
            "trainer.max_steps=2",
            "trainer.val_check_interval=1000",
            "trainer.limit_val_batches=2",
            "trainer.enable_progress_bar=false",
            "final_eval.limit_batches=2",
        ],
    )
    results = train(cfg)
    assert math.isfinite(results["val"]["loss"]) and "ppl" in results["val"]
    r = evaluate_checkpoint(
        results["checkpoint"],
        segment_len=8,
        mem_len=24,
        same_length=True,
        same_length_keys="mem_len",
        scheme_options={"clamp_len": 12},
        max_batches=3,
        return_token_losses=True,
    )
    arrays = r["token_losses"]
    mask = arrays["loss_mask"]
    assert mask.sum() > 0 and arrays["correct"].shape == mask.shape
    assert r["loss"] == pytest.approx(float(arrays["token_loss"][mask].mean()), rel=1e-5)
    assert output_name(r) == "test_step2_L8_M24_same-published_Tnone_B4_first3_clamp_len12"
    with pytest.raises(ValueError, match=r"no option\(s\) \['clamp_lenn'\].*clamp_len"):
        evaluate_checkpoint(results["checkpoint"], scheme_options={"clamp_lenn": 12}, max_batches=1)
