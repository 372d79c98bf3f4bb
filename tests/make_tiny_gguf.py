#!/usr/bin/env python3
"""A tiny random-weight Llama in GGUF for llama.cpp's llama-server, written
here with the `gguf` package (no downloads): 2 layers, 128 hidden, 2 heads of
64, a byte-level BPE vocabulary (GPT-2's 256 byte symbols and 26 merges, a
space with each lowercase letter: about one token a byte) plus ChatML's
special tokens and chat template.

usage: python tests/make_tiny_gguf.py OUT.gguf
"""

from __future__ import annotations

import sys

import gguf
import numpy as np

HIDDEN, HEADS, LAYERS, FFN, CONTEXT = 128, 2, 2, 256, 32768
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte (what byte-level BPE vocabularies store)."""
    keep = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def main(path: str) -> None:
    symbols = byte_symbols()
    space = symbols[ord(" ")]
    merges = [f"{space} {c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    tokens = symbols + [m.replace(" ", "") for m in merges] + list(SPECIAL)
    types = [gguf.TokenType.NORMAL] * (256 + len(merges)) + [gguf.TokenType.CONTROL] * len(SPECIAL)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("rampwatch-tiny-llama (random weights)")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    vocab = len(tokens)
    w.add_tensor("token_embd.weight", weight(vocab, HIDDEN))
    for i in range(LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", weight(HIDDEN, HIDDEN))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weight(FFN, HIDDEN))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weight(FFN, HIDDEN))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weight(HIDDEN, FFN))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor("output.weight", weight(vocab, HIDDEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1])
