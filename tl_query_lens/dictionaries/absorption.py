"""First-letter feature absorption of any dictionary, as SAEBench defines it.

Definition: Chanin et al., "A is for Absorption" (arXiv 2409.14507), with the absorption fraction of SAEBench
(Karvonen et al., arXiv 2503.09532), as implemented in ``sae_bench`` 0.6.0 (``evals/absorption``): a linear probe per
first letter on the model's activations at the word of an in-context prompt (``"{word} has the first letter:"``, ten
examples); k-sparse probes (k = 1..10) on the dictionary's codes pick each letter's *main* latents (k grows while F1
rises by ≥ 0.03); on test words the probe fires on, the absorption fraction is the share of the activation's probe
projection carried by up to three other latents aligned with the probe instead of the main ones; full absorption is
the case where no main latent fires and one latent carries ≥ 40% of it. Scores average letters whose probe has
F1 > 0.6, and only when ≥ 20 letters qualify.

Why not ``sae_bench``'s own entry point (``evals/absorption/main.py``): it does not import here (``tabulate`` is
missing; ``sae-bench`` is installed with ``--no-deps`` because it pins numpy<2 / datasets<4), it loads the model with
``HookedTransformer.from_pretrained_no_processing`` (a hub download; the embedded model is not on any hub), it trains
its probe on every alphabetic token of the vocabulary (~2M prompt tokens per layer for a 49k vocabulary: hours on
this CPU), it writes into its own package folder, and it reads and encodes ``blocks.L.hook_resid_post`` whatever the
dictionary reads, which is wrong for transcoders and FF-KV. This file is the same procedure with four departures:
(1) the probe is trained at the dictionary's *write* hook (what its decoder reconstructs) and the codes come from its
*read* hook (both are ``hook_resid_post`` for a residual SAE, where this is SAEBench's procedure exactly); (2) a seeded
sample of words, prompts built as token ids (each word is one vocabulary token, so every prompt has the same length),
one prompt per word reused for the absorption step; (3) projections are ``a_i · (v_i · p̂)`` with v_i = decode(e_i) − decode(0), the feature's actual
write vector, which equals SAEBench's ``a_i · cos(d_i, p̂)`` for the unit-norm decoders it requires (vanilla FF-KV
values are not unit-norm; TopK SAEs that rescale codes by ‖d_i‖ are); (4) the
k-sparse logistic regressions are fitted in torch (L-BFGS, L2 with C = 1, balanced class weights: sklearn's defaults);
(5) the L1 probe that ranks latents starts from zero: with ~1,600 training words SAEBench's batch of 4,096 gives one
Adam step per epoch, and PyTorch's random init (±1/√d_sae) would outweigh those 50 steps on a narrow dictionary.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from sae_lens import SAE
from tqdm import tqdm
from transformer_lens import HookedTransformer

from tl_query_lens.config import resolve_config
from tl_query_lens.dictionaries.config import AbsorptionConfig
from tl_query_lens.dictionaries.key_value import as_key_value
from tl_query_lens.presentation import Table
from tl_query_lens.primitives import stop_layer
from tl_query_lens.results import SavableResult

logger = logging.getLogger(__name__)

LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass
class FirstLetterActivations:
    """Activations at the word position of first-letter prompts, for several hooks of one model.

    Attributes:
        words: the word of each prompt.
        letters: index 0..25 of each word's first letter.
        is_train: True for probe-training words.
        acts: hook name → ``[n_words, d]`` activations.
    """

    words: list[str]
    letters: Int[torch.Tensor, " n"]
    is_train: torch.Tensor
    acts: dict[str, Float[torch.Tensor, "n d"]] = field(default_factory=dict)


@dataclass
class AbsorptionResult(SavableResult):
    """First-letter absorption of one dictionary (lower is better).

    Attributes:
        mean_absorption_fraction: mean over scored letters (None when none qualifies; when fewer than
            ``min_letters`` qualify SAEBench reports nothing: ``note`` says so and the mean is kept for reference).
        mean_full_absorption: mean rate of full absorption over scored letters.
        mean_split_features: mean number of main latents per scored letter.
        n_letters: letters whose probe F1 exceeds ``min_probe_f1``.
        per_letter: letter → {probe_f1, absorption_fraction, full_absorption, n_true_positives, main_latents}.
        probe_hook / code_hook: where the probe and the codes were read.
        note: why there is no score, if there is none.
    """

    mean_absorption_fraction: float | None
    mean_full_absorption: float | None
    mean_split_features: float | None
    n_letters: int
    per_letter: dict
    probe_hook: str
    code_hook: str
    note: str = ""

    title: ClassVar[str] = "First-letter absorption"

    def tables(self) -> dict[str, Table]:
        """``per_letter``: probe F1, absorption, full absorption, true positives and main latents per letter."""
        columns = {
            "letter": str,
            "probe_f1": float,
            "absorption_fraction": float,
            "full_absorption": float,
            "n_true_positives": int,
            "main_latents": str,
        }
        rows = (
            [
                str(letter),
                d["probe_f1"],
                d["absorption_fraction"],
                d["full_absorption"],
                d["n_true_positives"],
                " ".join(str(i) for i in d["main_latents"]),
            ]
            for letter, d in self.per_letter.items()
        )
        return {"per_letter": Table.build(columns, rows)}


def first_letter_words(tokenizer, n_words: int, seed: int = 0) -> list[tuple[int, str]]:
    """A seeded sample of vocabulary tokens that are one alphabetic word (optional leading space): ``(id, word)``."""
    words = []
    for token, idx in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]):
        text = tokenizer.convert_tokens_to_string([token])
        stripped = text.removeprefix(" ")
        if stripped and stripped.isascii() and stripped.isalpha():
            words.append((idx, text))
    if len(words) < 2:
        raise ValueError("The tokenizer has fewer than two alphabetic word tokens; the first-letter task needs them.")
    rng = random.Random(seed)
    return rng.sample(words, min(n_words, len(words)))


def _one_token(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def build_first_letter_prompts(
    model: HookedTransformer, words: list[tuple[int, str]], is_train: list[bool], cfg: AbsorptionConfig
) -> tuple[Int[torch.Tensor, "n pos"], int]:
    """ICL prompts as token ids: ``\\n ex has the first letter: E \\n … word has the first letter:``.

    ICL examples are drawn from the same split as the word (never the word itself). Returns the prompts and the
    position of the word token.
    """
    tok = model.tokenizer
    if tok is None:
        raise ValueError("The first-letter task needs a model with a tokenizer (model.set_tokenizer(...)).")
    sep = _one_token(tok, "\n")
    suffix = _one_token(tok, cfg.template)
    answers = [_one_token(tok, " " + letter.upper()) for letter in LETTERS]
    bos = [tok.bos_token_id] if model.cfg.default_prepend_bos and tok.bos_token_id is not None else []
    rng = random.Random(cfg.seed + 1)
    pools = {flag: [w for w, f in zip(words, is_train) if f == flag] for flag in (True, False)}
    prompts = []
    for (idx, text), flag in zip(words, is_train):
        pool = pools[flag]
        ids = list(bos) + list(sep)
        n_icl = min(cfg.n_icl_examples, len(pool) - 1)
        for ex_idx, ex_text in rng.sample([w for w in pool if w[0] != idx], n_icl):
            ids += [ex_idx] + suffix + answers[LETTERS.index(ex_text.strip()[0].lower())] + sep
        prompts.append(ids + [idx] + suffix)
    lengths = {len(p) for p in prompts}
    if len(lengths) != 1:  # only when a split has too few words for n_icl_examples
        raise ValueError(f"Prompts differ in length {sorted(lengths)}: raise n_words or lower n_icl_examples.")
    return torch.tensor(prompts), -(len(suffix) + 1)


@torch.no_grad()
def first_letter_activations(
    model: HookedTransformer, hooks: list[str], *, cfg: AbsorptionConfig | None = None
) -> FirstLetterActivations:
    """Run the first-letter prompts once and keep every hook's activation at the word position."""
    cfg = resolve_config(AbsorptionConfig, cfg)
    words = first_letter_words(model.tokenizer, cfg.n_words, cfg.seed)
    n_train = round(len(words) * cfg.train_fraction)
    is_train = [i < n_train for i in range(len(words))]
    prompts, pos = build_first_letter_prompts(model, words, is_train, cfg)
    hooks = list(dict.fromkeys(hooks))
    stop = stop_layer(hooks)
    acts: dict[str, list[torch.Tensor]] = {h: [] for h in hooks}
    for start in tqdm(range(0, len(prompts), cfg.batch_size), desc="first-letter prompts", leave=False):
        batch = prompts[start : start + cfg.batch_size].to(model.cfg.device)
        _, cache = model.run_with_cache(batch, names_filter=hooks, stop_at_layer=stop)
        for h in hooks:
            acts[h].append(cache[h][:, pos].float().cpu())
    return FirstLetterActivations(
        words=[text for _, text in words],
        letters=torch.tensor([LETTERS.index(text.strip()[0].lower()) for _, text in words]),
        is_train=torch.tensor(is_train),
        acts={h: torch.cat(v) for h, v in acts.items()},
    )


