"""Write src/vllm_worker/config/vllm_flags.json: every `vllm serve` option, read from vLLM's own parser.

The worker never imports vLLM, yet it must turn any UPPER_SNAKE variable into the right
`vllm serve` flag and answer a bad value in milliseconds instead of after vLLM's ~12 s
import. So the facts it needs are taken once, here, from the parser vLLM builds for
`vllm serve` and checked in as data; tests/engine/test_flag_table.py regenerates them and
fails when the installed vLLM no longer matches the file.

For each option: its UPPER_SNAKE name, flag, short spellings, kind (how it is spelled on a
command line), the type its value is converted with, the choices argparse enforces, the
numeric range its pydantic config field enforces, and a deprecation note. A range is kept
only where vLLM really rejects a value outside it when it builds its configuration for a
plain text model: each bound is tried here with vLLM's `create_engine_config` on a tiny
local model config, because some configs (LoRA, multimodal) are built only when used, and
the worker must never refuse what vLLM would accept.

Run it with the engine's interpreter:

    .venv-engine/bin/python scripts/gen_flag_table.py [--out src/vllm_worker/config/vllm_flags.json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "src" / "vllm_worker" / "config" / "vllm_flags.json"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

# The smallest config vLLM's configuration builder accepts; no weights or tokenizer are read.
PROBE_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "vocab_size": 512,
    "rms_norm_eps": 1e-05,
    "torch_dtype": "bfloat16",
}

_BOUNDS = {"Ge": "ge", "Gt": "gt", "Le": "le", "Lt": "lt"}


def serve_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """vLLM's root parser and its `serve` subparser, built as the `vllm` entry point builds them."""
    import vllm.engine.arg_utils as arg_utils

    # Help texts (read for deprecation notes) are only filled in when vLLM thinks --help was asked.
    arg_utils.NEEDS_HELP = True
    arg_utils._compute_kwargs.cache_clear()
    from vllm.entrypoints.cli.serve import cmd_init
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    root = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = root.add_subparsers(required=False, dest="subparser")
    (serve_cmd,) = cmd_init()
    return root, serve_cmd.subparser_init(subparsers)


def upper_snake(flag: str) -> str:
    return flag[2:].replace("-", "_").upper()


def _closure(fn: Any, name: str) -> Any:
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    return cells[name].cell_contents


