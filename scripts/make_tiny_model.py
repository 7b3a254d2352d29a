"""Generate a tiny random-weight Llama model, with its own tokenizer, for the engine tests.

The engine tests run the real `vllm serve` on CPU, so they need a model directory
that loads in seconds, needs no network, and exists on a fresh CI clone. A model
from the Hub would need a download; this script makes one from nothing, deterministically
(same arguments, same bytes), in a few MB.

Other tests need other shapes (MHA, GQA, MQA, other head_dim or layer counts), so
every dimension is a flag. vLLM's CPU attention kernels accept head_dim in
{32, 64, 80, 96, 112, 128, ...} only (not 16), hence the default of 64.

Run it with the engine's interpreter (transformers, tokenizers and torch live there):

    .venv-engine/bin/python scripts/make_tiny_model.py --out .cache/tiny-llama
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import model_dir  # scripts/model_dir.py, beside this script

# Written last, holding what was asked for and a hash of this script: a directory without it (an
# interrupted run) or with another one (other arguments, an edited generator) is regenerated.

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]

# Built-in training text for the tokenizer: enough variety for a few hundred merges.
CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model answers every question with noise.
Hello, world! How are you today? I am fine, thank you. What is the capital of France? Paris.
Once upon a time there was a tiny language model that lived on a very small computer.
It could count: one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve.
The worker starts the engine, waits until it is ready, and then sends it the requests.
When the engine fails, the worker reads the last lines of its output and explains the cause.
Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14 2.71 -1 +1 = < > ( ) [ ] { } : ; ' " ` ~ ! ? @ # $ % ^ & * _ | / \\
def main():\n    print("hello")\n    return 0\n
{"role": "user", "content": "Say something."} {"role": "assistant", "content": "Something."}
Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore.
Le renard brun saute par-dessus le chien paresseux. Der schnelle braune Fuchs springt über den Hund.
System: you are a helpful assistant. User: tell me a story. Assistant: here is a short story.
"""


def build_tokenizer(vocab_size: int):
    """Train a byte-level BPE on CORPUS and wrap it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = [UNK, BOS, EOS, PAD, *ROLE_TOKENS]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = CORPUS.splitlines()
    tok.train_from_iterator(lines * 4, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS}:0 $A:0",
        pair=f"{BOS}:0 $A:0 $B:1",
        special_tokens=[(BOS, bos_id)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=ROLE_TOKENS,
        model_max_length=0,  # replaced below, once the context length is known
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make(
    out: Path,
    *,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    hidden_size: int | None,
    intermediate_size: int,
    vocab: int,
    max_position_embeddings: int,
    dtype: str,
    seed: int,
    mark: dict[str, object],
) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if heads % kv_heads != 0:
        raise SystemExit(f"--heads {heads} must be a multiple of --kv-heads {kv_heads}")
    hidden = hidden_size if hidden_size is not None else heads * head_dim

    torch.manual_seed(seed)
    tokenizer = build_tokenizer(vocab)
    tokenizer.model_max_length = max_position_embeddings
    # The config's vocab must cover every id the tokenizer can produce.
    vocab_size = len(tokenizer)

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype=dtype,
    )
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
    model = LlamaForCausalLM(config).to(torch_dtype)
    model.eval()

    def write(staging: Path) -> None:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        _pin_dtype(staging / "config.json", dtype)
        _portable_tokenizer_class(staging / "tokenizer_config.json")

    return model_dir.write_atomically(out, mark, write)


def _pin_dtype(config_path: Path, dtype: str) -> None:
    """Record the dtype under both keys: transformers 5 writes `dtype`, older readers want `torch_dtype`."""
    config = json.loads(config_path.read_text())
    config["dtype"] = dtype
    config["torch_dtype"] = dtype
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _portable_tokenizer_class(tokenizer_config_path: Path) -> None:
    """transformers 5 writes `TokenizersBackend`; `PreTrainedTokenizerFast` loads under 4.x and 5.x alike."""
    config = json.loads(tokenizer_config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(".cache/tiny-llama"))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--kv-heads", type=int, default=None, help="default: same as --heads (MHA); 1 for MQA")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--hidden-size", type=int, default=None, help="default: heads * head-dim")
    p.add_argument("--intermediate-size", type=int, default=256)
    p.add_argument("--vocab", type=int, default=512, help="BPE vocabulary size to train, special tokens included (an upper bound: the built-in text may run out of merges)")
    p.add_argument("--max-position-embeddings", type=int, default=2048)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="regenerate even if --out holds a complete model")
    args = p.parse_args(argv)
    if args.kv_heads is None:
        args.kv_heads = args.heads
    return args


def expected_mark(args: argparse.Namespace) -> dict[str, object]:
    shape = {k: v for k, v in vars(args).items() if k not in ("out", "force")}
    return {"generator": model_dir.generator_id(Path(__file__)), **shape}


def is_complete(out: Path, mark: dict[str, object]) -> bool:
    return model_dir.is_complete(out, mark, ("model.safetensors", "tokenizer.json"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    mark = expected_mark(args)
    if is_complete(args.out, mark) and not args.force:
        print(f"{args.out}: already complete")
        return 0
    out = make(
        args.out,
        layers=args.layers,
        heads=args.heads,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        vocab=args.vocab,
        max_position_embeddings=args.max_position_embeddings,
        dtype=args.dtype,
        seed=args.seed,
        mark=mark,
    )
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"{out}: tiny llama written ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
