"""``tlql saes``: train the SAE/transcoder suite (``train``), measure its quality (``report``), and run the FF-KV
paper's comparison (``compare``)."""

from __future__ import annotations

import argparse
import logging

from tl_query_lens.cli import add_common_args, parse_layers

logger = logging.getLogger(__name__)

RELEASE = "tlql-saes-smollm2-135m"


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("saes", help="trained SAEs / transcoders of the model and their comparison")
    commands = parser.add_subparsers(dest="saes_command", metavar="SAES_COMMAND")
    compare = commands.add_parser(
        "compare", help="FF-KV (vanilla / TopK / normalized) vs SAE vs transcoder vs a random model, one table"
    )
    add_common_args(compare, out="results/saes_compare")
    compare.add_argument("--layers", default="6,12,18,24", help="e.g. '6,12' or '0-29' or 'all'")
    compare.add_argument(
        "--release",
        default=RELEASE,
        help="SAELens release whose SAEs / transcoders at --layers join the table ('' for none)",
    )
    compare.add_argument(
        "--dictionaries", default="", help="extra comma-separated 'release:sae_id' or folders saved with save_model"
    )
    compare.add_argument(
        "--k",
        type=int,
        default=None,
        help="TopK FF-KV size (default: the k of the layer's TopK SAE when loaded, else 32)",
    )
    compare.add_argument("--n-seqs", type=int, default=32)
    compare.add_argument("--seq-len", type=int, default=64)
    compare.add_argument("--n-words", type=int, default=2000, help="first-letter words (absorption)")
    compare.add_argument("--icl", type=int, default=10, help="in-context examples per first-letter prompt")
    compare.add_argument("--no-absorption", dest="absorption", action="store_false")
    compare.add_argument("--no-random-control", dest="random_control", action="store_false")
    compare.set_defaults(func=run_compare)

    train = commands.add_parser("train", help="train (or resume) the suite into the user cache")
    train.add_argument("--model", default="smollm2-135m")
    train.add_argument("--layers", default="6,12,18,24", help="e.g. '12' or '6,12,18,24'")
    train.add_argument("--kinds", default="sae,transcoder", help="'sae', 'transcoder' or both")
    train.add_argument("--d-sae", type=int, default=4608)
    train.add_argument("--k", type=int, default=32)
    train.add_argument("--corpus", default="stdlib")
    train.add_argument(
        "--n-seqs", type=int, default=None, help="training sequences cached (0: the whole split; default 2048)"
    )
    train.add_argument("--seq-len", type=int, default=128)
    train.add_argument("--training-tokens", type=int, default=2_000_000, help="activations per dictionary")
    train.add_argument("--batch-size", type=int, default=1024)
    train.add_argument("--lr", type=float, default=5e-4)
    train.add_argument("--n-checkpoints", type=int, default=20)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--device", default="cpu")
    train.add_argument("--restart", action="store_true", help="start again (earlier checkpoints are set aside)")
    train.set_defaults(func=run_train)

    report = commands.add_parser("report", help="quality of each trained dictionary on the evaluation split")
    report.add_argument("--model", default="smollm2-135m")
    report.add_argument("--ids", default="all", help="comma-separated dictionary ids, or 'all' of the release")
    report.add_argument("--corpus", default="stdlib")
    report.add_argument("--n-seqs", type=int, default=64)
    report.add_argument("--seq-len", type=int, default=128)
    report.add_argument("--seed", type=int, default=0)
    report.add_argument("--device", default="cpu")
    report.add_argument("--out", default="results/saes_report")
    report.add_argument("--no-wandb", dest="wandb", action="store_false")
    report.add_argument("--wandb-project", default="tl_query_lens")
    report.set_defaults(func=run_report)

    parser.set_defaults(func=lambda args: parser.print_help() or 0)


def load_trained(spec: str, release: str, layers: list[int], device: str) -> tuple[dict, list[str]]:
    """``{label: SAE}`` from a release (every id at ``layers``) and extra specs; plus what could not be loaded."""
    from pathlib import Path

    from sae_lens import SAE
    from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory

    from tl_query_lens.dictionaries.compare import dictionary_kind
    from tl_query_lens.hooks import hook_layer

    items: list[tuple[str, str | None]] = []
    missing: list[str] = []
    if release:
        lookup = get_pretrained_saes_directory().get(release)
        if lookup is None:
            missing.append(f"release {release!r} is not registered (train it with `tlql saes train`)")
        else:
            items += [(release, sae_id) for sae_id in lookup.saes_map]
    for item in filter(None, (s.strip() for s in spec.split(","))):
        if Path(item).is_dir():
            items.append((item, None))
        elif ":" in item:
            items.append(tuple(item.split(":", 1)))  # type: ignore[arg-type]
        else:
            raise SystemExit(f"tlql saes compare: {item!r} is neither a folder nor 'release:sae_id'.")
    saes = {}
    for source, sae_id in items:
        try:
            sae = (
                SAE.load_from_disk(source, device=device)
                if sae_id is None
                else SAE.from_pretrained(source, sae_id, device=device)
            )
        except (FileNotFoundError, OSError, ValueError, KeyError) as err:
            missing.append(f"{source}:{sae_id}: {err}")
            continue
        layer = hook_layer(sae.cfg.metadata.hook_name)
        if layer in layers:
            name = "transcoder" if dictionary_kind(sae) == "transcoder" else "SAE"
            saes[f"{name} L{layer} {sae_id or Path(source).name}"] = sae
    return saes, missing


