#!/usr/bin/env bash
# Fills $GPU_KIT (default .gpu; git-ignored: add "/.gpu/" to .git/info/exclude) with what a lent GPU
# machine lacks for benchmarks/gpu_check.sh: wheels for its Python 3.12 (it has torch, numpy, msgpack,
# scipy, pytest, pytest-xdist and transformers 5.17, none of these; transformers 5.24 comes too, the version
# this project's tests ran with here), SmolLM2's config and tokenizer (from the
# converted model, `triforce generate` fetches it once) and Emma. About 25 MB; the machine takes 64 MiB.
case "${1:-}" in -h|--help) sed -n '2,/^case /p' "$0" | sed '$d'; exit 0;; esac
set -euo pipefail
kit=${GPU_KIT:-.gpu}; home=${TRIFORCE_HOME:-$HOME/.cache/triforce}
mkdir -p "$kit/whl" "$kit/tok"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$kit/whl" \
  pyzmq==27.3.0 gguf==0.19.0 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 pydantic==2.14.4 \
  pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 \
  opentelemetry-api==1.45.2 openai==3.57.0 jiter==0.19.0 sniffio==1.3.1 httpx2==2.16.2 httpcore2==2.16.2 \
  truststore==0.10.5 idna==3.20 anyio==4.16.0 transformers==5.24.0
cp "$home/models/smollm2/"{config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja} "$kit/tok/"
cp "${AUSTEN:-../shared/data}/austen-emma.txt" "$kit/"
du -sh "$kit"
