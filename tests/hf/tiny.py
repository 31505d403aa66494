"""Tiny random causal LMs of each covered family, built here and saved as a local Hugging Face
folder (config.json, model.safetensors, tokenizer.json): 2-4 layers, hidden 64, grouped-query
heads where the family has them, a byte-level BPE tokenizer trained on a few strings."""

from __future__ import annotations

from pathlib import Path

import torch

TEXTS = [
    "Every attention head gets its own causal window.",
    "def window(head):\n    return 2 ** head\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Local layers see the last few tokens; global layers see everything.",
]
VOCAB = 320
MAX_POS = 128
SLIDING = 6  # native window of the windowed layers


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TEXTS, trainer)
    return tok


def make_config(family: str):
    """A tiny config of `family`; windowed layers (where the family has them) use SLIDING."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  max_position_embeddings=MAX_POS, tie_word_embeddings=False)
    if family == "llama":
        return tf.LlamaConfig(num_hidden_layers=2, num_key_value_heads=2, **common)
    if family == "qwen3":  # layers >= max_window_layers slide (transformers' rule), here layers 2 and 3
        return tf.Qwen3Config(num_hidden_layers=4, num_key_value_heads=2, head_dim=16, use_sliding_window=True,
                              sliding_window=SLIDING, max_window_layers=2, **common)
    if family == "mistral":
        return tf.MistralConfig(num_hidden_layers=2, num_key_value_heads=1, sliding_window=SLIDING, **common)
    if family == "gemma3":
        return tf.Gemma3TextConfig(num_hidden_layers=3, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
                                   sliding_window=SLIDING, rope_theta=10000.0,
                                   layer_types=["sliding_attention", "full_attention", "sliding_attention"], **common)
    if family == "gpt2":
        return tf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=MAX_POS, bos_token_id=0,
                             eos_token_id=0)
    raise ValueError(family)


FAMILIES = ["llama", "qwen3", "mistral", "gemma3", "gpt2"]


def save_tiny_model(family: str, folder: Path, seed: int = 0) -> Path:
    """Build a random model of `family` and save it as a local HF folder; returns the folder."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(make_config(family), dtype=torch.float32)
    with torch.no_grad():  # spread the random weights a little so attention is not uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    model.save_pretrained(str(folder), safe_serialization=True)
    build_tokenizer().save(str(folder / "tokenizer.json"))
    return folder


def own_forward_model(folder: Path, attn: str = "eager", dtype=torch.float32):
    """transformers' own model from the folder, with one of its own attention implementations."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, attn_implementation=attn,
                                                dtype=dtype).eval()
