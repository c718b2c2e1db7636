"""``pdctl make-model DIR``: the small lab model, made offline and deterministically.

A byte-level BPE tokenizer trained with ``tokenizers`` on a generated corpus, and a tiny
Llama (``LlamaForCausalLM``: hidden 256, 4 layers, 4 attention heads, 2 KV heads) with seeded
random weights saved as BF16 safetensors. Its output is gibberish; its timing and KV cache
behaviour are those of a real model served by vLLM. Needs the lab extra (torch, transformers).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from controller.cli.args import SubParsers

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, MAX_LEN = 256, 512, 4, 4, 2, 2048
VOCAB_SIZE = 640
SPECIALS = ["<unk>", "<s>", "</s>"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")
WORDS = ("prefill decode cache token batch model layer head tensor parallel transfer link "
         "queue instance pool router request stream latency throughput memory bandwidth "
         "compute block engine scale drain ready the a of to and in is for on with").split()


def corpus(seed: int, lines: int = 4000) -> Iterator[str]:
    rng = random.Random(seed)
    for _ in range(lines):
        yield " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 16)))


def build_tokenizer(seed: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(seed), trainer)
    return tok


def make_model(out: Path, seed: int = 0) -> Path:
    """Write config.json, tokenizer files and model.safetensors into ``out``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(seed)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    config = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=HIDDEN,
                         intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         max_position_embeddings=MAX_LEN, bos_token_id=tok.token_to_id("<s>"),
                         eos_token_id=tok.token_to_id("</s>"), tie_word_embeddings=False,
                         dtype="bfloat16")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.to(torch.bfloat16)  # type: ignore[arg-type]  # transformers' typing of .to
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "pdctl-model.json").write_text(json.dumps({"seed": seed, "maker": "pdctl"}) + "\n")
    return out


def is_model_dir(path: Path) -> bool:
    return all((path / f).is_file() for f in ("config.json", "tokenizer.json",
                                              "model.safetensors"))


def add_make_model_parser(sub: SubParsers) -> None:
    p = sub.add_parser("make-model", help="write the small lab model",
                       description="Write a tiny Llama-architecture model (config, tokenizer, "
                                   "BF16 safetensors weights) for the CPU lab. Offline and "
                                   "deterministic: the same seed gives the same files.")
    p.add_argument("dir", type=Path, help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="overwrite an existing model")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if is_model_dir(args.dir) and not args.force:
        print(f"{args.dir}: a model is already there (use --force to overwrite)")
        return 0
    try:
        make_model(args.dir, args.seed)
    except ImportError as exc:
        print(f"pdctl make-model: needs torch and transformers (pip install -e '.[lab]'): "
              f"{exc}", file=sys.stderr)
        return 2
    print(f"wrote the lab model to {args.dir}")
    return 0
