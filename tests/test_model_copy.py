"""``copy_model``: a copy shares no parameter and no forward closure with its original (docs/gpu.md).

``copy.deepcopy`` of a ``HookedSAETransformer`` keeps SAELens' MLP wrapper (``mlp.forward = lambda x:
original_forward(mlp.hook_in(x))``) bound to the ORIGINAL's MLP: on a GPU the "CPU copy" then multiplied CPU inputs by
CUDA weights. Each test below fails for ``copy.deepcopy`` (the first one checks that it does), so it would have caught
the bug without a GPU.
"""

import copy

import pytest
import torch
from sae_lens import HookedSAETransformer
from transformer_lens import HookedTransformer

from tests.helpers import DeviceAudit, tiny_config, tiny_model, tiny_tokens
from tl_query_lens.errors import InputError
from tl_query_lens.models import copy_model


def _closure_modules(fn) -> list[torch.nn.Module]:
    """Every module a function's closure cells hold, directly or as the ``self`` of a bound method."""
    found = []
    for cell in getattr(fn, "__closure__", None) or ():
        value = cell.cell_contents
        owner = getattr(value, "__self__", None)
        for item in (value, owner):
            if isinstance(item, torch.nn.Module):
                found.append(item)
    return found


def _wrapped(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Modules whose ``forward`` was replaced on the instance (SAELens' MLP ``hook_in`` wrapper)."""
    return {name: m for name, m in model.named_modules() if "forward" in vars(m)}


def _mutate_mlps(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".mlp." in name:
                param.add_(0.5)


@pytest.mark.parametrize("copier", ["deepcopy", "copy_model"])
def test_mutating_the_original_moves_a_deepcopy_but_not_copy_model(style, copier):
    model = tiny_model(style)
    tokens = tiny_tokens(model)
    clone = copy.deepcopy(model) if copier == "deepcopy" else copy_model(model)
    with torch.no_grad():
        before = clone(tokens)
        torch.testing.assert_close(before, model(tokens), rtol=0, atol=0)  # same function before the change
        _mutate_mlps(model)
        moved = (clone(tokens) - before).abs().max().item()
        assert (model(tokens) - before).abs().max().item() > 1e-2  # the mutation does change the original
    if copier == "deepcopy":
        assert moved > 1e-2  # the bug this file guards against: the copy follows the original's MLPs
    else:
        assert moved == 0.0


def test_copy_shares_no_parameter_buffer_or_closure(style):
    model = tiny_model(style)
    clone = copy_model(model)
    ptrs = {t.data_ptr() for t in [*model.parameters(), *model.buffers()] if t.numel()}  # empty ones: address 0
    assert not any(t.data_ptr() in ptrs for t in [*clone.parameters(), *clone.buffers()] if t.numel())
    wrapped = _wrapped(clone)
    assert set(wrapped) == {f"blocks.{i}.mlp" for i in range(model.cfg.n_layers)}  # every MLP has the wrapper
    originals = {id(m) for m in model.modules()}
    for name, module in wrapped.items():
        held = _closure_modules(vars(module)["forward"])
        assert held, name
        assert all(m is module for m in held), f"{name}'s forward closure holds another module"
        assert not any(id(m) in originals for m in held), name
    # the reference point: a deepcopy's closures hold the original's MLPs
    deep = copy.deepcopy(model)
    assert any(id(m) in originals for m in _closure_modules(vars(deep.blocks[0].mlp)["forward"]))


def test_copy_to_another_device_runs_only_there(style):
    """The CUDA crash, reproduced on the CPU: a copy moved to ``meta`` must not compute with the original's weights."""
    model = tiny_model(style)
    tokens = tiny_tokens(model, n_seqs=2, seq_len=6)
    deep = copy.deepcopy(model).to("meta")
    with pytest.raises(RuntimeError, match="device|meta"), torch.no_grad():  # CPU weights in the MLPs (docs/gpu.md)
        deep(tokens.to("meta"))
    clone = copy_model(model, device="meta")
    assert {p.device.type for p in clone.parameters()} == {"meta"} and clone.cfg.device == "meta"
    with DeviceAudit() as audit, torch.no_grad():
        out = clone(tokens.to("meta"))
    assert audit.mixed == [] and out.device.type == "meta"
    assert model.cfg.device != "meta"  # the original's config is untouched


def test_copy_in_another_dtype_keeps_the_original(style):
    model = tiny_model(style)
    tokens = tiny_tokens(model)
    clone = copy_model(model, dtype=torch.bfloat16)
    assert clone.cfg.dtype == torch.bfloat16 and model.cfg.dtype == torch.float32
    assert {p.dtype for p in clone.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    with torch.no_grad():
        ref, low = model(tokens), clone(tokens).float()
    # bf16 keeps 8 mantissa bits: the logits agree to a few percent of their scale, not exactly
    assert 0 < (low - ref).abs().max().item() < 0.05 * ref.abs().max().item()
    back = copy_model(clone, dtype=torch.float32)
    for (name, a), b in zip(clone.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a.float(), b), name  # bf16 → fp32 is exact


def test_copy_keeps_class_mode_and_plain_transformers():
    model = tiny_model("gated_rms")
    model.train()
    clone = copy_model(model)
    assert type(clone) is HookedSAETransformer and clone.training
    plain = HookedTransformer(tiny_config("gelu_ln"))
    plain.eval()
    tokens = tiny_tokens(plain)
    twin = copy_model(plain)
    assert type(twin) is HookedTransformer and not twin.training
    with torch.no_grad():
        torch.testing.assert_close(twin(tokens), plain(tokens), rtol=0, atol=0)


def test_copy_refuses_attached_saes_and_non_models():
    from tl_query_lens import FFKV

    model = tiny_model("gelu_ln")
    with pytest.raises(InputError, match="HookedTransformer"):
        copy_model(torch.nn.Linear(2, 2))
    sae = FFKV.from_model(model, 0)
    model.add_sae(sae)
    with pytest.raises(InputError, match="reset_saes"):
        copy_model(model)