def train_letter_probe(
    x: Float[torch.Tensor, "n d"],
    letters: Int[torch.Tensor, " n"],
    *,
    epochs: int,
    batch: int,
    lr: float,
    wd: float,
    seed: int,
    l1: float = 0.0,
    zero_init: bool = False,
) -> tuple[Float[torch.Tensor, "26 d"], Float[torch.Tensor, " 26"]]:
    """One-vs-rest logistic probes (BCE, pos_weight = negatives/positives, Adam, lr decayed 1000× over training).

    ``l1`` adds SAEBench's sparsity penalty ``l1 · mean_letter Σ|w|`` (its k-sparse ranking probe); ``zero_init``
    starts from zero instead of PyTorch's uniform ±1/√d.
    """
    gen = torch.Generator().manual_seed(seed)
    y = F.one_hot(letters, len(LETTERS)).float()
    pos = y.sum(0)
    pos_weight = (len(y) - pos) / pos.clamp_min(1)
    layer = torch.nn.Linear(x.shape[1], len(LETTERS))
    with torch.no_grad():
        bound = 0.0 if zero_init else 1 / math.sqrt(x.shape[1])
        layer.weight.copy_(torch.rand(layer.weight.shape, generator=gen) * 2 * bound - bound)
        layer.bias.copy_(torch.rand(layer.bias.shape, generator=gen) * 2 * bound - bound)
    opt = torch.optim.Adam(layer.parameters(), lr=lr, weight_decay=wd)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=math.exp(math.log(1e-5 / lr) / max(epochs, 1)))
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight)
    with torch.enable_grad():
        for _ in range(epochs):
            for idx in torch.randperm(len(x), generator=gen).split(batch):
                loss = loss_fn(layer(x[idx]), y[idx])
                if l1:
                    loss = loss + l1 * layer.weight.abs().sum(-1).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            sched.step()
    return layer.weight.detach().clone(), layer.bias.detach().clone()


