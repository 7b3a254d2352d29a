# The worker image: vLLM's own image, plus the worker in a venv of its own, so the worker's
# dependencies never replace a package vLLM was built against. `vllm serve` stays the image's.
# The base tag must match VLLM_VERSION in src/vllm_worker/config/versions.py (checked by a test).
# BASE_IMAGE is for building without a registry: `make image` passes a CPU stand-in made from
# Debian's packages and PyPI (scripts/image/base.sh, docs/deploy.md). No `# syntax=` line: the
# built-in BuildKit frontend handles RUN --mount=type=secret, and the build needs no registry.
ARG BASE_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1

# The worker, from this project's source, into /opt/worker. tests/integration/test_worker_venv_install.py
# runs these exact commands on a fresh venv, so keep the install in this one RUN.
COPY pyproject.toml README.md /opt/worker-src/
COPY src /opt/worker-src/src
RUN python3 -m venv /opt/worker \
    && /opt/worker/bin/python -m pip install --no-cache-dir /opt/worker-src \
    && /opt/worker/bin/vllm-worker --help > /dev/null

# Optional baked model (docs/deploy.md). Empty MODEL_NAME: nothing is downloaded and the worker
# fetches MODEL_NAME at run time. A gated or private model needs the token as a build secret:
#   docker build --secret id=HF_TOKEN,env=HF_TOKEN --build-arg MODEL_NAME=org/name .
# It is mounted for this one step only and never stored in a layer. (hadolint's DL3064 reads
# "TOKEN" in TOKENIZER_* as a secret; those are repo ids or paths, hence the ignores.)
ARG MODEL_NAME=""
ARG MODEL_REVISION=""
# hadolint ignore=DL3064
ARG TOKENIZER_NAME=""
# hadolint ignore=DL3064
ARG TOKENIZER_REVISION=""
ARG QUANTIZATION=""
# A mirror of the Hub to download from (huggingface_hub's own variable), for this step only.
ARG HF_ENDPOINT=https://huggingface.co
COPY builder /opt/builder
RUN --mount=type=secret,id=HF_TOKEN \
    HF_HOME=/tmp/hf-build /opt/worker/bin/python /opt/builder/download_model.py \
        --model-dir /opt/models/model \
        --tokenizer-dir /opt/models/tokenizer \
        --record /opt/baked-model.json \
        --token-file /run/secrets/HF_TOKEN \
    && rm -rf /tmp/hf-build

# What the worker reads at run time; each is empty when nothing was baked, and the worker treats
# an empty variable as unset. BAKED_MODEL_PATH makes the worker serve the local copy under the
# name MODEL_NAME and skip the Hub pre-flight; HF_HUB_OFFLINE keeps vLLM off the Hub as well;
# TOKENIZER_NAME points vLLM at the baked tokenizer. /opt/baked-model.json records the repos
# and the commits they resolved to.
# hadolint ignore=DL3064
ENV BAKED_MODEL_PATH=${MODEL_NAME:+/opt/models/model} \
    MODEL_NAME=${MODEL_NAME} \
    TOKENIZER_NAME=${TOKENIZER_NAME:+/opt/models/tokenizer} \
    QUANTIZATION=${QUANTIZATION} \
    HF_HUB_OFFLINE=${MODEL_NAME:+1}

# Models fetched at run time go to the network volume when one is attached, so a cold start
# on another worker finds them already downloaded. The hub cache is where Runpod's model
# caching puts models and where Runpod's official vLLM worker downloads them, so a volume
# shared with it, or a cached model, is served without a download (src/vllm_worker/model/cache.py).
# Without a volume the first download creates BASE_PATH on the container's own disk: the worker
# tells a volume by its mount point, and keeps the count of fresh workers and the compile caches
# only on one. So the image declares no VOLUME and makes nothing at BASE_PATH (a VOLUME would be
# an anonymous Docker volume, a mount point that dies with the container).
ARG BASE_PATH=/runpod-volume
ENV BASE_PATH=${BASE_PATH} \
    HF_HOME=${BASE_PATH}/huggingface-cache \
    HF_HUB_CACHE=${BASE_PATH}/huggingface-cache/hub

# The vllm-openai image's own ENTRYPOINT is `vllm serve`; the worker starts that itself.
ENTRYPOINT ["/opt/worker/bin/vllm-worker", "run"]
