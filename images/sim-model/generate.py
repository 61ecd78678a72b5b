"""Generate the tiny local Llama that the simulated ring serves (no downloads).

Every byte follows from this file and the pinned package versions, on any machine: weights are
drawn with numpy's PCG64 (exact integer arithmetic, not torch's CPU-specific normal kernels) and
the byte-level BPE is trained on a corpus built here from a fixed word list and seed (not on the
interpreter's own sources, which differ between Python patch releases). That is what lets the
image lock pin every file of the model (`images/lock.json` models.sim-target.files), and the model
stage verify the copy on every rank against it.

Usage: python generate.py OUT_DIR   (needs torch, transformers, tokenizers, numpy: .venv-vllm)
"""

import hashlib
import os
import random
import sys
from pathlib import Path

# Before tokenizers is imported: one training thread keeps merges in a reproducible order.
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SEED = 20260730
VOCAB_SIZE = 1024
CORPUS_SENTENCES = 20000  # sentences of the tokenizer's training corpus
# Words the corpus is made of: English glue, the project's own vocabulary, some code.
WORDS = """the a of to and in is it that for on with as by at from this be are was or an which
ring rank four node link cable model token cache page layer head weight shard file manifest
digest chunk relay peer send receive verify restore serve launch image stage spark fabric
transport overlay all reduce gather scatter tensor parallel context decode prefill batch
def class return import if else for while self none true false print len range list dict"""
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


def corpus() -> list[str]:
    """Sentences from WORDS with a seeded Mersenne Twister: the same text on every machine."""
    rng, words = random.Random(SEED), WORDS.split()
    sentences = []
    for _ in range(CORPUS_SENTENCES):
        picked = [rng.choice(words) for _ in range(rng.randint(3, 14))]
        sentences.append(" ".join(picked).capitalize() + rng.choice([".", ".", "?", ":", ","]))
    return sentences


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
    tokenizer.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=SPECIAL_TOKENS[0],
        eos_token=SPECIAL_TOKENS[1],
        pad_token=SPECIAL_TOKENS[1],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def machine_independent_weights(model: LlamaForCausalLM) -> None:
    """Replace every matrix with uniform values from PCG64 (std 0.02); norms stay ones."""
    rng = np.random.Generator(np.random.PCG64(SEED))
    half_width = np.float32(0.02 * 3**0.5)
    with torch.no_grad():
        for _name, param in sorted(model.named_parameters()):
            if param.dim() < 2:
                continue
            values = rng.random(tuple(param.shape), dtype=np.float32) * (2 * half_width) - half_width
            param.copy_(torch.from_numpy(values))


def generate(out: Path) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    model = LlamaForCausalLM(model_config())
    machine_independent_weights(model)
    model.save_pretrained(out, safe_serialization=True)
    train_tokenizer().save_pretrained(out)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir()) if p.is_file()}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: generate.py OUT_DIR")
    for name, digest in generate(Path(sys.argv[1])).items():
        sys.stdout.write(f"{digest}  {name}\n")
