"""``tlql ql-channels``: subspace channels of FF-KV value features of source layer(s), logged to W&B."""

from __future__ import annotations

import argparse

from tl_query_lens.cli.configs import build
from tl_query_lens.cli.options import add_options
from tl_query_lens.cli.subcommand import command
from tl_query_lens.config import RunConfig

RUN = {"out": "results/ql_channels", "layers": "18", "n_seqs": 2, "seq_len": 32}
ALIASES = {"layers": "--sources", "n_seqs": "--op-seqs", "seq_len": "--op-seq-len"}  # the names the command had


def add_parser(subparsers) -> None:
    command(subparsers, "ql-channels", help="subspace channels: low-rank fits of module responses", configure=configure)


def configure(parser: argparse.ArgumentParser) -> None:
    from tl_query_lens.query_lens.config import SubspaceChannelsConfig

    taken = add_options(parser, RunConfig, skip=("features", "dictionary"), defaults=RUN, aliases=ALIASES)
    # its seed (the fits') keeps its default
    add_options(parser, SubspaceChannelsConfig, taken=taken, shown={"cache_dir": "<--out>/operators"})
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    import plotly.graph_objects as go

    from tl_query_lens.checks import check_run
    from tl_query_lens.cli.common import load_model, load_tokens, tracker
    from tl_query_lens.dictionaries.ffkv import FFKV
    from tl_query_lens.query_lens.channels import subspace_channels
    from tl_query_lens.query_lens.config import SubspaceChannelsConfig
    from tl_query_lens.ranges import parse_layers

    start = time.time()
    run_cfg = build(RunConfig, args)
    out = Path(run_cfg.out)
    cfg = build(SubspaceChannelsConfig, args, exclude=("seed",), cache_dir=args.cache_dir or str(out / "operators"))
    dims = check_run(run_cfg, folders={"--cache-dir": args.cache_dir})
    n_layers = dims.n_layers if dims else None
    parse_layers(run_cfg.layers, n_layers, "--sources")
    parse_layers(",".join(map(str, cfg.operator_layers or ())) or "all", n_layers, "--operator-layers")
    if n_layers is not None:
        check_destinations(parse_layers(run_cfg.layers, n_layers, "--sources"), n_layers, cfg)
    model = load_model(run_cfg)
    sources = parse_layers(run_cfg.layers, model.cfg.n_layers, "--sources")
    parse_layers(",".join(map(str, cfg.operator_layers or ())) or "all", model.cfg.n_layers, "--operator-layers")
    check_destinations(sources, model.cfg.n_layers, cfg)
    tokens = load_tokens(run_cfg, model, "train")
    result = subspace_channels(model, {layer: FFKV.from_model(model, layer) for layer in sources}, tokens, cfg=cfg)
    result.save(out / "channels")
    elapsed = time.time() - start
    columns = ["channel", "fit", "mse", "rel_l2", "cosine", "explained_energy", "train_mse"]
    with tracker(run_cfg, "ql-channels", args, channels=cfg) as track:
        for fit, summary in result.summary.items():
            track.log_scalars(f"summary_{fit}", summary)
            heatmap = go.Heatmap(
                z=result.overlaps[fit], x=result.channels, y=result.channels, colorscale="Viridis", zmin=0, zmax=1
            )
            figure = go.Figure(heatmap).update_layout(title=f"Channel overlap OL ({fit}, rank {result.rank})")
            track.log_plot(f"overlap_{fit}", figure)
        rows = [
            [name, fit, *(m[name][c] for c in columns[2:])]
            for fit, m in result.metrics.items()
            for name in result.channels
        ]
        track.log_table("channel_metrics", columns, rows)
        track.log_scalars("timing", {"total_s": elapsed})
        track.log_artifact("ql_channels", [out / "channels"])
    print(f"{len(result.channels)} channels of source layer(s) {sources}, rank {result.rank}, {elapsed:.0f} s")
    for fit, s in result.summary.items():
        means = {c: sum(result.metrics[fit][n][c] for n in result.channels) / len(result.channels) for c in columns[2:]}
        print(
            f"  {fit}: OL same {s['ol_same']:.3f} ({s['n_same']} pairs) vs different {s['ol_different']:.3f} "
            f"({s['n_different']}), AUC {s['auc']:.3f}, p {s['p_value']:.2g}, random {s['ol_random']:.3f}; "
            f"held-out " + ", ".join(f"{c} {v:.4g}" for c, v in means.items())
        )
    return 0


def check_destinations(sources: list[int], n_layers: int, cfg) -> None:
    """The channels of ``sources`` need blocks after them, and for ``--destination layer`` at least two destination
    layers (the overlap of same- and different-destination pairs is compared)."""
    from tl_query_lens.errors import InputError

    allowed = set(cfg.operator_layers) if cfg.operator_layers else set(range(n_layers))
    blocks = {b for s in sources for b in range(s + 1, n_layers)} & allowed
    if not blocks:
        raise InputError(
            f"--sources {','.join(map(str, sources))}: no block after them (among --operator-layers) receives their "
            f"channels; the model has layers 0..{n_layers - 1}, so choose earlier source layers."
        )
    shown = ",".join(map(str, sources))
    if cfg.destination == "layer" and len(blocks) == 1:
        raise InputError(
            f"--sources {shown} send their channels to block {min(blocks)} only, so --destination layer has no "
            f"different-destination pairs to compare; choose source layers before {min(blocks) - 1}."
        )
    shared = [b for b in blocks if sum(s < b for s in sources) >= 2]
    if cfg.destination == "module" and not shared:
        raise InputError(
            f"--destination module compares channels of different source layers into one module, but --sources "
            f"{shown} share no block after them; give at least two source layers before the last block (e.g. "
            "--sources 6,12) or use --destination layer."
        )