def _balanced_logistic(x: torch.Tensor, y: torch.Tensor, c: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Binary logistic regression, sklearn's objective: C Σ s_i ℓ_i + ½‖w‖² with balanced sample weights s_i."""
    x, y = x.double(), y.double()
    n_pos = y.sum().clamp_min(1)
    n_neg = (len(y) - y.sum()).clamp_min(1)
    weights = torch.where(y > 0, len(y) / (2 * n_pos), len(y) / (2 * n_neg))
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=500, tolerance_grad=1e-9, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = c * (weights * F.binary_cross_entropy_with_logits(x @ w + b, y, reduction="none")).sum()
        loss = loss + 0.5 * w.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return w.detach().float(), b.detach().float()


def _f1(pred: torch.Tensor, truth: torch.Tensor) -> float:
    tp = (pred & truth).sum().item()
    denom = pred.sum().item() + truth.sum().item()
    return 2 * tp / denom if denom else 0.0


def main_latents(
    codes_train: torch.Tensor,
    codes_test: torch.Tensor,
    y_train: torch.Tensor,
    y_test: torch.Tensor,
    cfg: AbsorptionConfig,
) -> dict[int, list[int]]:
    """Each letter's main latents: the k-sparse probe's latents at the last k whose test F1 rose by ≥ ``f1_jump``."""
    l1_weights, _ = train_letter_probe(
        codes_train,
        y_train,
        epochs=cfg.sparse_epochs,
        batch=cfg.sparse_batch,
        lr=1e-2,
        wd=1e-6,
        seed=cfg.seed,
        l1=cfg.sparse_l1,
        zero_init=True,
    )
    result: dict[int, list[int]] = {}
    for letter in range(len(LETTERS)):
        best, chosen = -100.0, []
        for k in range(1, cfg.max_k + 1):
            feats = l1_weights[letter].topk(k).indices
            w, b = _balanced_logistic(codes_train[:, feats], (y_train == letter).float())
            f1 = _f1((codes_test[:, feats] @ w + b) > 0, y_test == letter)
            if f1 <= best + cfg.f1_jump:
                break
            best, chosen = f1, feats.tolist()
        result[letter] = chosen
    return result


def _word_absorption(
    probe_proj: float,
    latent_proj: torch.Tensor,
    cos: torch.Tensor,
    acts: torch.Tensor,
    main: list[int],
    cfg: AbsorptionConfig,
) -> tuple[float, bool]:
    """SAEBench's per-word rules: (absorption fraction, full absorption)."""
    main_proj = latent_proj[main].sum().item() if main else 0.0
    others = torch.ones_like(latent_proj, dtype=torch.bool)
    others[main] = False
    absorbers = latent_proj[others & (cos >= cfg.fraction_cos) & (latent_proj > 0)]
    top = absorbers.topk(min(cfg.max_absorbers, absorbers.numel())).values.sum().item()
    if main_proj >= probe_proj or top / probe_proj < cfg.projection_share:
        fraction = 0.0
    elif main_proj <= 0.0:
        fraction = 1.0
    else:
        absorbed = min(top, probe_proj - main_proj)
        fraction = min(max(absorbed / (absorbed + main_proj), 0.0), 1.0)
    top_latent = int(latent_proj.argmax())
    full = (
        all(acts[i].item() < 1e-8 for i in main)
        and cos[top_latent].item() >= cfg.full_cos
        and probe_proj >= 0
        and latent_proj[top_latent].item() / probe_proj >= cfg.projection_share
    )
    return fraction, bool(full)


@torch.no_grad()
def write_vectors(dictionary: SAE, chunk: int = 1024) -> Float[torch.Tensor, "d_sae d_out"]:
    """What one unit of each feature adds to the reconstruction: ``decode(e_i) − decode(0)``.

    Equals ``W_dec`` for plain decoders, and keeps the scale right for dictionaries that divide codes by
    ``‖W_dec_i‖`` before decoding (SAELens' ``rescale_acts_by_decoder_norm``).
    """
    d_sae = dictionary.W_dec.shape[0]
    kw = {"dtype": dictionary.dtype, "device": dictionary.device}
    zero = dictionary.decode(torch.zeros(1, d_sae, **kw))
    eye = torch.eye(d_sae, **kw)
    return torch.cat([dictionary.decode(eye[i : i + chunk]) - zero for i in range(0, d_sae, chunk)]).float().cpu()


@torch.no_grad()
def first_letter_absorption(
    dictionary: SAE, data: FirstLetterActivations, *, cfg: AbsorptionConfig | None = None, **overrides
) -> AbsorptionResult:
    """First-letter absorption of ``dictionary`` on activations from :func:`first_letter_activations`.

    The probe reads the dictionary's write hook, the codes come from its read hook (module docstring).
    """
    cfg = resolve_config(AbsorptionConfig, cfg, overrides)
    view = as_key_value(dictionary)
    for hook in (view.read_hook, view.write_hook):
        if hook not in data.acts:
            raise KeyError(
                f"No first-letter activations at {hook}; collect them with "
                f"first_letter_activations(model, hooks=[..., {hook!r}])."
            )
    x_probe = data.acts[view.write_hook]
    codes = torch.cat(
        [
            dictionary.encode(c.to(dictionary.device, dictionary.dtype)).float().cpu()
            for c in data.acts[view.read_hook].split(1024)
        ]
    )
    tr, te = data.is_train, ~data.is_train
    y_tr, y_te = data.letters[tr], data.letters[te]
    probe_w, probe_b = train_letter_probe(
        x_probe[tr],
        y_tr,
        epochs=cfg.probe_epochs,
        batch=cfg.probe_batch,
        lr=cfg.probe_lr,
        wd=cfg.probe_wd,
        seed=cfg.seed,
    )
    x_te, codes_te = x_probe[te], codes[te]
    scores_te = x_te @ probe_w.T + probe_b
    mains = main_latents(codes[tr], codes_te, y_tr, y_te, cfg)
    values = write_vectors(dictionary)
    unit_values = values / values.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    per_letter: dict[str, dict] = {}
    for letter, name in enumerate(LETTERS):
        probe_f1 = _f1(scores_te[:, letter] > 0, y_te == letter)
        direction = probe_w[letter] / probe_w[letter].norm()
        cos = unit_values @ direction
        rows = torch.nonzero((y_te == letter) & (scores_te[:, letter] > 0)).flatten()
        fractions, fulls = [], []
        for r in rows.tolist():
            acts = codes_te[r]
            fraction, full = _word_absorption(
                (x_te[r] @ direction).item(), acts * (values @ direction), cos, acts, mains[letter], cfg
            )
            fractions.append(fraction)
            fulls.append(full)
        n = len(rows)
        per_letter[name] = {
            "probe_f1": probe_f1,
            "absorption_fraction": sum(fractions) / n if n else 0.0,
            "full_absorption": sum(fulls) / n if n else 0.0,
            "n_true_positives": n,
            "main_latents": mains[letter],
            "n_main": len(mains[letter]),
        }
    scored = [v for v in per_letter.values() if v["probe_f1"] > cfg.min_probe_f1]
    note = ""
    if len(scored) < cfg.min_letters:
        note = (
            f"only {len(scored)} letters have a probe with test F1 > {cfg.min_probe_f1} at {view.write_hook}: "
            f"SAEBench needs {cfg.min_letters} and would report no score (raise n_words)"
        )
        logger.warning("Absorption below SAEBench's letter minimum: %s", note)

    def mean(key: str) -> float | None:
        return sum(v[key] for v in scored) / len(scored) if scored else None

    split = mean("n_main") if scored else None
    return AbsorptionResult(
        mean_absorption_fraction=mean("absorption_fraction"),
        mean_full_absorption=mean("full_absorption"),
        mean_split_features=split,
        n_letters=len(scored),
        per_letter=per_letter,
        probe_hook=view.write_hook,
        code_hook=view.read_hook,
        note=note,
    )
