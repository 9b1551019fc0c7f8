# rewardq worker / producer image.
# torch is pinned through constraints.txt; to get the small CPU-only wheel, pass your
# PyTorch CPU wheel index:  docker compose build --build-arg TORCH_INDEX_URL=<index>
FROM python:3.11-slim
ARG TORCH_INDEX_URL=""
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY rewardq ./rewardq
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
      pip install --no-cache-dir -c constraints.txt torch --index-url "$TORCH_INDEX_URL"; fi \
 && pip install --no-cache-dir -c constraints.txt '.[worker]'
RUN useradd --create-home rewardq
USER rewardq
ENTRYPOINT ["rewardq"]
CMD ["worker"]
