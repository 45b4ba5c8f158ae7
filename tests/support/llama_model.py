"""Hugging Face ``LlamaForCausalLM`` from a ``LlamaConfig``, as benchmarks/llm.py
trains it on a GPU and tests/torchax/test_torchax_llama.py on JAX's CPU
backend: the same model code, initialisation (seed 0) and batches (seed 1)
on every path; random init, nothing downloaded.

Shapes (``SHAPES``): ``8b-8l`` is Llama-3-8B's (hidden 4096, intermediate
14336, 32 heads, 8 KV heads, vocabulary 128256, RoPE theta 500000, RMSNorm,
SwiGLU) with 8 decoder layers instead of 32; ``smoke`` a 2-layer, 256-wide
version of it (the script's own check on the CPU); ``tiny`` 2 layers of width
64 with grouped-query attention (the CPU tests). Every dimension, the token
count of a batch included, is a multiple of 16, as fp8 GEMMs need.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

# the decoder layers' Linear layers, by the name Transformers gives each
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
                 rms_norm_eps=1e-5, num_hidden_layers=32)
SHAPES = {
    "8b-8l": {**LLAMA3_8B, "num_hidden_layers": 8},
    "smoke": {**LLAMA3_8B, "hidden_size": 256, "intermediate_size": 896,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024,
              "num_hidden_layers": 2},
    "tiny": {**LLAMA3_8B, "hidden_size": 64, "intermediate_size": 128,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
             "num_hidden_layers": 2},
}


class CausalLM(nn.Module):
    """The model's logits only, no cache: a training step's loss takes
    (output, target)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def config(shape: str, seq: int):
    import transformers as tf
    return tf.LlamaConfig(**SHAPES[shape], max_position_embeddings=seq, attention_dropout=0.0,
                          tie_word_embeddings=False, attn_implementation="sdpa")


def build(shape: str, seq: int) -> CausalLM:
    """The model on the CPU in float32, Transformers' own initialisation
    from seed 0."""
    import transformers as tf
    torch.manual_seed(0)
    return CausalLM(tf.LlamaForCausalLM(config(shape, seq)))


def batches(shape: str, batch: int, seq: int, n: int = 4) -> list[tuple]:
    """`n` (input, next-token target) pairs of `batch` x `seq` tokens on the
    CPU, seed 1."""
    g = torch.Generator().manual_seed(1)
    toks = [torch.randint(0, SHAPES[shape]["vocab_size"], (batch, seq + 1), generator=g)
            for _ in range(n)]
    return [(t[:, :-1], t[:, 1:]) for t in toks]


def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy in float32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1))


def fp8_recipe():
    """xla_amp.fp8's recipe for the decoder layers: delayed scaling, the
    default recipe otherwise; the LM head stays in the region's dtype."""
    from xla_amp import fp8
    return fp8.Fp8Recipe(scaling="delayed", keep=("model.lm_head",))


def training_flops(shape: str, seq: int) -> tuple[float, str]:
    """(FLOPs per token of a training step, the formula): 6 N for the
    matmuls' forward and backward, N the parameters less the token embedding
    (a lookup, not a matmul), plus attention's 12 L d T (scores and their
    product with V, forward and backward, the causal half not taken off):
    torchtitan's and PaLM's count."""
    s = SHAPES[shape]
    d, inter, layers, vocab = (s["hidden_size"], s["intermediate_size"],
                               s["num_hidden_layers"], s["vocab_size"])
    kv = d * s["num_key_value_heads"] // s["num_attention_heads"]
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * inter + 2 * d  # q, o; k, v; MLP; 2 norms
    n = layers * per_layer + d + d * vocab  # + the final norm and the LM head
    formula = (f"6 N + 12 L d T = 6 x {n:,} + 12 x {layers} x {d} x {seq} "
               f"(N: parameters less the token embedding)")
    return 6.0 * n + 12.0 * layers * d * seq, formula
