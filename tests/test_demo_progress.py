"""``tlql demo``'s overall progress line: step i of n, elapsed, a total rescaled by the measured steps, and a
warning naming the option that shrinks a step estimated over a minute."""

import logging

from tl_query_lens.demo_config import DemoConfig
from tl_query_lens.demo_progress import Progress, clock, step_estimates


def test_total_is_rescaled_by_the_finished_steps_and_long_steps_name_their_option(caplog, monkeypatch):
    now = [100.0]
    monkeypatch.setattr("tl_query_lens.demo_progress.time.perf_counter", lambda: now[0])
    progress = Progress({"a": (30.0, "--x"), "b": (90.0, "--atlas-tokens"), "c": (20.0, "--n-eval")}, start=100.0)
    with caplog.at_level(logging.INFO, logger="tl_query_lens.demo"):
        progress.begin(1, "a")
        now[0] = 160.0  # "a" took 60 s, twice its estimate: what is left (110 s estimated) becomes 220 s
        progress.end("a", 60.0)
        progress.begin(2, "b")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "demo: step 1 of 3 (a); elapsed 0:00, estimated total 2:20"
    assert lines[1] == "demo: step 2 of 3 (b); elapsed 1:00, estimated total 4:40"
    assert lines[2] == "demo: b will take about 3:00; a smaller --atlas-tokens shrinks it"
    assert len(lines) == 3  # step "a" (30 s) gave no warning
    assert clock(3725) == "1:02:05"


def test_estimates_grow_with_the_sizes_that_shrink_them():
    quick, full = DemoConfig.quick(), DemoConfig()
    small, big = step_estimates(quick, 1e-3), step_estimates(full, 1e-3)
    for name in ("ffkv", "query_lens", "certify"):
        assert small[name][0] < big[name][0]
    assert big["certify"][1] == "--n-eval" and big["query_lens"][1] == "--atlas-tokens"