def run_compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tl_query_lens import FFKV, load_corpus, load_model
    from tl_query_lens.dictionaries.absorption import AbsorptionConfig
    from tl_query_lens.dictionaries.compare import CompareConfig, DictionaryComparison, compare_dictionaries
    from tl_query_lens.tracking import Tracker

    model = load_model(args.model, device=args.device)
    layers = parse_layers(args.layers, model.cfg.n_layers)
    tokens = load_corpus(
        args.corpus, model, n_seqs=args.n_seqs, seq_len=args.seq_len, split="evaluation", seed=args.seed
    )
    trained, missing = load_trained(args.dictionaries, args.release, layers, str(model.cfg.device))
    for line in missing:
        logger.warning("Not in the table: %s", line)
    dictionaries = {}
    for layer in layers:
        k = args.k or next(
            (
                int(s.cfg.k)
                for label, s in trained.items()
                if label.startswith(f"SAE L{layer} ") and getattr(s.cfg, "k", None)
            ),
            32,
        )
        dictionaries[f"FF-KV vanilla L{layer}"] = FFKV.from_model(model, layer, "vanilla")
        dictionaries[f"FF-KV TopK-{k} L{layer}"] = FFKV.from_model(model, layer, "topk", k)
        dictionaries[f"FF-KV normalized L{layer}"] = FFKV.from_model(model, layer, "normalized")
        dictionaries.update({label: s for label, s in trained.items() if f" L{layer} " in label + " "})
    cfg = CompareConfig(
        absorption=AbsorptionConfig(n_words=args.n_words, n_icl_examples=args.icl, seed=args.seed)
        if args.absorption
        else None,
        random_control=args.random_control,
        seed=args.seed,
    )
    result = compare_dictionaries(model, dictionaries, tokens, cfg=cfg)
    out = Path(args.out)
    result.save(out)
    config = {k: v for k, v in vars(args).items() if k != "func"} | {"not_loaded": missing}
    with Tracker(out, project=args.wandb_project, name="saes-compare", config=config, use_wandb=args.wandb) as tracker:
        table = tracker.log_table("comparison", list(DictionaryComparison.COLUMNS), result.table())
        faith = tracker.log_table(
            "faithfulness", list(DictionaryComparison.FAITHFULNESS_COLUMNS), result.faithfulness_table()
        )
        tracker.log_scalars("times", result.times)
    print(f"comparison: {table}\nfaithfulness: {faith}")
    for row in result.table():
        print(
            "  "
            + ", ".join(
                f"{c}={v:.4g}" if isinstance(v, float) else f"{c}={v}"
                for c, v in zip(DictionaryComparison.COLUMNS, row)
            )
        )
    return 0


def run_train(args: argparse.Namespace) -> int:
    from tl_query_lens import load_model
    from tl_query_lens.cli import parse_layers
    from tl_query_lens.saes.train import SAESuiteConfig, train_saes

    model = load_model(args.model, device=args.device)
    layers = parse_layers(args.layers, model.cfg.n_layers)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    cfg = SAESuiteConfig(
        model=args.model,
        layers=tuple(layers),
        kinds=kinds,
        d_sae=args.d_sae,
        k=args.k,
        corpus=args.corpus,
        n_seqs=SAESuiteConfig.n_seqs if args.n_seqs is None else (args.n_seqs or None),
        seq_len=args.seq_len,
        training_tokens=args.training_tokens,
        batch_size_tokens=args.batch_size,
        lr=args.lr,
        n_checkpoints=args.n_checkpoints,
        seed=args.seed,
    )
    result = train_saes(model, cfg, resume=not args.restart)
    print(
        f"{result.release}: {len(result.sae_ids)} dictionaries, {result.training_tokens_seen} tokens each "
        f"({result.epochs:.1f} epochs over {result.n_cached_tokens} cached tokens) in {result.folder}; "
        f"activation pass {result.seconds_activations:.0f} s, training {result.seconds_training:.0f} s"
    )
    return 0


def run_report(args: argparse.Namespace) -> int:
    from tl_query_lens.saes.report import SAEReportConfig, report_cli

    cfg = SAEReportConfig(corpus=args.corpus, n_seqs=args.n_seqs, seq_len=args.seq_len, seed=args.seed)
    return report_cli(args, cfg)
