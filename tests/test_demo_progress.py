"""``tlql demo``'s overall progress line (step i of n, elapsed, a total rescaled by the measured steps, a warning naming
the option that shrinks a long step) and the estimate clock behind every estimate line: it times the pass's own first
forward batch, so a run makes exactly the forward batches it made without it."""

import logging

from tl_query_lens.demo_config import DemoConfig
from tl_query_lens.demo_progress import Progress, step_estimates
from tl_query_lens.estimates import BatchClock, clock, estimate


def test_total_is_rescaled_by_the_finished_steps_and_long_steps_name_their_option(caplog, monkeypatch):
    now = [100.0]
    monkeypatch.setattr("tl_query_lens.demo_progress.time.perf_counter", lambda: now[0])
    estimates = {"a": (30.0, "--x"), "b": (90.0, "--atlas-tokens"), "c": (20.0, "--n-eval")}
    rates = []
    progress = Progress(["a", "b", "c"], lambda rate: rates.append(rate) or estimates, start=100.0)
    with caplog.at_level(logging.INFO, logger="tl_query_lens.demo"):
        progress.begin(1, "a")
        now[0] = 110.0
        progress.timed(0.002)  # the first forward batch, 10 s in: 140 s estimated from the start
        now[0] = 160.0  # "a" took 60 s, twice its estimate: what is left (110 s estimated) becomes 220 s
        progress.end("a", 60.0)
        progress.begin(2, "b")
    lines = [r.getMessage() for r in caplog.records]
    assert rates == [0.002]
    assert lines[0] == "demo: step 1 of 3 (a); elapsed 0:00, estimated total after the first forward batch"
    assert lines[1] == "demo: first forward batch timed (0.002 s per token); estimated total 2:30"
    assert lines[2] == "demo: step 2 of 3 (b); elapsed 1:00, estimated total 4:40"
    assert lines[3] == "demo: b will take about 3:00; a smaller --atlas-tokens shrinks it"
    assert len(lines) == 4  # step "a" (30 s) gave no warning
    assert clock(3725) == "1:02:05"


def test_estimates_grow_with_the_sizes_that_shrink_them():
    quick, full = DemoConfig.quick(), DemoConfig()
    small, big = step_estimates(quick, 1e-3), step_estimates(full, 1e-3)
    for name in ("ffkv", "query_lens", "certify"):
        assert small[name][0] < big[name][0]
    assert big["certify"][1] == "--n-eval" and big["query_lens"][1] == "--atlas-tokens"


def test_the_clock_times_the_first_real_batch_and_adds_none(caplog, monkeypatch):
    from tests.helpers import count_forwards, tiny_model, tiny_tokens

    model = tiny_model("gelu_ln")
    calls = count_forwards(model, monkeypatch)
    ticks = iter([10.0, 12.5])  # the first and second batch start; later ones must not read the clock
    monkeypatch.setattr("tl_query_lens.estimates.time.perf_counter", lambda: next(ticks))
    seen = []
    with caplog.at_level(logging.INFO, logger="tl_query_lens.estimate"):
        with estimate("pass", 3, "--n").on_forward(model):
            for seed in range(3):
                model.run_with_hooks(tiny_tokens(model, 4, 8, seed=seed), fwd_hooks=[])  # resets TL's hooks
                seen.append([r.getMessage() for r in caplog.records])
        model(tiny_tokens(model, 4, 8))  # outside the block: the clock's hook is gone
    assert calls == [32, 32, 32, 32]  # the caller's four batches, nothing more
    line = "pass: estimated wall time 0:08 (3 forward batches at 2.5 s each, as the first took here); a smaller --n"
    assert seen == [[], [line + " shrinks it"], [line + " shrinks it"]]  # once, right after the first batch
    assert not model.hook_embed._forward_pre_hooks


def test_a_clock_over_several_first_batches_reports_their_mean(monkeypatch):
    ticks = iter([0.0, 1.0, 5.0])
    monkeypatch.setattr("tl_query_lens.estimates.time.perf_counter", lambda: next(ticks))
    got = []
    clock_ = BatchClock(lambda seconds, tokens: got.append((seconds, tokens)), n_first=2)
    for tokens in (10, 30, 99, 99):
        clock_.tick(tokens)
    assert got == [(2.5, 20.0)]


def test_the_demo_runs_only_its_steps_forward_batches(tmp_path, monkeypatch, caplog):
    """run_demo with its four steps replaced by one forward batch each: four forward calls in all (the old extra timing
    passes added two), and the first progress total comes right after the first of them (as the second starts)."""
    from tests.helpers import count_forwards, tiny_model, tiny_tokens
    from tl_query_lens import demo
    from tl_query_lens.report.html import Section

    model = tiny_model("gelu_ln")
    calls = count_forwards(model, monkeypatch)
    monkeypatch.setattr(demo, "load_model", lambda name: model)
    totals_at = []

    def step(name):
        def run(model, cfg, tracker):
            model(tiny_tokens(model, 2, 8))
            totals_at.append(sum("first forward batch timed" in r.getMessage() for r in caplog.records))
            return (Section(name), tmp_path) if name == "_query_lens_step" else Section(name)  # + its export folder

        return run

    for name in ("_ffkv_step", "_query_lens_step", "_readout_step", "_certify_step"):
        monkeypatch.setattr(demo, name, step(name))
    with caplog.at_level(logging.INFO, logger="tl_query_lens.demo"):
        demo.run_demo(demo.DemoConfig.quick(out=tmp_path, use_wandb=False))
    assert calls == [16, 16, 16, 16]
    assert totals_at == [0, 1, 1, 1]
