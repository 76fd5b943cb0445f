"""The Table-1 run shared by ``tlql ql-evaluate`` and ``tlql query-lens --evaluate``: configs built, dictionaries
loaded, :func:`~tl_query_lens.query_lens.table1.evaluate_table1` called, results saved and logged."""

from __future__ import annotations

import argparse
from typing import Any

from tl_query_lens.cli.configs import build
from tl_query_lens.config import RunConfig


def run_table1(
    args: argparse.Namespace,
    run_cfg: RunConfig,
    *,
    op_seqs: int,
    op_seq_len: int,
    n_prompts: int,
    ev_seqs: int | None,
    ev_seq_len: int | None,
) -> int:
    """Build the :class:`Table1Config` from the options, call :func:`evaluate_table1`, save and log; shared with
    ``tlql query-lens --evaluate`` (its corpus is the operator corpus; the evaluation corpus keeps 512 × 32)."""
    from pathlib import Path

    from tl_query_lens.checks import check_run
    from tl_query_lens.cli.common import load_model, load_tokens, tracker
    from tl_query_lens.errors import InputError
    from tl_query_lens.limits import check_limits, dims_of
    from tl_query_lens.query_lens import table1
    from tl_query_lens.query_lens.config import NEUTRAL_PROMPTS
    from tl_query_lens.ranges import parse_features, parse_layers
    from tl_query_lens.sources import load_sources, parse_sources

    if not 1 <= n_prompts <= len(NEUTRAL_PROMPTS):
        raise InputError(
            f"--n-prompts {n_prompts}: 1..{len(NEUTRAL_PROMPTS)} (only {len(NEUTRAL_PROMPTS)} neutral prompts exist)."
        )
    out = Path(run_cfg.out)
    cfg = build(
        table1.Table1Config,
        args,
        features=None,
        prompts=NEUTRAL_PROMPTS[:n_prompts],
        cache_dir=getattr(args, "cache_dir", None) or str(out / "operators"),
        # each dictionary's scores are kept as they finish: a stopped run resumes dictionary by dictionary
        checkpoint_dir=getattr(args, "checkpoint_dir", None) or str(out / "parts"),
    )
    folders = {
        "--cache-dir": getattr(args, "cache_dir", None),
        "--checkpoint-dir": getattr(args, "checkpoint_dir", None),
    }
    dims = check_run(run_cfg, folders=folders, op_seq_len=op_seq_len)
    sources = parse_sources(run_cfg.dictionary)
    parse_layers(run_cfg.layers, dims.n_layers if dims else None)
    n_eval = ev_seqs or run_cfg.n_seqs
    if n_eval < cfg.n_contexts:
        raise InputError(
            f"the evaluation corpus has {n_eval} sequences (--n-seqs) but --n-contexts is {cfg.n_contexts}: each "
            f"feature needs that many max-activating contexts. Raise --n-seqs to ≥ {cfg.n_contexts} or lower "
            "--n-contexts."
        )
    only_ffkv = all(s.kind == "ffkv" for s in sources)
    if run_cfg.features and only_ffkv:
        parse_features(run_cfg.features, dims.d_mlp if dims else None)
    limits = {
        "--k": (cfg.k, "d_vocab"),
        **({"--features-per-layer": (cfg.features_per_layer, "d_mlp")} if only_ffkv else {}),
    }
    check_limits(dims, limits, run_cfg.model)
    model = load_model(run_cfg)
    check_limits(dims_of(model), {"--k": (cfg.k, "d_vocab")}, run_cfg.model)
    loaded = load_sources(sources, model, parse_layers(run_cfg.layers, model.cfg.n_layers))
    saes: dict[int | str, Any] = {d.label: d.sae for d in loaded}
    d_sae = min(int(sae.cfg.d_sae) for sae in saes.values())
    if cfg.features_per_layer > d_sae:  # all of them would be used, silently
        raise InputError(
            f"--features-per-layer {cfg.features_per_layer} exceeds the {d_sae} features of the narrowest dictionary; "
            f"give at most {d_sae} (or --features 'all' for every one)."
        )
    if run_cfg.features:  # checked against every dictionary before any operator is computed
        cfg.features = tuple(parse_features(run_cfg.features, d_sae) or range(d_sae))
    op_tokens = load_tokens(run_cfg, model, "train", n_seqs=op_seqs, seq_len=op_seq_len)
    ev_tokens = load_tokens(run_cfg, model, "evaluation", n_seqs=ev_seqs, seq_len=ev_seq_len)
    result = table1.evaluate_table1(model, saes, op_tokens, ev_tokens, cfg=cfg)
    result.save(out / "all")
    groups = {d.group: [e.label for e in loaded if e.group == d.group] for d in loaded}
    summaries = {group: result.select(labels).summary(seed=run_cfg.seed) for group, labels in groups.items()}
    seconds = result.config["seconds"]
    with tracker(run_cfg, "ql-evaluate", args, table1=cfg) as track:
        columns = ["dictionary", *next(iter(summaries.values()))[0], "paper_input", "paper_output"]
        table = [
            [group, *r.values(), *table1.PAPER_GPT2.get(r["method"], (None, None))]
            for group, rows in summaries.items()
            for r in rows
        ]
        path = track.log_table("table1", columns, table)
        track.log_table("per_feature", *result.per_feature_table())
        track.log_scalars("timing", seconds)
        targets = list(enumerate(result.kl_targets))
        track.log_scalars(
            "steering",
            {f"mean_alpha@{t:g}": result.alphas[i].mean().item() for i, t in targets}
            | {f"mean_achieved_kl@{t:g}": result.achieved_kl[i].mean().item() for i, t in targets},
        )
        track.log_artifact("ql_eval", [out / "all"])
    print(f"Table 1 ({result.features.numel()} features of {list(saes)}): {path}")
    for group, rows in summaries.items():
        labels = groups[group]
        print(f"\n{group} ({rows[0]['n_features']} features of {len(labels)} dictionaries: {', '.join(labels)})")
        print(result.format_summary(rows, table1.PAPER_GPT2))
    print(f"total {seconds['total_s']:.0f} s (operators {seconds['operators_s']:.0f} s)")
    return 0
