#!/usr/bin/env bash
# `make image`: build the worker's image here, on the CPU stand-in for vLLM's image.
#
#   scripts/image/build.sh [docker build options...]
#
# 1. a Docker engine: the one at DOCKER_HOST when it answers, otherwise this project's own
#    (scripts/image/engine.sh: started when not running, and left running);
# 2. the base: BASE_IMAGE when set, otherwise scripts/image/base.sh (built once, then cached);
# 3. the worker image from the Dockerfile, FROM that base, tagged IMAGE (default vllm-worker:local).
#    Options are passed to `docker build` (e.g. --build-arg MODEL_NAME=org/name --secret id=HF_TOKEN,env=HF_TOKEN).
# The last line says the image and the DOCKER_HOST to run it with.
set -euo pipefail
cd "$(dirname "$0")/../.."

IMAGE="${IMAGE:-vllm-worker:local}"
DOCKER=/usr/bin/docker  # Debian's client: builds with BuildKit without the buildx plugin

engine="$(bash scripts/image/engine.sh start | tail -n 1)"
export "${engine?}"  # DOCKER_HOST=...
# BASE_IMAGE: another base already in the engine (vllm/vllm-openai:v0.32.0 where a registry is
# reachable and pulled, or a variant of the stand-in); otherwise the stand-in, built once.
base="${BASE_IMAGE:-$(bash scripts/image/base.sh | tail -n 1)}"

began=$SECONDS
printf 'image: building %s on %s\n' "$IMAGE" "$base" >&2
# --network host: the engine runs without a bridge; the worker's install reaches PyPI from the host's network.
DOCKER_BUILDKIT=1 "$DOCKER" build --network host --progress plain \
    --build-arg BASE_IMAGE="$base" --tag "$IMAGE" "$@" . >&2
printf 'image: built %s in %d s\n' "$IMAGE" "$((SECONDS - began))" >&2
# The engine's data root outlives the run: drop what no tag needs any more (earlier builds of the
# worker image, bases of earlier recipes), so the cache does not grow with every build.
if [[ -z "${BASE_IMAGE:-}" ]]; then
    "$DOCKER" image ls --format '{{.Repository}}:{{.Tag}}' vllm-worker-base | grep -E ':[0-9a-f]{16}$' | grep -vxF "$base" \
        | xargs -r "$DOCKER" rmi >/dev/null 2>&1 || true
fi
"$DOCKER" image prune -f >/dev/null 2>&1 || true
# --shm-size: Docker's default /dev/shm (64 MiB) is too small for vLLM's engine.
printf 'image %s is ready; run it with: DOCKER_HOST=%s docker run --rm --network host --shm-size 1g %s\n' \
    "$IMAGE" "$DOCKER_HOST" "$IMAGE"
