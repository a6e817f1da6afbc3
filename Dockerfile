# mimo-jobs: one image for the cluster (pyxis/enroot, Apptainer) and for a one-node local run.
#
#   docker build -t mimo-jobs --build-arg MIMO_JOBS_GIT_SHA="$(git rev-parse HEAD)" .
#   docker run --rm -v "$PWD:/work" mimo-jobs mimo-jobs submit studies/cpu_local.yaml --executor local --wait
#
# The default base is an NGC PyTorch release: Python 3.12 (what megatron-core 0.19 needs), CUDA, NCCL, cuDNN and
# Transformer Engine built against its own torch 2.x (25.12: torch 2.10 pre-release build, TE 2.x).
# CI swaps BASE_IMAGE for a locally bootstrapped Debian+Python image (tests/container/build_image.sh).
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:25.12-py3

# ---------------------------------------------------------------- stage 1: the package wheel
# Python plus one optional C extension (ingest's log scanner): built where the base has a compiler (NGC does),
# else left out (ingest then takes its pure-Python path). The build backend (setuptools, fetched into pip's
# isolated build env) stays in this stage.
# The wheel is installed here too (this stage is thrown away) so its own metadata can name the requirements.
FROM ${BASE_IMAGE} AS wheel
WORKDIR /src
# README.md is pyproject's long description only; the wheel builds without it.
COPY pyproject.toml setup.py ./
COPY mimo_jobs ./mimo_jobs
# One list of dependencies (pyproject.toml): the wheel's metadata names the base + `train` requirements.
# torch is kept as the base image ships it when present (NGC: CUDA build, Transformer Engine compiled against
# it: `torch==<that version>`); only a base without torch gets a torch in train's range from the registry.
# NGC images export PIP_CONSTRAINT (pins of the base's own packages); the build backend must not be held to it.
# PIP_BREAK_SYSTEM_PACKAGES (here and for the installs below, not in the final environment): Debian bases mark
# the system Python externally managed; the image is the environment, so installing into it is the point.
ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN PIP_CONSTRAINT="" python3 -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist . \
 && python3 -m pip install --no-cache-dir --no-deps /dist/mimo_jobs-*.whl \
 && python3 -m mimo_jobs.image requirements --extra train --keep-installed torch > /dist/requirements.txt \
 && cat /dist/requirements.txt

# ---------------------------------------------------------------- stage 2: the image
FROM ${BASE_IMAGE}
ARG BASE_IMAGE
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Extra wheel locations for the build only (a site with a local wheelhouse bind-mounts it and names it here).
ARG PIP_FIND_LINKS

# Dependencies first, in their own layer: COPY keys the build cache on the requirement list's content, so a
# code change reuses this layer and a dependency change rebuilds it. (A RUN --mount=type=bind,from=... would
# not: buildah 1.28 keeps such a RUN cached when the mounted files change.) pip's cache is a build-time mount.
COPY --from=wheel /dist/requirements.txt /opt/mimo-jobs/requirements.txt
RUN --mount=type=cache,target=/root/.cache/pip \
    export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
 && python3 -m pip install --requirement /opt/mimo-jobs/requirements.txt

# The package itself: the wheel built above, kept in /opt/mimo-jobs/dist as the record of what is installed.
COPY --from=wheel /dist/mimo_jobs-*.whl /opt/mimo-jobs/dist/
RUN export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
 && python3 -m pip install --no-cache-dir --no-deps /opt/mimo-jobs/dist/mimo_jobs-*.whl \
 && python3 -c "import megatron.core, megatron.energon, einops, torch; print('torch', torch.__version__)" \
 && mimo-jobs --version

# Templates and studies next to the package (the package ships its own copy too): users copy and edit these.
COPY mimo_jobs/_templates /opt/mimo-jobs/templates
COPY mimo_jobs/_studies /opt/mimo-jobs/studies

# Provenance last, so a new commit only rebuilds this layer. The trainer's first log line and the store read
# it through mimo_jobs.image.image_provenance() (or $MIMO_JOBS_GIT_SHA directly).
ARG MIMO_JOBS_GIT_SHA=unknown
ARG IMAGE_NAME=mimo-jobs
RUN python3 -m mimo_jobs.image provenance --git-sha "${MIMO_JOBS_GIT_SHA}" --base-image "${BASE_IMAGE}" \
        --image "${IMAGE_NAME}" --out /opt/mimo-jobs/PROVENANCE.json
ENV MIMO_JOBS_GIT_SHA=${MIMO_JOBS_GIT_SHA} \
    MIMO_JOBS_PROVENANCE=/opt/mimo-jobs/PROVENANCE.json \
    PYTHONUNBUFFERED=1

# Local use: mount the working dir here; the DuckDB store (./mimo-jobs.duckdb) and runs/ land in it.
WORKDIR /work
CMD ["mimo-jobs", "--help"]
