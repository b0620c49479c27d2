"""The supported model families: one declarative `LayerMap` per transformers ``model_type``.

Most rotary decoders share one layout, ``model.layers[i].self_attn.{q,k,v,o}_proj``
with ``mlp.down_proj`` (`rotary`); a family that follows it is one line
here. A family with its own names spells them out (`LayerMap`); the q/k/v
split functions live in `jaxroll.measure.layer_spec`. The docs' family table
is generated from `FAMILIES` (`jaxroll.measure.family_table`).

What each architecture means for the statistics (docs/measuring.md):

- Parallel attention and MLP (GPT-J, GPT-NeoX with ``use_parallel_residual``,
  Falcon with ``parallel_attn``): the block computes ``x + a(LN(x)) +
  m(LN'(x))``; both sub-layers read the same input ``x``. ``lambda_t =
  ||a|| / (||x|| + ||a||)`` is then the share of the block's update that
  moves information across positions against the identity path, exactly as
  in a sequential block; the MLP, position-wise, belongs with the identity
  (``lambda_mlp`` counts it there). The only difference is that a sequential
  MLP also sees ``a``; in a parallel block it does not.
- Post-norms on the attention output (Gemma 2/3, OLMo 2): the residual
  update is ``a = Norm(W_O context)``; ``a`` is read after that norm. The
  norm is an RMSNorm, ``a_i = g * o_i / r_i`` with ``o_i = sum_h W_O^h
  context_h(i)`` and one scale ``r_i = sqrt(mean(o_i^2) + eps)`` per token, so
  head h's share of ``a_i`` is ``g * W_O^h context_h(i) / r_i``:
  ``head_norms`` is the mean of its norm, and ``norm_kernels`` weighs values
  by ``||g * W_O^h v_h(j)||`` (``1 / r_i`` cancels in each row's sum).
- Rotary positions: ``q . k`` after the projection is not the logit (the
  rotation comes after), so ``content`` and ``qk`` are refused. QK-norm
  (Qwen3, Gemma 3, OLMo 2): q and k are read after the norm (``q_norm``,
  ``k_norm``), the closest point to the logit before the rotation.
- Sliding-window layers (Mistral, Gemma 2/3, StarCoder2, Qwen2 with
  ``use_sliding_window``): the measured attention already carries the
  window; `windows` writes it per layer into the metadata.
- Soft-capped logits (Gemma 2): the capping acts inside the softmax (attention
  probabilities, read as the model computes them) and on the output logits
  (the influence target reads the model's own logits); no statistic needs
  more.
- Learned absolute positions (GPT-2, OPT): the position embedding is added
  to the token embedding, so ``q . k`` after the projection is the logit
  (content is measured) and the influence gradient is taken at the token
  embedding.
"""

from __future__ import annotations

import math

from .layer_spec import (
    LayerMap,
    inverse_sqrt_head_dim,
    split_falcon,
    split_fused_chunks,
    split_fused_interleaved,
    split_heads_first,
    split_phi3,
    split_separate,
    value_falcon,
    value_fused_chunks,
    value_fused_interleaved,
    value_phi3,
    value_separate,
)
from . import layer_spec as _maps

__all__ = ["FAMILIES", "REFUSED", "rotary", "windows"]

ROTARY_FORMULA = "z = (R_i q_i) . (R_j k_j) / sqrt(d)  (rotary)"
def _gemma_scale(config, head_dim):
    return 1.0 / math.sqrt(config.query_pre_attn_scalar)


