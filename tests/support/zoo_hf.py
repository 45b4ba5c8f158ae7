"""Hugging Face Transformers and timm models for the model zoo
(tests/support/zoo_models.py): small configs, random init, nothing
downloaded (configs only; the machine may be offline). Dropout is off in
every model: a compiled run draws other random numbers than a lazy one, and
the sweep compares the two.

- ``hf_gpt2``, ``hf_llama``, ``hf_mistral``: causal LMs (``*ForCausalLM``),
  the loss the model computes from ``labels`` (its own shift and upcast);
- ``hf_bert``: ``BertForSequenceClassification``, 10 labels;
- ``hf_t5``: ``T5ForConditionalGeneration`` with ``labels`` (the decoder's
  input is the labels shifted right, by the model);
- ``timm_vit_tiny``, ``timm_efficientnet_b0``, ``timm_convnext_atto``,
  ``timm_resnet18d``: timm image classifiers, 10 classes, ``pretrained=False``.

The language models take ``batch`` sequences of 32 tokens over a vocabulary
of 1000, with 2 layers of width 64; the image models ``batch`` images of
``image`` x ``image``.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

SEQ, VOCAB, WIDTH, LAYERS, HEADS = 32, 1000, 64, 2, 4
CAUSAL = ("hf_gpt2", "hf_llama", "hf_mistral")
HF = CAUSAL + ("hf_bert", "hf_t5")
TIMM = {"timm_vit_tiny": "vit_tiny_patch16_224", "timm_efficientnet_b0": "efficientnet_b0",
        "timm_convnext_atto": "convnext_atto", "timm_resnet18d": "resnet18d"}
MODELS = HF + tuple(TIMM)


def _decoder_config(name: str):
    """A Llama-shaped config (grouped-query attention: 2 key/value heads)."""
    import transformers
    cls = {"hf_llama": transformers.LlamaConfig, "hf_mistral": transformers.MistralConfig}[name]
    extra = {"sliding_window": None} if name == "hf_mistral" else {}
    return cls(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=2 * WIDTH,
               num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=2,
               max_position_embeddings=2 * SEQ, attention_dropout=0.0, **extra)


def _hf_model(name: str) -> nn.Module:
    import transformers as tf
    if name == "hf_gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(
            vocab_size=VOCAB, n_positions=2 * SEQ, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    if name in ("hf_llama", "hf_mistral"):
        return tf.AutoModelForCausalLM.from_config(_decoder_config(name))
    if name == "hf_bert":
        model = tf.BertForSequenceClassification(tf.BertConfig(
            vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS,
            num_attention_heads=HEADS, intermediate_size=2 * WIDTH, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, max_position_embeddings=2 * SEQ, num_labels=10))
        # torch.compile(backend="openxla") defect (torch 2.9 / torch_xla 2.9,
        # without xla_amp too): where a tensor feeds both its producer's
        # backward and, through a dropout that does nothing (p=0, or not
        # training), a Linear -- here the pooler's tanh, dropout, classifier
        # -- the compiled forward returns its outputs one place off: `.loss`
        # comes back as the [batch, 10] logits, and a loss computed from
        # `.logits` outside the model comes back as the [batch, 10]
        # log-softmax. Reproducer (returns [2, 8], not [2, 4]):
        # torch.compile(lambda x: l2(F.dropout(torch.tanh(l1(x)), 0.0)),
        # backend="openxla") with l1 = Linear(8, 8), l2 = Linear(8, 4);
        # pinned in tests/zoo/test_zoo_hf.py. The classifier's dropout (p=0, the
        # identity) as nn.Identity: the same model, and the compiled forward
        # returns the loss.
        model.dropout = nn.Identity()
        return model
    if name == "hf_t5":
        return tf.T5ForConditionalGeneration(tf.T5Config(
            vocab_size=VOCAB, d_model=WIDTH, d_kv=WIDTH // HEADS, d_ff=2 * WIDTH,
            num_layers=LAYERS, num_heads=HEADS, dropout_rate=0.0, decoder_start_token_id=0))
    raise KeyError(name)


def build(name: str, batch: int, image: int):
    """(model on CPU, input batch, targets) for `name`; the caller seeds."""
    if name in TIMM:
        import timm
        kwargs = {"img_size": image} if name == "timm_vit_tiny" else {}
        model = timm.create_model(TIMM[name], pretrained=False, num_classes=10, drop_rate=0.0,
                                  drop_path_rate=0.0, **kwargs)
        return model, torch.randn(batch, 3, image, image), torch.randint(0, 10, (batch,))
    model = _hf_model(name)
    x = torch.randint(0, VOCAB, (batch, SEQ))
    if name in CAUSAL:
        y = x  # the model shifts the labels itself
    elif name == "hf_bert":
        y = torch.randint(0, 10, (batch,))
    else:
        y = torch.randint(0, VOCAB, (batch, SEQ))
    return model, x, y


def loss_fn(name: str):
    """The training loss of `name`'s model on (x, y): what the model itself
    computes from ``labels`` for the Transformers models, cross-entropy on
    the logits for timm's."""
    if name in TIMM:
        return lambda model, x, y: F.cross_entropy(model(x), y)
    return lambda model, x, y: model(input_ids=x, labels=y).loss
