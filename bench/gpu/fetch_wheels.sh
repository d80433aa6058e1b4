#!/usr/bin/env bash
# Run HERE (not on the GPU machine) before a device session: fills .whl/ (git-ignored) with the
# cp312 manylinux wheels of Headrace's pins that the GPU machine lacks (it has Python 3.12 and a
# CUDA torch, not the web stack, msgspec or pyzmq), and .whl/site/ with llguidance copied from
# .venv (an abi3 build; the registry here serves older ones only). transformers stays behind to
# keep the tree under the 64 MiB that travels (~50 MiB with this): the CUDA test legs that need
# it run only where the machine has it. Then: run(command="bash bench/gpu/run.sh",
# carry=[".whl"], timeout_s=560).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl/site
.venv/bin/python - >.whl/pins.txt <<'PY'
import re
text = open("pyproject.toml").read()
deps = re.search(r"dependencies = \[(.*?)\]", text, re.S).group(1)
skip = ("torch", "gemma3", "matplotlib", "llguidance")
pins = [d for d in re.findall(r'"([^"]+)"', deps) if not d.startswith(skip)]
print("\n".join(pins + ["pytest==9.2.0", "pytest-timeout==2.4.0", "jsonschema==4.26.0"]))
PY
.venv/bin/pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64 -d .whl -r .whl/pins.txt
rm -rf .whl/site/llguidance
cp -r .venv/lib/python3.11/site-packages/llguidance .whl/site/
du -sh .whl
