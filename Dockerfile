# rewardq worker / producer image.
# torch is pinned through constraints.txt and comes from PyTorch's CPU wheel index (the package
# registry's Linux torch is the CUDA build, ~5.5 GB); another index (a mirror, or a CUDA build):
#   docker compose build --build-arg TORCH_INDEX_URL=<index>   (empty: the registry's torch)
#
# The worker runs as root INSIDE the container, with only the capabilities docker-compose.yml
# grants (SYS_ADMIN, SETUID, SETGID, CHOWN, KILL, DAC_OVERRIDE): the local code sandbox needs
# them to give every model-written program its own namespaces, uid and cgroup
# (docs/code-execution.md). The programs themselves run as unprivileged uids with none.
FROM python:3.11-slim
ARG TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu"
# unshare (util-linux) and libseccomp2 are the local code sandbox's; both are in the base image
# today, installed here so that stays true
RUN apt-get update \
 && apt-get install -y --no-install-recommends util-linux libseccomp2 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY rewardq ./rewardq
COPY docker/entrypoint.sh /usr/local/bin/rewardq-entrypoint
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
      pip install --no-cache-dir -c constraints.txt torch --index-url "$TORCH_INDEX_URL"; fi \
 && pip install --no-cache-dir -c constraints.txt '.[worker]'
ENTRYPOINT ["rewardq-entrypoint"]
CMD ["worker"]
