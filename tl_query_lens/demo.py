"""``tlql demo``: every capability on the embedded model, one W&B run, one results folder, one HTML report."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from sae_lens import SAE

from tl_query_lens.atlas import AtlasConfig, build_atlas
from tl_query_lens.atlas.features import SHARES_TOP_K, module_shares
from tl_query_lens.certify.certify import certify
from tl_query_lens.certify.plots import bound_vs_n_figure
from tl_query_lens.config import resolve_config
from tl_query_lens.corpus import load_corpus
from tl_query_lens.demo_config import DemoConfig
from tl_query_lens.demo_progress import Progress, step_estimates
from tl_query_lens.dictionaries.ffkv import FFKV
from tl_query_lens.dictionaries.splice import ffkv_summary
from tl_query_lens.estimates import clock
from tl_query_lens.models import cache_dir, load_model
from tl_query_lens.query_lens.lens import QueryLens
from tl_query_lens.readout import cached_sae_path, decompose, feature_labels, fit_readout, top1_vs_competitor
from tl_query_lens.readout.registry import READOUT_RELEASES
from tl_query_lens.report.html import FeatureCard, Section, TokenList, build_report
from tl_query_lens.report.tokens import display_tokens, readable
from tl_query_lens.tracking import Tracker

logger = logging.getLogger(__name__)


@dataclass
class DemoOutputs:
    out: Path
    report: Path
    atlas: Path
    neuronpedia: Path
    wandb_dir: Path | None
    seconds: dict[str, float]


def _ffkv_step(model, cfg: DemoConfig, tracker: Tracker) -> Section:
    import plotly.graph_objects as go

    tokens = load_corpus(cfg.corpus, model, n_seqs=cfg.splice_seqs, seq_len=32, split="evaluation", seed=cfg.seed)
    summary = ffkv_summary(model, cfg.ffkv_layers, tokens, k=cfg.k, dense=False)
    summary.save(cfg.out / "ffkv")
    columns = ["layer", "alive_rate", "mean_l0", "explained_variance", "ce_delta_nats", "kl_nats"]
    rows = [
        [layer, m.alive_rate, m.mean_l0, m.explained_variance, m.ce_delta, m.kl] for layer, m in summary.sparse.items()
    ]
    tracker.log_table("ffkv_summary", columns, rows)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=[r[0] for r in rows], y=[r[3] for r in rows], name="explained variance"))
    fig.add_trace(go.Bar(x=[r[0] for r in rows], y=[r[4] for r in rows], name="CE change (nats)"))
    fig.update_layout(
        title=f"FF-KV TopK-{cfg.k} splice per layer", xaxis_title="layer", barmode="group", template="plotly_white"
    )
    tracker.log_plot("ffkv_per_layer", fig)
    return Section(
        f"FF-KV dictionaries (TopK-{cfg.k})",
        text=(
            f"Each MLP as a training-free dictionary; TopK-{cfg.k} spliced in without the error term on "
            f"{cfg.splice_seqs}×32 evaluation tokens."
        ),
        tables=[(columns, rows)],
        figures=[fig],
    )


def _query_lens_step(model, cfg: DemoConfig, tracker: Tracker) -> tuple[Section, Path]:

    tokens = load_corpus(cfg.corpus, model, n_seqs=cfg.operator_seqs, seq_len=cfg.seq_len, split="train", seed=cfg.seed)
    ffkv = FFKV.from_model(model, cfg.ql_layer)
    _, cache = model.run_with_cache(tokens, names_filter=[ffkv.cfg.metadata.hook_name])
    acts = ffkv.encode(cache[ffkv.cfg.metadata.hook_name]).abs().amax((0, 1))
    active = torch.nonzero(acts > acts.median()).flatten()
    gen = torch.Generator().manual_seed(cfg.seed)
    features = active[torch.randperm(active.numel(), generator=gen)[: cfg.n_features]].sort().values
    lens = QueryLens(model, tokens, cache_dir=cfg.operator_cache or cache_dir() / "operators")
    sigs = lens.signature_set(ffkv, features, k=SHARES_TOP_K)  # the Table-1 method set
    rows = []
    for name, sig in sigs.items():
        sig.save(cfg.out / "query_lens" / name)
        for row, feature in enumerate(sig.feature_ids.tolist()):
            rows.append([name, feature, " ".join(repr(s) for s in (sig.top_strings or [[]] * len(sig))[row][:10])])
    tracker.log_table("query_lens_signatures", ["signature", "feature", "top tokens"], rows)
    cards = []
    first_order = sigs["QL_VALUE_1st"]
    for row, feature in enumerate(features.tolist()):

        def lists(*names: str, row: int = row) -> list[TokenList]:
            return [
                TokenList(
                    n, display_tokens(model.tokenizer, sigs[n].top_ids[row].tolist()), sigs[n].top_scores[row].tolist()
                )
                for n in names
            ]

        top_shares = module_shares(first_order, row)
        cards.append(
            FeatureCard(
                f"layer {cfg.ql_layer} FF-KV feature {feature}",
                key_lists=lists("LL_KEY", "QL_KEY"),
                value_lists=lists("LL_VALUE", "QL_VALUE"),
                module_shares=top_shares,
                notes=f"per-module shares: first-order decomposition of the value scores summed over the top "
                f"{SHARES_TOP_K} value tokens, signed; over the direct term and every downstream module they sum to "
                f"1, so where modules pull opposite ways single shares exceed ±1 ({len(top_shares)} largest shown; "
                "an atlas built with signatures shows the same values)",
                link=f"atlas/index.html#f/{cfg.ql_layer}-ffkv/{feature}",
            )
        )
    atlas = demo_atlas(model, cfg, lens)
    np_path = Path(atlas.out) / "exports" / "neuronpedia"
    section = Section(
        f"Query Lens vs logit lens — layer {cfg.ql_layer} FF-KV features",
        text=(
            f"Operators from {cfg.operator_seqs}×{cfg.seq_len} corpus tokens. Key: what activates the feature "
            "(LL_KEY = E·k raw; QL_KEY through the corpus-mean Jacobian from the embeddings). Value: what it promotes "
            "(LL_VALUE = W_U·LN_f(v); QL_VALUE full through the value operator). Each card's title opens the "
            f"feature in the atlas (atlas/index.html: every feature of layer {cfg.ql_layer}'s FF-KV dictionary, "
            f"contexts from {cfg.atlas_tokens} corpus tokens, histograms and statistics); the atlas also holds the "
            "Neuronpedia and circuit-tracer exports."
        ),
        cards=cards,
    )
    return section, np_path


def demo_atlas(model, cfg: DemoConfig, lens: QueryLens | None = None):
    """The demo's atlas (``<out>/atlas``): every feature of the cards' dictionary, so that no link leads to a feature it
    lacks (the corpus pass costs the same for 8 or 1,536 features). Without signatures: for a dictionary wider than
    d_model they need the full d x d operators (d tangents instead of the cards' n_features; docs/atlas.md, "The demo
    report"); the cards carry the signatures and shares."""
    atlas_cfg = AtlasConfig(
        out=cfg.out / "atlas",
        corpus=cfg.corpus,
        seed=cfg.seed,
        n_tokens=cfg.atlas_tokens,
        signatures=False,
    )
    return build_atlas(model, [f"ffkv:{cfg.ql_layer}"], atlas_cfg, lens=lens)


def _readout_step(model, cfg: DemoConfig, tracker: Tracker) -> Section:
    import plotly.graph_objects as go

    release = READOUT_RELEASES.release_name(cfg.model)
    if cfg.readout_sae_id in READOUT_RELEASES.available_ids(cfg.model):
        sae = SAE.from_pretrained(release, cfg.readout_sae_id)
        where = "the user cache" if cfg.readout_sae_id in READOUT_RELEASES.cached_ids(cfg.model) else "the package"
        how = f"loaded from {where}: SAE.from_pretrained({release!r}, {cfg.readout_sae_id!r})"
    else:
        fit = fit_readout(model, corpus=cfg.corpus, **cfg.readout_overrides)
        if fit.history:
            tracker.log_table("readout_train_history", list(fit.history[0]), [list(r.values()) for r in fit.history])
        tracker.log_scalars("readout_fit", fit.final)
        sae = fit.sae
        sae_id = fit.cache_id(cfg.readout_sae_id)
        path = cached_sae_path(cfg.model, sae_id)
        sae.save_model(path)
        how = f"fitted in {fit.seconds:.0f} s ({cfg.readout_overrides or 'small preset'}) and cached at {path}"
        if not fit.complete:
            how = (
                f"PARTIAL FIT: stopped at step {int(fit.final['steps'])} of {fit.config.steps} by max_seconds, so it is "
                f"cached as {sae_id!r}, not {cfg.readout_sae_id!r}; its decomposition has a larger residual. " + how
            )
    tokens = load_corpus(cfg.corpus, model, n_seqs=1, seq_len=32, split="evaluation", seed=cfg.seed)
    hook = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    _, cache = model.run_with_cache(tokens, names_filter=[hook])
    h = model.ln_final(cache[hook][0, -1]).detach().float()
    alpha, top1, runner_up = top1_vs_competitor(h, model)
    dec = decompose(sae, h, alpha, model=model)
    dec.save(cfg.out / "readout_decomposition")
    top = dec.top(8)
    labels = feature_labels(sae, [f for f, _ in top], tokenizer=model.tokenizer)
    rest = float(dec.contributions.sum()) - sum(c for _, c in top)
    names = ["shared bias"] + [f"#{f} {labels.get(f, '')}"[:40] for f, _ in top] + ["other features", "residual"]
    values = [float(dec.bias)] + [c for _, c in top] + [rest, float(dec.residual)]
    fig = go.Figure(
        go.Waterfall(
            x=names + ["exact score"], y=values + [float(dec.exact)], measure=["relative"] * len(values) + ["total"]
        )
    )
    pair = f"{model.to_single_str_token(top1)!r} vs {model.to_single_str_token(runner_up)!r}"
    fig.update_layout(
        title=f"Readout decomposition of the logit margin {pair}",
        template="plotly_white",
        yaxis_title="score (logit units)",
    )
    tracker.log_plot("readout_waterfall", fig)
    tracker.log_scalars(
        "readout_decomposition",
        {
            "exact": float(dec.exact),
            "bias": float(dec.bias),
            "sum_contributions": float(dec.contributions.sum()),
            "residual": float(dec.residual),
        },
    )
    context = model.to_string(tokens[0, -12:])
    return Section(
        "Readout SAE — one worked decomposition",
        text=(
            f"Readout SAE {how}. Final-layer state after “…{readable(context)}”: the margin {pair} split exactly into the shared "
            f"bias, per-feature contributions and the residual (identity error "
            f"{abs(float(dec.bias + dec.contributions.sum() + dec.residual - dec.exact)):.2e})."
        ),
        figures=[fig],
    )


def _certify_step(model, cfg: DemoConfig, tracker: Tracker) -> Section:

    cal = load_corpus(cfg.corpus, model, n_seqs=cfg.n_cal, seq_len=32, split="calibration", seed=cfg.seed)
    ev = load_corpus(cfg.corpus, model, n_seqs=cfg.n_eval, seq_len=32, split="evaluation", seed=cfg.seed)
    sae = FFKV.from_model(model, cfg.cert_layer, "topk", k=cfg.k)
    cert = certify(model, sae, cal, ev, k=cfg.k)
    cert.save(cfg.out / "certificate")
    summary = cert.summary()
    tracker.log_scalars("certificate", summary)
    fig = bound_vs_n_figure({f"FF-KV TopK-{cfg.k} layer {cfg.cert_layer}": cert})
    tracker.log_plot("certificate_bound_vs_n", fig)
    columns = list(summary)
    return Section(
        f"Certificate — FF-KV TopK-{cfg.k} proxy at layer {cfg.cert_layer}",
        text=(
            f"Calibration {cfg.n_cal}, evaluation N = {cfg.n_eval} sequences of 32 tokens (disjoint splits). "
            f"Bound U = {cert.bound:.2f} bits vs log2|V| = {cert.baseline_bits:.2f}: "
            f"{'non-trivial' if cert.nontrivial else 'trivial'} at this N; N* = {cert.N_star:.0f} "
            f"({'observed' if cert.N_star_observed else 'extrapolated'}). Pool P = {cert.P} of m = {cert.m} features; "
            f"sequences leaving it (η̂ = {cert.eta_hat:.3f}) add Δ·η̂ = {cert.Delta * cert.eta_hat:.2f} bits to U "
            f"(a larger calibration split shrinks this term)."
        ),
        tables=[(columns, [[summary[c] for c in columns]])],
        figures=[fig],
    )


def run_demo(cfg: DemoConfig | None = None, **overrides: Any) -> DemoOutputs:
    """Run every step, write results under ``cfg.out``, log one W&B run, build ``report.html``.

    ``cfg`` / ``overrides``: a :class:`DemoConfig` (:meth:`DemoConfig.quick` for a first look); keyword overrides
    replace single fields."""
    cfg = resolve_config(DemoConfig, cfg, overrides)
    cfg.out = Path(cfg.out)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    model = load_model(cfg.model)
    seconds["load_model"] = time.perf_counter() - start
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    sections: list[Section] = []
    with Tracker(cfg.out, name="demo", config=config, use_wandb=cfg.use_wandb) as tracker:
        steps = [
            ("ffkv", _ffkv_step),
            ("query_lens", _query_lens_step),
            ("readout", _readout_step),
            ("certify", _certify_step),
        ]
        np_path = cfg.out / "atlas" / "exports" / "neuronpedia"
        # the estimates come from the first forward batch of the first step (its own batch, no extra one)
        progress = Progress([name for name, _ in steps], lambda rate: step_estimates(cfg, rate), start)
        with progress.on_forward(model):
            for index, (name, step) in enumerate(steps, 1):
                t0 = time.perf_counter()
                progress.begin(index, name)
                result = step(model, cfg, tracker)
                if isinstance(result, tuple):
                    result, np_path = result
                sections.append(result)  # type: ignore[arg-type]
                seconds[name] = time.perf_counter() - t0
                progress.end(name, seconds[name])
        logger.info("demo: %d steps done in %s", len(steps), clock(time.perf_counter() - start))
        seconds["total"] = time.perf_counter() - start
        timing = [[k, round(v, 1)] for k, v in seconds.items()]
        sections.append(Section("Timing", tables=[(["step", "seconds"], timing)]))
        report = build_report(
            cfg.out / "report.html",
            sections,
            title="tl_query_lens demo",
            subtitle=f"{model.cfg.model_name}, corpus '{cfg.corpus}', seed {cfg.seed}",
        )
        tracker.log_scalars("timing", seconds)
        tracker.log_artifact("demo-report", [report, np_path])
    wandb_dir = tracker.run_dir  # set once the tracker has finished (W&B is logged after the results)
    return DemoOutputs(
        out=cfg.out,
        report=report,
        atlas=cfg.out / "atlas" / "index.html",
        neuronpedia=np_path,
        wandb_dir=wandb_dir,
        seconds=seconds,
    )
