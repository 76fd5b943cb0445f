"""Cross-lens check under the Sparse Readout Prism authors' protocol, with lens corpora of growing size (docs/reproduction.md).

Lens A: the embedded corpus (standard-library docstrings). Lens B: Python's language reference
(``pydoc_data.topics``, the text behind ``help("if")`` etc.): technical prose of another kind. Each lens corpus is
one window of ``--window`` tokens per document (first ``--skip`` positions excluded from the operator, as the authors
skip the first 16 of each fitting prompt). Each lens is the value operator pushed on the bank's own states only (the
engine's feature basis: n_bank tangents per layer instead of d_model, the same numbers), accumulated one window at a
time (cached on disk, A and B interleaved), so the lenses at 64 / 256 / 1,024 positions are prefixes of one run; after each size completes,
both definitions are evaluated on the package's prompt bank and written to ``--out``.

Run (from the repository root):
  OMP_NUM_THREADS=1 python docs/scripts/cross_lens_paper.py --out results/cross_lens_paper --cache results/cl_ops
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from tl_query_lens import load_model
from tl_query_lens.documents import one_window_per_document
from tl_query_lens.operators import value_operators
from tl_query_lens.readout.cross_lens_paper import (
    cross_lens_prompts,
    final_residuals,
    load_prompt_bank,
    mid_band_layers,
)

logger = logging.getLogger("cross_lens_paper")


def language_reference() -> list[str]:
    """The language-reference topics shipped with CPython (``pydoc_data.topics.topics``), one document each."""
    from pydoc_data.topics import topics

    return [topics[key] for key in sorted(topics)]


def readout_sae(model, max_seconds: float | None = None):
    """The cached ``cpu`` readout SAE, fitted (default preset) and cached first if absent. With ``max_seconds`` the
    fit is capped and cached under its own id (``cpu-<s>s``), never as the default dictionary."""
    from sae_lens import SAE

    from tl_query_lens import load_corpus
    from tl_query_lens.readout.fit import fit_readout
    from tl_query_lens.readout.registry import cached_sae_path

    sae_id = "cpu" if max_seconds is None else f"cpu-{int(max_seconds)}s"
    path = cached_sae_path("smollm2-135m", sae_id)
    if not (path / "cfg.json").exists():
        t0 = time.perf_counter()
        tokens = load_corpus("embedded", model, n_seqs=32, seq_len=32, split="train", seed=0)
        extra = {} if max_seconds is None else {"max_seconds": max_seconds}
        fit = fit_readout(model, tokens, **extra)  # the "cpu" preset is the default config
        fit.sae.save_model(path)
        logger.info(
            "readout SAE %s fitted in %.0f s (%s) and cached at %s",
            sae_id,
            time.perf_counter() - t0,
            json.dumps(fit.final),
            path,
        )
    return SAE.load_from_disk(str(path))


def readout_diagnostics(model, sae, out: Path) -> None:
    """Both readout-diagnostics protocols on the same dictionary and evaluation tokens (32 × 17, the CLI default)."""
    from tl_query_lens import load_corpus
    from tl_query_lens.readout import collect_states
    from tl_query_lens.readout.diagnostics_paper import readout_diagnostics_paper
    from tl_query_lens.readout.evaluate import evaluate_readout

    tokens = load_corpus("embedded", model, n_seqs=32, seq_len=17, split="evaluation", seed=0)
    t0 = time.perf_counter()
    final = collect_states(model, tokens, [f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"])
    paper = readout_diagnostics_paper(model, sae, final)
    paper.save(out / "readout_paper")
    t1 = time.perf_counter()
    own = evaluate_readout(model, sae, collect_states(model, tokens), baselines=[])
    own.save(out / "readout_mixed_layers")
    summary = {
        "paper": {k: v for k, v in vars(paper).items() if k != "config"},
        "paper_s": t1 - t0,
        "mixed_layers": {"srp": own.srp, "ablation": own.ablation},
        "mixed_layers_s": time.perf_counter() - t1,
    }
    (out / "readout_summary.json").write_text(json.dumps(summary, indent=1, default=str))
    logger.info("readout diagnostics: %s", json.dumps(summary, default=str)[:2000])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,4,16", help="lens corpus sizes in windows (x (window - skip) positions)")
    parser.add_argument("--window", type=int, default=80)
    parser.add_argument("--skip", type=int, default=16)
    parser.add_argument("--layers", default=None, help="mid band (default: mid_band_layers)")
    parser.add_argument("--cache", default="results/cl_ops")
    parser.add_argument(
        "--fit-max-seconds",
        type=float,
        default=None,
        help="cap the readout fit (cached as its own id); default: the full cpu preset",
    )
    parser.add_argument("--out", default="results/cross_lens_paper")
    parser.add_argument(
        "--no-readout-diagnostics",
        dest="readout_diagnostics",
        action="store_false",
        help="skip the readout diagnostics (both protocols) run first on the same dictionary",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    model = load_model("smollm2-135m", device="cpu")
    sae = readout_sae(model, args.fit_max_seconds)
    out = Path(args.out)
    if args.readout_diagnostics:
        readout_diagnostics(model, sae, out)
    layers = [int(x) for x in args.layers.split(",")] if args.layers else mid_band_layers(model.cfg.n_layers)
    hooks = [f"blocks.{layer}.hook_resid_post" for layer in layers]
    sizes = sorted(int(x) for x in args.sizes.split(","))
    corpora = {"docstrings": "embedded", "language_reference": language_reference()}
    windows = {
        name: one_window_per_document(
            src, model, n_seqs=sizes[-1], seq_len=args.window, split="train", random_start=False, seed=0
        )
        for name, src in corpora.items()
    }
    for name, w in windows.items():
        logger.info(
            "%s: %d windows of %d tokens from distinct documents (train split: %d documents, %d long enough)",
            name,
            w.tokens.shape[0],
            args.window,
            w.n_documents,
            w.n_eligible,
        )
    # The feature basis: only the bank's own states are pushed through each lens (M_l Hᵀ, n_bank tangents per layer
    # instead of d_model), which gives the check exactly what the full operators would (tests/test_cross_lens_paper.py).
    bank = load_prompt_bank()
    bank_run = final_residuals(model, [p["prompt"] for p in bank], hooks)  # states and next tokens, run once
    states = bank_run[0]
    sums: dict[str, dict[int, object]] = {name: {} for name in windows}
    summary = {}
    for i in range(sizes[-1]):
        for name, w in windows.items():
            t0 = time.perf_counter()
            for j, (layer, hook) in enumerate(zip(layers, hooks)):
                ops = value_operators(
                    model,
                    w.tokens[i : i + 1],
                    [hook],
                    skip_positions=args.skip,
                    cache_dir=Path(args.cache) / name,
                    progress=False,
                    basis=states[:, j],
                )
                sums[name][layer] = ops if layer not in sums[name] else sums[name][layer].merge(ops)
            logger.info(
                "%s window %d: %.0f s (positions so far: %d)",
                name,
                i,
                time.perf_counter() - t0,
                sums[name][layers[0]].count,
            )
        if i + 1 in sizes:
            positions = sums["docstrings"][layers[0]].count
            ops_a = {layer: sums["docstrings"][layer][hook] for layer, hook in zip(layers, hooks)}
            ops_b = {layer: sums["language_reference"][layer][hook] for layer, hook in zip(layers, hooks)}
            t0 = time.perf_counter()
            res = cross_lens_prompts(model, sae, ops_a, ops_b, bank, states=bank_run, layers=layers)
            res.save(out / f"positions_{positions}")
            keys = (
                "paper_agreement",
                "paper_agreement_ci",
                "control_agreement",
                "null_unrelated",
                "null_shuffled",
                "own_top1_agreement",
                "own_top1_tokens_differ",
                "model_top1_is_answer",
                "n_prompts",
                "n_controls",
                "layers",
                "per_group",
            )
            summary[positions] = {k: getattr(res, k) for k in keys} | {
                "positions_b": sums["language_reference"][layers[0]].count,
                "eval_s": time.perf_counter() - t0,
            }
            (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
            logger.info("positions %d: %s", positions, json.dumps(summary[positions], default=float))


if __name__ == "__main__":
    main()