def rotary(name: str, title: str, config_class: str, *, qk_norm: bool = False, mlp_output: str = "mlp.down_proj",
           post_norm: bool = False, attention_kind: str = "MHA, GQA, MQA", logit_scale=inverse_sqrt_head_dim,
           notes: str = "", parallel: str | None = None, split=split_separate,
           rotary_module: str | None = None, input_norm: tuple[str, ...] = ("input_layernorm",)) -> LayerMap:
    """The shared rotary layout: ``model.layers[i].self_attn.{q,k,v,o}_proj``.

    `qk_norm`: q and k are read after ``self_attn.{q,k}_norm``; `post_norm`:
    the residual update is ``post_attention_layernorm(o_proj(...))`` and the
    MLP's is ``post_feedforward_layernorm(...)``.
    """
    query_key = ("self_attn.q_norm", "self_attn.k_norm") if qk_norm else ("self_attn.q_proj", "self_attn.k_proj")
    return LayerMap(
        name, "model.layers", "self_attn", "post_attention_layernorm" if post_norm else "self_attn.o_proj",
        query_key, split, "num_attention_heads", "hidden_size", "rope", logit_scale,
        formula=ROTARY_FORMULA, title=title, config_class=config_class,
        value="self_attn.v_proj", value_split=value_separate, w_out="self_attn.o_proj",
        mlp_output="post_feedforward_layernorm" if post_norm else mlp_output,
        attention_kind=attention_kind, parallel=parallel,
        notes=notes, rotary=rotary_module, input_norm=input_norm,
    )