def value_type(action: argparse.Action) -> tuple[str, bool, str | None]:
    """(type name, whether '' and 'None' mean None, normalization applied before the choices check)."""
    import json as json_module

    from vllm.utils.argparse_utils import human_readable_int, human_readable_int_or_auto

    fn = action.type
    optional = False
    while callable(fn) and getattr(fn, "__name__", "") in ("_optional_type", "_parse_type"):
        optional = optional or fn.__name__ == "_optional_type"
        fn = _closure(fn, "return_type")
    if isinstance(action, (argparse.BooleanOptionalAction, argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "bool", False, None
    known = {
        None: "str",
        str: "str",
        int: "int",
        float: "float",
        human_readable_int: "human_int",
        human_readable_int_or_auto: "human_int_or_auto",
        json_module.loads: "json",
    }
    if fn in known:
        return known[fn], optional, None
    name = getattr(fn, "__name__", "")
    if name == "union_dict_and_str":
        return "json_or_str", optional, None
    if name == "parse_dataclass":
        return "json_config", optional, None
    # An inline converter: keep what it does only when it is a plain case/dash normalization.
    try:
        if all(fn(s) == s.lower().replace("-", "_") for s in ("Ab-C", "x", "A_b")):
            return "str", optional, "lower_underscore"
    except Exception:  # noqa: BLE001 - any other converter is the engine's to judge
        pass
    return "other", optional, None


def kind_of(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "pair"
    if isinstance(action, argparse._StoreTrueAction):
        return "store_true"
    if isinstance(action, argparse._AppendAction):
        return "append"
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        return "list"
    if action.nargs == "?":
        return "optional_value"
    if action.nargs == 0:
        return type(action).__name__
    return "value"


def deprecation(action: argparse.Action, parser: argparse.ArgumentParser) -> str | None:
    if action in getattr(parser, "_deprecated", ()):
        return f"{action.option_strings[0]} is deprecated"
    text = " ".join((action.help or "").split())
    return text if re.match(r"--[\w-]+ is deprecated\b", text) else None


def config_fields() -> dict[str, list[tuple[str, Any]]]:
    """Field name -> [(config class name, pydantic FieldInfo)] over vLLM's config classes."""
    import vllm.config as config_module

    found: dict[str, list[tuple[str, Any]]] = {}
    for name in sorted(dir(config_module)):
        cls = getattr(config_module, name)
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            for field_name, info in (getattr(cls, "__pydantic_fields__", None) or {}).items():
                found.setdefault(field_name, []).append((name, info))
    return found


def declared_range(dest: str, group: str | None, fields: dict[str, list[tuple[str, Any]]]) -> tuple[str, dict[str, float]] | None:
    """The owning config field and its numeric bounds, if the field declares any."""
    owners = fields.get(dest, [])
    chosen = [o for o in owners if o[0] == group] or (owners if len(owners) == 1 else [])
    if not chosen:
        return None
    owner, info = chosen[0]
    bounds: dict[str, float] = {}
    for item in info.metadata:
        key = _BOUNDS.get(type(item).__name__)
        if key is not None:
            bounds[key] = getattr(item, key)
    return (f"{owner}.{dest}", bounds) if bounds else None


def outside(key: str, bound: float, type_name: str) -> str:
    step = 1 if type_name in ("int", "human_int", "human_int_or_auto") else 0.5
    value = {"ge": bound - step, "gt": bound, "le": bound + step, "lt": bound}[key]
    return str(int(value)) if step == 1 else repr(float(value))


class Prober:
    """Builds vLLM's configuration for a tiny local model with one flag set, as `vllm serve` would."""

    def __init__(self, root: argparse.ArgumentParser, model_dir: str) -> None:
        self.root = root
        self.model_dir = model_dir

    def rejects(self, flag: str, value: str, dest: str) -> bool:
        """Whether vLLM refuses `flag value`, for a reason that names the option."""
        from vllm.engine.arg_utils import AsyncEngineArgs

        argv = ["serve", self.model_dir, "--max-model-len", "512", f"{flag}={value}"]
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = self.root.parse_args(argv)
        except SystemExit:
            return flag in err.getvalue()
        ns.model = ns.model_tag
        try:
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                AsyncEngineArgs.from_cli_args(ns).create_engine_config()
        except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError, or anything else
            return dest in str(exc) and "Input should be" in str(exc)
        return False


def option_entry(action: argparse.Action, serve: argparse.ArgumentParser, group: str | None,
                 fields: dict[str, list[tuple[str, Any]]], prober: Prober) -> dict[str, Any]:
    from vllm.entrypoints.launchers.cli_args import LoRAParserAction

    flag = next(s for s in action.option_strings if s.startswith("--"))
    type_name, optional, normalize = value_type(action)
    entry: dict[str, Any] = {"flag": flag, "dest": action.dest, "kind": kind_of(action), "type": type_name}
    shorts = [s for s in action.option_strings if not s.startswith("--")]
    if shorts:
        entry["short"] = shorts
    longs = [s for s in action.option_strings if s.startswith("--") and s != flag and not s.startswith("--no-")]
    if longs:
        entry["aliases"] = longs
    if optional:
        entry["optional"] = True
    if normalize:
        entry["normalize"] = normalize
    if action.choices is not None and type_name != "bool":
        entry["choices"] = [c for c in action.choices if c is not None]
    if group:
        entry["group"] = group
    declared = declared_range(action.dest, group, fields)
    if declared and type_name in ("int", "float", "human_int", "human_int_or_auto") and entry["kind"] == "value":
        owner, bounds = declared
        enforced = {k: b for k, b in bounds.items() if prober.rejects(flag, outside(k, b, type_name), action.dest)}
        if enforced:
            entry["range"] = {k: (int(b) if float(b).is_integer() and type_name != "float" else b) for k, b in enforced.items()}
            entry["range_owner"] = owner
    note = deprecation(action, serve)
    if note:
        entry["deprecated"] = note
    if isinstance(action, LoRAParserAction):
        from vllm.entrypoints.openai.models.protocol import LoRAModulePath

        lora_fields = dataclasses.fields(LoRAModulePath)
        entry["item_fields"] = {
            "required": [f.name for f in lora_fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING],
            "optional": [f.name for f in lora_fields if not (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)],
        }
    for key, bound in entry.get("range", {}).items():
        assert math.isfinite(bound), (flag, key, bound)
    return entry


def build_table() -> dict[str, Any]:
    import vllm

    root, serve = serve_parser()
    groups = {id(a): g.title for g in serve._action_groups for a in g._group_actions}
    fields = config_fields()
    options: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="gen-flag-table-") as model_dir:
        Path(model_dir, "config.json").write_text(json.dumps(PROBE_MODEL_CONFIG))
        prober = Prober(root, model_dir)
        for action in serve._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            entry = option_entry(action, serve, groups.get(id(action)), fields, prober)
            name = upper_snake(entry["flag"])
            assert name not in options, f"two options spell {name}"
            options[name] = entry
    return {
        "vllm": vllm.__version__,
        "generated_by": "scripts/gen_flag_table.py",
        "options": options,
    }


def dumps(table: dict[str, Any]) -> str:
    """One option per line: a vLLM upgrade shows up as a readable diff."""
    lines = ["{"]
    lines.append(f'  "vllm": {json.dumps(table["vllm"])},')
    lines.append(f'  "generated_by": {json.dumps(table["generated_by"])},')
    lines.append('  "options": {')
    items = list(table["options"].items())
    for i, (name, entry) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        lines.append(f"    {json.dumps(name)}: {json.dumps(entry, sort_keys=True)}{comma}")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the table ('-': stdout)")
    args = parser.parse_args()
    text = dumps(build_table())
    if str(args.out) == "-":
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
