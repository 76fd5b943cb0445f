"""The atlas's Neuronpedia export, replayed through the rules of Neuronpedia's bulk importer on a fresh instance.

What the importer does (hijohnnylin/neuronpedia, ``apps/webapp/app/api/admin/import-v1`` and ``lib/db/import.ts``):
for one source it reads ``v1/<modelId>/<sourceId>/{release,model,sourceset,source}.jsonl`` and creates each line
through the ORM (an unknown field is an error), then inserts every ``features/*.jsonl.gz`` line into ``Neuron`` and
every ``activations/*.jsonl.gz`` line into ``Activation`` by raw SQL: the columns are the keys of the batch's first
line that the table has, each line is cast to the column types, and ``ON CONFLICT DO NOTHING`` skips a repeated key.
The table definitions below are this test's summary of ``apps/webapp/prisma/schema.prisma``: each column's SQL type
and whether it is NOT NULL without a database default (the ORM's ``cuid()`` defaults are not in the database).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from tests.helpers import tiny_export_atlas
from tl_query_lens.atlas import AtlasConfig
from tl_query_lens.atlas.exports import export_all
from tl_query_lens.report import neuronpedia as np_export
from tl_query_lens.report.tokens import readable

SEQ = 16
SEEDED_USERS = {"clkht01d40000jv08hvalcvly"}  # the bot user of the database seed (prisma/seed.ts)

T, TS, F, FS, I, IS, B, V, J, D = "text", "text[]", "float8", "float8[]", "int", "int[]", "bool", "vis", "json", "time"
# table -> column -> (type, NOT NULL without a database default)
SCHEMA: dict[str, dict[str, tuple[str, bool]]] = {
    "SourceRelease": {
        "name": (T, True), "visibility": (V, False), "isNewUi": (B, False), "featured": (B, False),
        "description": (T, True), "descriptionShort": (T, False), "urls": (TS, False), "creatorEmail": (T, False),
        "creatorName": (T, True), "creatorNameShort": (T, False), "creatorId": (T, True),
        "defaultSourceSetName": (T, False), "defaultSourceId": (T, False), "defaultUmapSourceIds": (TS, False),
        "createdAt": (D, False),
    },
    "Model": {
        "id": (T, True), "displayNameShort": (T, False), "displayName": (T, False), "creatorId": (T, True),
        "tlensId": (T, False), "openRouterId": (T, False), "dimension": (I, False), "thinking": (B, False),
        "visibility": (V, False), "defaultSourceSetName": (T, False), "defaultSourceId": (T, False),
        "defaultGraphSourceSetName": (T, False), "inferenceEnabled": (B, False), "instruct": (B, False),
        "layers": (I, True), "neuronsPerLayer": (I, True), "createdAt": (D, False), "owner": (T, True),
        "updatedAt": (D, False), "website": (T, False),
    },
    "SourceSet": {
        "modelId": (T, True), "name": (T, True), "hasDashboards": (B, False), "allowInferenceSearch": (B, False),
        "visibility": (V, False), "description": (T, True), "type": (T, False), "creatorName": (T, True),
        "urls": (TS, False), "creatorEmail": (T, False), "creatorId": (T, True), "releaseName": (T, False),
        "hasGraphs": (B, False), "graphEnabled": (B, False), "similarityMatrixEnabled": (B, False),
        "defaultOfModelId": (T, False), "defaultGraphModelId": (T, False), "defaultRange": (I, False),
        "defaultShowBreaks": (B, False), "showDfa": (B, False), "showCorrelated": (B, False),
        "showHeadAttribution": (B, False), "showUmap": (B, False), "createdAt": (D, False),
    },
    "Source": {
        "id": (T, True), "modelId": (T, True), "hasDashboards": (B, False), "inferenceEnabled": (B, False),
        "saelensConfig": (J, False), "saelensRelease": (T, False), "saelensSaeId": (T, False),
        "hfRepoId": (T, False), "hfFolderId": (T, False), "visibility": (V, False), "defaultOfModelId": (T, False),
        "setName": (T, True), "creatorId": (T, True), "hasUmap": (B, False), "hasUmapLogSparsity": (B, False),
        "hasUmapClusters": (B, False), "num_prompts": (I, False), "num_tokens_in_prompt": (I, False),
        "dataset": (T, False), "notes": (T, False), "cosSimMatchModelId": (T, False),
        "cosSimMatchSourceId": (T, False), "createdAt": (D, False),
    },
    "Neuron": {
        "modelId": (T, True), "layer": (T, True), "index": (T, True), "sourceSetName": (T, False),
        "creatorId": (T, False), "createdAt": (D, False), "maxActApprox": (F, False), "hasVector": (B, False),
        "vector": (FS, False), "vectorLabel": (T, False), "vectorDefaultSteerStrength": (F, False),
        "hookName": (T, False), "topkCosSimIndices": (IS, False), "topkCosSimValues": (FS, False),
        "neuron_alignment_indices": (IS, False), "neuron_alignment_values": (FS, False),
        "neuron_alignment_l1": (FS, False), "correlated_neurons_indices": (IS, False),
        "correlated_neurons_pearson": (FS, False), "correlated_neurons_l1": (FS, False),
        "correlated_features_indices": (IS, False), "correlated_features_pearson": (FS, False),
        "correlated_features_l1": (FS, False), "neg_str": (TS, False), "neg_values": (FS, False),
        "pos_str": (TS, False), "pos_values": (FS, False), "frac_nonzero": (F, False),
        "freq_hist_data_bar_heights": (FS, False), "freq_hist_data_bar_values": (FS, False),
        "logits_hist_data_bar_heights": (FS, False), "logits_hist_data_bar_values": (FS, False),
        "decoder_weights_dist": (FS, False), "umap_cluster": (I, False), "umap_log_feature_sparsity": (F, False),
        "umap_x": (F, False), "umap_y": (F, False),
    },
    "Activation": {
        "id": (T, True), "tokens": (TS, False), "dataIndex": (T, False), "index": (T, True), "layer": (T, True),
        "modelId": (T, True), "dataSource": (T, False), "maxValue": (F, True), "maxValueTokenIndex": (I, True),
        "minValue": (F, True), "values": (FS, False), "dfaValues": (FS, False), "dfaTargetIndex": (I, False),
        "dfaMaxValue": (F, False), "zQIndices": (IS, False), "zKIndices": (IS, False), "zValues": (FS, False),
        "creatorId": (T, True), "createdAt": (D, False), "lossValues": (FS, False), "logitContributions": (T, False),
        "binMin": (F, False), "binMax": (F, False), "binContains": (F, False), "qualifyingTokenIndex": (I, False),
    },
}  # fmt: skip
# foreign keys: table -> [(columns, referenced table, referenced key columns)]; a NULL column skips its check
FOREIGN = {
    "SourceRelease": [(("creatorId",), "User", ("id",))],
    "Model": [(("creatorId",), "User", ("id",))],
    "SourceSet": [
        (("creatorId",), "User", ("id",)),
        (("modelId",), "Model", ("id",)),
        (("releaseName",), "SourceRelease", ("name",)),
    ],
    "Source": [(("creatorId",), "User", ("id",)), (("modelId", "setName"), "SourceSet", ("modelId", "name"))],
    "Neuron": [
        (("creatorId",), "User", ("id",)),
        (("modelId",), "Model", ("id",)),
        (("modelId", "layer"), "Source", ("modelId", "id")),
        (("modelId", "sourceSetName"), "SourceSet", ("modelId", "name")),
    ],
    "Activation": [
        (("creatorId",), "User", ("id",)),
        (("modelId", "layer", "index"), "Neuron", ("modelId", "layer", "index")),
    ],
}
KEYS = {  # primary / unique keys (a repeated one is skipped by ON CONFLICT DO NOTHING, or found by the ORM lookup)
    "SourceRelease": ("name",),
    "Model": ("id",),
    "SourceSet": ("modelId", "name"),
    "Source": ("modelId", "id"),
    "Neuron": ("modelId", "layer", "index"),
    "Activation": ("id",),
}


def _fits(value, kind: str) -> bool:
    """Whether a JSON value casts to the column type (``jsonb_to_recordset``, or the ORM for the metadata)."""
    scalar = kind.removesuffix("[]")
    if kind.endswith("[]"):
        return isinstance(value, list) and all(_fits(v, scalar) for v in value)
    if scalar == T:
        return isinstance(value, str) and "\x00" not in value
    if scalar == F:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if scalar == I:
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**31
    if scalar == B:
        return isinstance(value, bool)
    if scalar == V:
        return value in ("PUBLIC", "UNLISTED", "PRIVATE")
    return scalar == J


class Replay:
    """A fresh instance's tables (the seeded users only), and what an import rejected or dropped."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[tuple, dict]] = {"User": {(u,): {"id": u} for u in SEEDED_USERS}}
        self.rejected: list[str] = []
        self.dropped: list[str] = []
        self.counts: dict[str, int] = {}

    def _check(self, table: str, row: dict, columns: set[str], where: str) -> bool:
        schema = SCHEMA[table]
        for col, (kind, required) in schema.items():
            value = row.get(col) if col in columns else None
            if value is None:
                if required:
                    self.rejected.append(f"{where}: {table}.{col} is NOT NULL without a default, got none")
                    return False
            elif not _fits(value, kind):
                self.rejected.append(f"{where}: {table}.{col} = {value!r} does not cast to {kind}")
                return False
        for cols, ref, ref_cols in FOREIGN[table]:
            key = tuple(row.get(c) if c in columns else None for c in cols)
            if None in key:
                continue
            known = {tuple(r[c] for c in ref_cols) for r in self.rows.get(ref, {}).values()}
            if key not in known:
                self.rejected.append(f"{where}: {table}{cols} = {key} has no {ref} row")
                return False
        return True

    def create(self, table: str, line: dict, where: str) -> None:
        """The ORM path of the metadata files: every field must be the table's; an existing key is left alone."""
        unknown = set(line) - set(SCHEMA[table])
        if unknown:
            self.rejected.append(f"{where}: the ORM rejects unknown {table} fields {sorted(unknown)}")
            return
        key = tuple(line.get(c) for c in KEYS[table])
        if key in self.rows.setdefault(table, {}):
            return
        if self._check(table, line, set(line), where):
            self.rows[table][key] = line
            self.counts[table] = self.counts.get(table, 0) + 1

    def insert_batch(self, table: str, lines: list[str], where: str) -> None:
        """The raw-SQL path: the columns are the first line's keys that the table has."""
        parsed = [json.loads(line) for line in lines if line.strip()]
        columns = set(parsed[0]) & set(SCHEMA[table])
        for n, row in enumerate(parsed):
            lost = set(row) - columns
            if lost:
                self.dropped.append(f"{where} line {n}: {sorted(lost)} not among the batch's columns")
            if not self._check(table, row, columns, f"{where} line {n}"):
                continue
            key = tuple(row[c] for c in KEYS[table])
            if key in self.rows.setdefault(table, {}):
                self.dropped.append(f"{where} line {n}: {table} key {key} already there (ON CONFLICT DO NOTHING)")
                continue
            self.rows[table][key] = {c: row.get(c) for c in columns}
            self.counts[table] = self.counts.get(table, 0) + 1

    def import_source(self, v1: Path, model_id: str, source_id: str) -> None:
        """What the import route does for ``?modelId=...&sourceId=...``."""
        base = v1 / model_id / source_id
        for name, table in (
            ("release", "SourceRelease"),
            ("model", "Model"),
            ("sourceset", "SourceSet"),
            ("source", "Source"),
        ):
            for line in (base / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
                if line.strip():
                    row = json.loads(line)
                    if table in ("SourceSet", "Source") and row.get("modelId") != model_id:
                        self.rejected.append(f"{name}.jsonl: modelId {row.get('modelId')} is not {model_id}")
                    self.create(table, row, f"{source_id}/{name}.jsonl")
        for folder, table in (("features", "Neuron"), ("activations", "Activation")):
            for path in sorted((base / folder).glob("*.jsonl.gz")):
                text = gzip.decompress(path.read_bytes()).decode("utf-8").replace("\\u0000", " ")
                self.insert_batch(table, text.strip().split("\n"), f"{source_id}/{folder}/{path.name}")


@pytest.fixture(scope="module")
def atlas(tmp_path_factory):
    out = tmp_path_factory.mktemp("np-atlas")
    model, _, _, result = tiny_export_atlas(out, ("ffkv:1", "ffkv:2:topk:8"), SEQ)
    return model, out, result


def _activations(base: Path) -> list[dict]:
    rows = []
    for path in sorted((base / "activations").glob("*.jsonl.gz")):
        rows += [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]
    return rows


def test_a_fresh_instance_imports_every_row_of_every_source(atlas):
    _model, out, result = atlas
    v1 = out / "exports" / "neuronpedia" / "v1"
    assert [p.name for p in v1.iterdir()] == ["custom"]
    sources = sorted(p.name for p in (v1 / "custom").iterdir())
    assert sources == sorted(d["slug"] for d in result.dictionaries) and len(sources) == 2
    replay = Replay()
    written: dict[str, int] = {}
    for source in sources:
        replay.import_source(v1, "custom", source)
        base = v1 / "custom" / source
        for folder, table in (("features", "Neuron"), ("activations", "Activation")):
            for path in base.glob(f"{folder}/*.jsonl.gz"):
                written[table] = written.get(table, 0) + len(gzip.decompress(path.read_bytes()).splitlines())
    assert replay.rejected == [] and replay.dropped == []
    assert replay.counts["Neuron"] == written["Neuron"] == 64 + 64
    assert replay.counts["Activation"] == written["Activation"] > 128
    assert replay.counts["Source"] == 2 and replay.counts["SourceSet"] == 2 and replay.counts["Model"] == 1
    for table in ("SourceRelease", "Model", "SourceSet", "Source"):
        assert all(r["visibility"] == "PUBLIC" for r in replay.rows[table].values()), table
    # band rows sit inside their bin, top contexts have none; every line has the same keys
    for source in sources:
        rows = _activations(v1 / "custom" / source)
        assert len({tuple(r) for r in rows}) == 1
        banded = [r for r in rows if r["binMin"] is not None]
        assert banded and len(banded) < len(rows)
        assert all(r["binMin"] <= r["maxValue"] < r["binMax"] for r in banded)


def test_the_replay_catches_what_a_fresh_instance_rejects(atlas):
    """The checks can fail: rows without an id, a creator the instance lacks, and a first line without bins."""
    _, out, _ = atlas
    v1 = out / "exports" / "neuronpedia" / "v1"
    source = min(p.name for p in (v1 / "custom").iterdir())
    rows = _activations(v1 / "custom" / source)
    first_band = next(i for i, r in enumerate(rows) if r["binMin"] is not None)
    cases = {
        "no id": ([{k: v for k, v in r.items() if k != "id"} for r in rows], "rejected"),
        "unknown creator": ([{**r, "creatorId": "tl_query_lens"} for r in rows], "rejected"),
        "bins only on band rows": (
            [{k: v for k, v in r.items() if v is not None or k not in ("binMin", "binMax")} for r in rows],
            "dropped",
        ),
        "repeated id": ([*rows, rows[first_band]], "dropped"),
    }
    for name, (lines, outcome) in cases.items():
        replay = Replay()
        replay.import_source(v1, "custom", source)
        replay.rows.pop("Activation", None)
        replay.insert_batch("Activation", [json.dumps(r) for r in lines], name)
        assert getattr(replay, outcome), name


def test_ids_are_stable_across_reruns_and_settings_reach_every_row(atlas):
    model, out, _result = atlas
    base = out / "exports" / "neuronpedia" / "v1" / "custom"
    before = {s.name: [r["id"] for r in _activations(s)] for s in base.iterdir()}
    assert all(len(ids) == len(set(ids)) for ids in before.values())
    assert all(len(i) == 25 and i[0] == "c" and i.isalnum() and i.islower() for ids in before.values() for i in ids)
    text = (out / "data" / "index.js").read_text(encoding="utf-8")
    entries = json.loads(text[text.index("(") + 1 : text.rindex(")")])["dictionaries"]
    export_all(out, model, entries)  # no fingerprints: written again
    assert {s.name: [r["id"] for r in _activations(s)] for s in base.iterdir()} == before
    export_all(out, model, entries, creator="someone", visibility="UNLISTED")
    for source in base.iterdir():
        assert {r["creatorId"] for r in _activations(source)} == {"someone"}
        meta = json.loads((source / "source.jsonl").read_text())
        assert meta["creatorId"] == "someone" and meta["visibility"] == "UNLISTED"
    export_all(out, model, entries)  # back to the defaults for the other tests of the module
    with pytest.raises(ValueError, match="neuronpedia_visibility"):
        AtlasConfig(neuronpedia_visibility="public")


def test_tokens_are_stored_as_raw_text():
    texts = ["\n", "\n\n", "\t", " a\nb", "\r\n", "\x07", "", "plain", " é", "<0x41>"]
    for text in texts:
        assert np_export.raw_token(readable(text)) == text, repr(text)
    row = np_export.activation_row("m", "1-ffkv", 3, 0, ["a", "↵", "⇥"], [0.0, 1.0, 0.5], creator="u")
    assert row["tokens"] == ["a", "\n", "\t"] and row["maxValueTokenIndex"] == 1


def test_the_model_id_is_the_release_metadata_s():
    from tl_query_lens.saes.registry import SAES_RELEASES

    assert np_export.model_id("SmolLM2-135M-Instruct") == "smollm2-135m"
    assert SAES_RELEASES.release_name("smollm2-135m").endswith(np_export.model_id("SmolLM2-135M-Instruct"))