FAMILIES: dict[str, LayerMap] = {m.name: m for m in (
    LayerMap("gpt2", "transformer.h", "attn", "attn.c_proj", ("attn.c_attn",), split_fused_chunks, "n_head",
             "n_embd", "learned", _maps.gpt2_scale, formula="z = (q_i . k_j) / sqrt(d)", title="GPT-2",
             config_class="GPT2Config", value="attn.c_attn", value_split=value_fused_chunks, mlp_output="mlp.c_proj",
             attention_kind="MHA", notes="learned absolute positions", input_norm=("ln_1",)),
    LayerMap("opt", "model.decoder.layers", "self_attn", "self_attn.out_proj", ("self_attn.q_proj", "self_attn.k_proj"),
             split_separate, "num_attention_heads", "hidden_size", "learned", inverse_sqrt_head_dim,
             formula="z = (q_i . k_j) / sqrt(d)", title="OPT", config_class="OPTConfig", value="self_attn.v_proj",
             value_split=value_separate, mlp_output="fc2", attention_kind="MHA",
             notes="learned absolute positions (offset 2)", input_norm=("self_attn_layer_norm",)),
    LayerMap("bloom", "transformer.h", "self_attention", "self_attention.dense", ("self_attention.query_key_value",),
             split_fused_interleaved, "n_head", "hidden_size", "alibi", inverse_sqrt_head_dim, _maps.bloom_slopes,
             _maps.bloom_bias, "z = (q_i . k_j) / sqrt(d) + m_h * j", title="BLOOM", config_class="BloomConfig",
             value="self_attention.query_key_value", value_split=value_fused_interleaved,
             mlp_output="mlp.dense_4h_to_h", attention_kind="MHA"),
    LayerMap("mpt", "transformer.blocks", "attn", "attn.out_proj", ("attn.Wqkv",), split_fused_chunks, "n_heads",
             "d_model", "alibi", _maps.mpt_scale, _maps.mpt_slopes, _maps.mpt_bias,
             "z = (q_i . k_j) * softmax_scale + m_h * (j - (max_seq_len - 1))", title="MPT", config_class="MptConfig",
             value="attn.Wqkv", value_split=value_fused_chunks, mlp_output="ffn.down_proj", attention_kind="MHA",
             notes="N at most max_seq_len", input_norm=("norm_1",)),
    LayerMap("falcon", "transformer.h", "self_attention", "self_attention.dense", ("self_attention.query_key_value",),
             split_falcon, "num_attention_heads", "hidden_size", "alibi", inverse_sqrt_head_dim, _maps.falcon_slopes,
             _maps.falcon_bias, "z = (q_i . k_j + c * m_h * j) / sqrt(d)", title="Falcon",
             config_class="FalconConfig", value="self_attention.query_key_value", value_split=value_falcon,
             mlp_output="mlp.dense_4h_to_h", attention_kind="MHA, MQA, grouped (new decoder)",
             parallel="parallel_attn", notes="ALiBi (alibi=True), or rotary (then no content, qk)",
             input_norm=("ln_attn", "input_layernorm")),
    LayerMap("gpt_neox", "gpt_neox.layers", "attention", "attention.dense", ("attention.query_key_value",),
             split_fused_interleaved, "num_attention_heads", "hidden_size", "rope", inverse_sqrt_head_dim,
             formula=ROTARY_FORMULA, title="GPT-NeoX (Pythia)", config_class="GPTNeoXConfig",
             value="attention.query_key_value", value_split=value_fused_interleaved, mlp_output="mlp.dense_4h_to_h",
             attention_kind="MHA", parallel="use_parallel_residual", notes="partial rotary",
             rotary="gpt_neox.rotary_emb"),
    LayerMap("gptj", "transformer.h", "attn", "attn.out_proj", ("attn.q_proj", "attn.k_proj"), split_separate,
             "n_head", "n_embd", "rope", inverse_sqrt_head_dim, formula=ROTARY_FORMULA, title="GPT-J",
             config_class="GPTJConfig", value="attn.v_proj", value_split=value_separate, mlp_output="mlp.fc_out",
             attention_kind="MHA", parallel=True, notes="partial rotary (rotary_dim)", input_norm=("ln_1",)),
    rotary("llama", "Llama", "LlamaConfig", rotary_module="model.rotary_emb"),
    rotary("mistral", "Mistral", "MistralConfig", notes="sliding window", rotary_module="model.rotary_emb"),
    rotary("mixtral", "Mixtral", "MixtralConfig", mlp_output="mlp",
           notes="the attention side of the mixture-of-experts block; m = the MoE block's output"),
    rotary("qwen2", "Qwen2", "Qwen2Config", notes="sliding window if use_sliding_window",
           rotary_module="model.rotary_emb"),
    rotary("qwen3", "Qwen3", "Qwen3Config", qk_norm=True, notes="QK-norm"),
    rotary("gemma2", "Gemma 2", "Gemma2Config", post_norm=True, logit_scale=_gemma_scale,
           notes="alternating sliding-window layers, soft-capped logits, post-norms"),
    rotary("gemma3_text", "Gemma 3 (text)", "Gemma3TextConfig", qk_norm=True, post_norm=True,
           logit_scale=_gemma_scale, split=split_heads_first, notes="5:1 sliding-window layers, QK-norm, post-norms"),
    LayerMap("phi3", "model.layers", "self_attn", "self_attn.o_proj", ("self_attn.qkv_proj",), split_phi3,
             "num_attention_heads", "hidden_size", "rope", inverse_sqrt_head_dim, formula=ROTARY_FORMULA,
             title="Phi-3", config_class="Phi3Config", value="self_attn.qkv_proj", value_split=value_phi3,
             mlp_output="mlp.down_proj", attention_kind="MHA, GQA", notes="fused qkv projection"),
    rotary("olmo2", "OLMo 2", "Olmo2Config", qk_norm=True, post_norm=True,
           notes="QK-norm over all heads, post-norms only", input_norm=()),
    rotary("stablelm", "StableLM", "StableLmConfig", parallel="use_parallel_residual",
           notes="partial rotary; q/k read before the optional per-head qk_layernorm"),
    rotary("starcoder2", "StarCoder2", "Starcoder2Config", mlp_output="mlp.c_proj", notes="sliding window"),
)}
"""Hugging Face ``model_type`` -> its `LayerMap` (modules, position encoding, refusals)."""

REFUSED: dict[str, str] = {
    "gpt_oss": "its attention sinks are parameters: the probabilities it returns leave out the sink's share, so "
               "rows do not sum to 1 and no kernel is row-stochastic",
}
"""``model_type`` -> why it cannot be supported (one line)."""


def windows(config, num_layers: int) -> list[int | None]:
    """The attention window of each layer: an int W (keys ``i - W < j <= i``) or None (causal).

    From ``config.layer_types`` (``"sliding_attention"`` layers get
    ``config.sliding_window``) where the config has it, else
    ``config.sliding_window`` on every layer unless ``use_sliding_window``
    is False.
    """
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types:
        return [int(window) if kind == "sliding_attention" and window else None for kind in types[:num_layers]]
    if window and getattr(config, "use_sliding_window", True):
        return [int(window)] * num_layers
    return [None] * num_layers
