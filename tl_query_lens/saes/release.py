"""Pack trained dictionaries into the package's release and measure that the packed ones match their sources.

``pack_release`` writes each dictionary of a cached release (the suite's SAEs / transcoders, a readout SAE) into
``tl_query_lens/release/<release>/<sae_id>`` with int8 per-feature weights (:func:`tl_query_lens.releases.quantise_state`)
and a sha256 manifest. ``release_fidelity`` loads both versions and compares them on the same evaluation tokens:
CE recovered of each (through :func:`tl_query_lens.saes.report.suite_quality`) and how often the packed dictionary
keeps the same active features.

Run as ``python -m tl_query_lens.saes.release --model smollm2-135m`` after ``tlql saes train`` and ``tlql readout fit``;
``--add blocks.28.hook_resid_post`` packs one more trained dictionary into the shipped release without touching the
files already there (:func:`add_to_release`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from sae_lens import SAE
from sae_lens.loading.pretrained_sae_loaders import handle_config_defaulting
from sae_lens.registry import get_sae_class

from tl_query_lens.corpus import load_corpus
from tl_query_lens.models import load_model
from tl_query_lens.paths import shipped_root
from tl_query_lens.readout.registry import READOUT_RELEASES
from tl_query_lens.readout.sae import CODE_KEYS, ReadoutSAE, check_compatible, unembedding_rows
from tl_query_lens.releases import MANIFEST, LocalReleases, read_shipped, write_manifest, write_shipped
from tl_query_lens.results import SavableResult
from tl_query_lens.saes.registry import SAES_RELEASES
from tl_query_lens.saes.report import suite_quality

MAX_RELEASE_BYTES = 56_000_000
MAX_FILE_BYTES = 25_000_000


def pack_release(family: LocalReleases, model_name: str, sae_ids: list[str], *, source: dict[str, Any]) -> Path:
    """Pack ``sae_ids`` of ``family``'s cached release for ``model_name`` into the package; returns the folder.

    Partial dictionaries (ids ending in ``.partial``) are refused. The folder is rebuilt from scratch (staging
    folder, then one rename) and its manifest records every file's sha256 plus ``source`` (what was packed).
    A readout SAE is packed without its row codes (recomputed from the model on first use, see
    :mod:`tl_query_lens.readout.sae`).
    """
    drop = CODE_KEYS if family is READOUT_RELEASES else frozenset()
    partial = [sid for sid in sae_ids if sid.endswith(".partial")]
    if partial:
        raise ValueError(f"Refusing to ship unfinished dictionaries {partial}; finish their training first.")
    target = family.shipped_dir(model_name)
    staging = target.with_name(target.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    for sid in sae_ids:
        write_shipped(family.cached_path(model_name, sid), staging, sid, drop=drop)
    write_manifest(staging, {"release": family.release_name(model_name), "format": "int8-per-feature", **source})
    sizes = {p: p.stat().st_size for p in staging.rglob("*") if p.is_file()}
    big = [f"{p.name} ({n / 1e6:.1f} MB)" for p, n in sizes.items() if n > MAX_FILE_BYTES]
    if big:
        raise ValueError(f"Release files over {MAX_FILE_BYTES / 1e6:.0f} MB: {big}.")
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return target


def add_to_release(family: LocalReleases, model_name: str, sae_id: str, *, source: dict[str, Any]) -> Path:
    """Pack one more cached dictionary into ``family``'s existing shipped release, leaving every file already
    there byte for byte as it is; returns the release folder.

    The new id is packed into a staging folder and moved in; the manifest is rewritten with the files' sha256 (those
    already shipped keep theirs, checked before and after) and ``source`` under ``"added"[sae_id]``. Refused: a
    partial id, an id already shipped, a release not packed yet (:func:`pack_release` first), a file over
    :data:`MAX_FILE_BYTES`.
    """
    if sae_id.endswith(".partial"):
        raise ValueError(f"Refusing to ship the unfinished dictionary {sae_id!r}; finish its training first.")
    target = family.shipped_dir(model_name)
    manifest_path = target / MANIFEST
    if not manifest_path.is_file():
        raise ValueError(f"No packed release at {target}; pack one first (pack_release).")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if (target / sae_id).exists() or any(name.split("/", 1)[0] == sae_id for name in manifest["files"]):
        raise ValueError(f"{sae_id!r} is already in {target}; pack the whole release again to replace it.")
    staging = target.with_name(target.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    folder = write_shipped(family.cached_path(model_name, sae_id), staging, sae_id)
    big = [
        f"{p.name} ({p.stat().st_size / 1e6:.1f} MB)" for p in folder.rglob("*") if p.stat().st_size > MAX_FILE_BYTES
    ]
    if big:
        shutil.rmtree(staging)
        raise ValueError(f"Release files over {MAX_FILE_BYTES / 1e6:.0f} MB: {big}.")
    folder.rename(target / sae_id)
    shutil.rmtree(staging)
    extra = {k: v for k, v in manifest.items() if k != "files"}
    extra["added"] = {**extra.get("added", {}), sae_id: source}
    written = write_manifest(target, extra)
    changed = [name for name, entry in manifest["files"].items() if written["files"].get(name) != entry]
    if changed:  # cannot happen unless a shipped file was edited in place: say so rather than ship it
        raise RuntimeError(f"Shipped files changed while adding {sae_id!r}: {changed}; restore them from git.")
    return target


def release_bytes() -> int:
    """Bytes of everything under ``tl_query_lens/release``."""
    return sum(p.stat().st_size for p in shipped_root().rglob("*") if p.is_file())


@dataclass
class ReleaseFidelity(SavableResult):
    """Packed vs source dictionaries on the same tokens.

    Attributes:
        rows: one per dictionary: ``ce_recovered`` of the source and the packed one and their difference,
            ``support_identical`` (share of tokens whose whole set of active features is the same),
            ``support_overlap`` (mean |S ∩ S'| / max(|S|, |S'|)), ``max_rel_weight_error`` (largest relative
            Frobenius error of a weight matrix), and the packed file size.
        n_tokens: evaluation tokens (per dictionary).
    """

    rows: list[dict[str, Any]]
    n_tokens: int
    seconds: float
    config: dict[str, Any] = field(default_factory=dict)


@torch.no_grad()
def support_agreement(a: SAE, b: SAE, x: torch.Tensor) -> tuple[float, float]:
    """(share of rows with identical active sets, mean |S ∩ S'| / max(|S|, |S'|)) of ``a`` and ``b`` on ``x``."""
    sa, sb = a.encode(x) != 0, b.encode(x) != 0
    sa, sb = sa.reshape(-1, sa.shape[-1]), sb.reshape(-1, sb.shape[-1])
    identical = (sa == sb).all(-1).float().mean().item()
    inter = (sa & sb).sum(-1).float()
    denom = torch.maximum(sa.sum(-1), sb.sum(-1)).clamp_min(1).float()
    return identical, (inter / denom).mean().item()


def release_fidelity(
    model, sources: dict[str, SAE], packed: dict[str, SAE], tokens: torch.Tensor, *, exclude_first_positions: int = 1
) -> ReleaseFidelity:
    """Compare each packed dictionary with its source on ``tokens`` (evaluation split)."""
    start = time.perf_counter()
    q_src = suite_quality(model, sources, tokens, exclude_first_positions=exclude_first_positions)
    q_pack = suite_quality(model, packed, tokens, exclude_first_positions=exclude_first_positions)
    hooks = sorted({sae.cfg.metadata.hook_name for sae in sources.values()})
    _, cache = model.run_with_cache(tokens, names_filter=hooks)
    rows = []
    for sid, src in sources.items():
        x = cache[src.cfg.metadata.hook_name][:, exclude_first_positions:]
        identical, overlap = support_agreement(src, packed[sid], x)
        rel = max(
            ((getattr(packed[sid], n) - getattr(src, n)).norm() / getattr(src, n).norm()).item()
            for n in ("W_enc", "W_dec")
        )
        a, b = q_src.row(sid), q_pack.row(sid)
        rows.append(
            {
                "sae_id": sid,
                "ce_recovered_source": a["ce_recovered"],
                "ce_recovered_packed": b["ce_recovered"],
                "ce_recovered_diff": b["ce_recovered"] - a["ce_recovered"],
                "explained_variance_source": a["explained_variance"],
                "explained_variance_packed": b["explained_variance"],
                "support_identical": identical,
                "support_overlap": overlap,
                "max_rel_weight_error": rel,
            }
        )
    return ReleaseFidelity(rows=rows, n_tokens=q_src.n_tokens, seconds=time.perf_counter() - start)


@torch.no_grad()
def readout_fidelity(model, source: ReadoutSAE, packed: ReadoutSAE, sae_id: str) -> dict[str, Any]:
    """Packed vs source readout SAE on the model's own LM-head rows: same TopK supports per row, and row EV
    (1 − Σ‖w_t − ŵ_t‖² / Σ‖w_t − w̄‖²) from the source's stored codes and the packed one's recomputed codes."""
    check_compatible(source, model)
    check_compatible(packed, model)  # recomputes the packed dictionary's codes from its (dequantised) encoder
    rows = unembedding_rows(model).to(source.W_dec)
    total = (rows - rows.mean(0)).pow(2).sum()
    ev = [1 - ((rows - sae.reconstructed_rows()).pow(2).sum() / total).item() for sae in (source, packed)]
    sa, sb = source.code_indices.sort(-1).values, packed.code_indices.sort(-1).values
    same = (sa[:, :, None] == sb[:, None, :]).any(-1)
    rel = max(
        ((getattr(packed, n) - getattr(source, n)).norm() / getattr(source, n).norm()).item()
        for n in ("W_enc", "W_dec")
    )
    return {
        "sae_id": sae_id,
        "explained_variance_source": ev[0],
        "explained_variance_packed": ev[1],
        "support_identical": same.all(-1).float().mean().item(),
        "support_overlap": same.float().mean().item(),
        "max_rel_weight_error": rel,
    }


def _load_packed(family: LocalReleases, model_name: str, sid: str) -> SAE:
    cfg, state = read_shipped(family.shipped_dir(model_name), sid)
    cfg = handle_config_defaulting(cfg)
    cls, cfg_cls = get_sae_class(cfg["architecture"])
    sae = cls(cfg_cls.from_dict(cfg))
    sae.process_state_dict_for_loading(state)  # as SAE.from_pretrained does (a readout SAE's codes come later)
    sae.load_state_dict(state)
    return sae


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--readout-ids", default="small", help="comma-separated readout ids to ship")
    parser.add_argument(
        "--add",
        metavar="SAE_ID",
        help="pack only this cached dictionary into the existing release (the shipped files stay as they are)",
    )
    parser.add_argument("--n-seqs", type=int, default=32, help="evaluation windows for the fidelity check")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument(
        "--out", help="where the fidelity result is saved (docs/saes/release_fidelity, or ..._<SAE_ID> with --add)"
    )
    args = parser.parse_args(argv)

    suite_json = SAES_RELEASES.root() / SAES_RELEASES.release_name(args.model) / "suite.json"
    suite = json.loads(suite_json.read_text(encoding="utf-8"))
    if suite.get("status") != "complete":
        raise SystemExit(f"{suite_json} says the suite is {suite.get('status')!r}: finish `tlql saes train` first.")
    keep = {k: suite[k] for k in ("training_tokens_seen", "epochs", "n_cached_tokens", "config")}
    if args.add:
        suite_ids, readout_ids = [args.add], []
        add_to_release(SAES_RELEASES, args.model, args.add, source={"suite": keep})
    else:
        suite_ids = [sid for sid in SAES_RELEASES.cached_ids(args.model) if not sid.endswith(".partial")]
        pack_release(SAES_RELEASES, args.model, suite_ids, source={"suite": keep})
        readout_ids = [r for r in args.readout_ids.split(",") if r]
        if readout_ids:
            pack_release(READOUT_RELEASES, args.model, readout_ids, source={})
    print(f"release: {release_bytes() / 1e6:.1f} MB under {shipped_root()}")
    if release_bytes() > MAX_RELEASE_BYTES:
        raise SystemExit(f"The release exceeds {MAX_RELEASE_BYTES / 1e6:.0f} MB.")

    model = load_model(args.model)
    tokens = load_corpus("stdlib", model, n_seqs=args.n_seqs, seq_len=args.seq_len, split="evaluation")
    sources = {sid: SAE.load_from_disk(str(SAES_RELEASES.cached_path(args.model, sid))) for sid in suite_ids}
    packed = {sid: _load_packed(SAES_RELEASES, args.model, sid) for sid in suite_ids}
    result = release_fidelity(model, sources, packed, tokens)
    for rid in readout_ids:
        source = SAE.load_from_disk(str(READOUT_RELEASES.cached_path(args.model, rid)))
        result.rows.append(readout_fidelity(model, source, _load_packed(READOUT_RELEASES, args.model, rid), rid))
    result.config = {"n_seqs": args.n_seqs, "seq_len": args.seq_len, "corpus": "stdlib", "split": "evaluation"}
    result.save(args.out or ("docs/saes/release_fidelity" + (f"_{args.add}" if args.add else "")))
    for row in result.rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
