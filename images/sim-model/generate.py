"""Generate the tiny local Llama that the simulated ring serves (no downloads).

Random weights from a fixed seed and a byte-level BPE trained on a fixed, sorted slice of
the standard library's sources: the same interpreter and package versions give the same
files, so config.json's sha256 can be pinned in the image lock. A `sparkring-model.json`
beside the model lists every file's sha256 (the lock and SparkCache's identity read it).

Usage: python generate.py OUT_DIR   (needs torch, transformers, tokenizers: .venv-vllm)
"""

import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path

# Before tokenizers is imported: one training thread keeps merges in a reproducible order.
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SEED = 20260730
VOCAB_SIZE = 1024
CORPUS_FILES = 200  # sorted stdlib .py files used to train the tokenizer
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|>{% else %}<|assistant|>{% endif %}"
    "{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def model_config() -> LlamaConfig:
    """The one geometry every SparkRing CPU test serves: 2 layers, GQA 4:2, head size 32."""
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )


def corpus_files() -> list[Path]:
    """A fixed, sorted slice of the stdlib's top-level modules (no site-packages)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(stdlib.glob("*.py"))[:CORPUS_FILES]


def train_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(p) for p in corpus_files()], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=SPECIAL_TOKENS[0],
        eos_token=SPECIAL_TOKENS[1],
        pad_token=SPECIAL_TOKENS[1],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def file_digests(out: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.iterdir())
        if p.is_file() and p.name != "sparkring-model.json"
    }


def generate(out: Path) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(model_config())
    model.save_pretrained(out, safe_serialization=True)
    train_tokenizer().save_pretrained(out)
    digests = file_digests(out)
    manifest = {"generator": "images/sim-model/generate.py", "seed": SEED, "sha256": digests}
    (out / "sparkring-model.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return digests


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: generate.py OUT_DIR")
    for name, digest in generate(Path(sys.argv[1])).items():
        sys.stdout.write(f"{digest}  {name}\n")
