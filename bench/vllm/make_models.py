"""Make the real-vLLM test bed's tiny models, deterministically and offline.

Run with the test bed's own Python (bench/vllm/setup does): it needs `transformers`,
`tokenizers` and `torch`, which live in the vLLM virtualenv, never in the project's.

    python bench/vllm/make_models.py --corpus bench/vllm/corpus.txt --out .vllm/models

Models (Llama architecture, float32 safetensors, a byte-level BPE tokenizer trained on the corpus,
so any text tokenizes and nothing is downloaded):

    tiny-a      seed 0; the reference of every test gate
    tiny-b      seed 1: the same shapes with other weights (a candidate that must diverge)
    tiny-short  tiny-a's weights with a 256-token context (errors for prompts that do not fit)

The weights are random but not flat: a larger initializer range makes each step's top token
win by a clear margin, so greedy outputs do not flip between batch sizes of one engine (which
would make identical engines look divergent) while another seed still changes every answer.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 1024
SPECIAL = ["<|pad|>", "<|bos|>", "<|eos|>"]
# A plain chat template (vLLM's chat endpoint needs one): role-tagged turns, then the
# assistant's turn when asked for.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|bos|>assistant:{% endif %}"
)


def tokenizer(corpus: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(corpus)], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", bos_token="<|bos|>", eos_token="<|eos|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def model(tok: PreTrainedTokenizerFast, seed: int, context: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=context,
        initializer_range=0.2,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    m = LlamaForCausalLM(config)
    m.eval()
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    tok = tokenizer(args.corpus)
    made = {}
    for name, seed, context in (("tiny-a", 0, 2048), ("tiny-b", 1, 2048), ("tiny-short", 0, 256)):
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        model(tok, seed, context).save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
        made[name] = {"seed": seed, "context": context, "vocab": len(tok)}
        print(f"made {out} (seed {seed}, context {context}, vocab {len(tok)})", flush=True)
    (args.out / "models.json").write_text(json.dumps(made, indent=2) + "\n")


if __name__ == "__main__":
    main()
