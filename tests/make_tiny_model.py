"""Writes a tiny random-weight Llama and a locally trained tokenizer to a folder.

Runs inside the vLLM virtualenv (needs torch, transformers, tokenizers); no hub
downloads. Head dimension 64 (hidden 128, 2 heads) because vLLM's CPU
attention needs at least that.

usage: python make_tiny_model.py OUT_DIR [--think]

--think: a "reasoning model": <think> and </think> in the vocabulary (a reasoning parser looks them up) and a
chat template that opens a think block after the assistant's role, so everything it generates is reasoning
until it happens to sample </think>; enable_thinking=false (Qwen3's switch) closes the block in the prompt.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


THINK_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n<think>\n"
    "{% if enable_thinking is defined and enable_thinking is false %}\n</think>\n\n{% endif %}{% endif %}"
)


ASCII = "".join(map(chr, range(128)))


def corpus(n: int = 20000) -> list[str]:
    rng = random.Random(7)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 8))) for _ in range(3000)]
    lines = [" ".join(rng.choice(words) for _ in range(20)) for _ in range(n)]
    lines.append(
        "Remember this fact: the access code of Marlow is 7F3K-9QZ2. "
        "Question: what is it? 0123456789 ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    )
    return lines


def main(out: Path, think: bool = False) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # Only ASCII bytes in the vocabulary: a random model that sampled a lone byte of a multi-byte character
    # would stream no text for that token (vLLM holds back an incomplete character), so the client's first
    # text would come decode steps after the server's first token and the two TTFT clocks would disagree.
    ascii_alphabet = sorted({c for piece, _ in tok.pre_tokenizer.pre_tokenize_str(ASCII) for c in piece})
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=ascii_alphabet,
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    if think:
        fast.add_tokens(["<think>", "</think>"])
        fast.chat_template = THINK_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=131072,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        torch_dtype="bfloat16",
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": fast.eos_token_id}))
    print(f"tiny model written to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), think="--think" in sys.argv[2:])
