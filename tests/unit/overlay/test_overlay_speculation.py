"""The adaptive speculation-depth controller: 2 or 4 tokens from a 32-round acceptance window."""

import pytest

from overlay.speculation import AdaptiveDepth, AdaptiveLookup, make_scheduler_init, make_spec_decoding_stats


def feed(ctl: AdaptiveDepth, rounds: int, accepted_of_depth: float) -> list[int]:
    """Rounds where the target accepts ``accepted_of_depth`` of the current depth's drafts."""
    return [ctl.observe(ctl.depth, round(ctl.depth * accepted_of_depth)) for _ in range(rounds)]


def test_starts_deep_and_decides_only_on_a_full_window() -> None:
    ctl = AdaptiveDepth()
    assert ctl.depth == 4 and ctl.window == 32
    assert feed(ctl, 31, 0.0) == [4] * 31 and ctl.acceptance_rate is None
    assert ctl.observe(4, 0) == 2 and ctl.switches == 1


def test_low_acceptance_goes_shallow_high_goes_back_deep() -> None:
    ctl = AdaptiveDepth()
    feed(ctl, 32, 0.25)
    assert ctl.depth == 2
    # the shallow depth is judged on its own, fresh window
    assert ctl.acceptance_rate is None
    assert feed(ctl, 31, 1.0)[-1] == 2
    assert ctl.observe(2, 2) == 4 and ctl.switches == 2


def test_hysteresis_holds_the_depth_between_the_thresholds() -> None:
    ctl = AdaptiveDepth()
    feed(ctl, 64, 0.5)  # 0.5 is between lower_at 0.4 and raise_at 0.6: stay deep
    assert ctl.depth == 4 and ctl.switches == 0
    shallow = AdaptiveDepth(depth=2)
    feed(shallow, 64, 0.5)
    assert shallow.depth == 2 and shallow.switches == 0


def test_window_slides_over_the_last_rounds() -> None:
    ctl = AdaptiveDepth()
    feed(ctl, 20, 1.0)
    feed(ctl, 12, 0.25)  # 20 good + 12 poor rounds: (80 + 12) / 128 = 0.72, stay deep
    assert ctl.depth == 4 and ctl.acceptance_rate == pytest.approx(92 / 128)
    feed(ctl, 9, 0.25)  # 11 good, 21 poor rounds: (44 + 21) / 128 = 0.51, stay deep
    assert ctl.depth == 4
    feed(ctl, 5, 0.25)  # 6 good, 26 poor: (24 + 26) / 128 = 0.39 -> shallow
    assert ctl.depth == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shallow": 4, "deep": 2}, "0 < shallow"),
        ({"lower_at": 0.7}, "lower_at"),
        ({"window": 0}, "window"),
        ({"depth": 3}, "initial depth 3"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AdaptiveDepth(**kwargs)


def test_impossible_rounds_are_refused() -> None:
    with pytest.raises(ValueError, match=r"accepted 5 must be within 0\.\.proposed 4"):
        AdaptiveDepth().observe(4, 5)


class Scheduler:
    """The two members of vLLM's Scheduler the patches touch, with upstream's behaviour."""

    def __init__(self, num_spec_tokens: int) -> None:
        self.num_spec_tokens = num_spec_tokens
        self.dynamic_sd_lookup = None
        self.seen: list[tuple[int, int]] = []

    def make_spec_decoding_stats(self, stats, num_draft_tokens, num_accepted_tokens, invalid, request_id):
        self.seen.append((num_draft_tokens, num_accepted_tokens))
        return stats


def test_scheduler_patches_schedule_the_controllers_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKRING_SPEC_ADAPTIVE_WINDOW", "32")
    init = make_scheduler_init(Scheduler.__init__)
    stats = make_spec_decoding_stats(Scheduler.make_spec_decoding_stats)
    sched = Scheduler.__new__(Scheduler)
    init(sched, 4)
    assert isinstance(sched.dynamic_sd_lookup, AdaptiveLookup)
    assert sched.dynamic_sd_lookup[7] == 4  # any batch size: the controller's depth
    for _ in range(32):
        assert stats(sched, "s", 4, 1, None, "r") == "s"  # upstream still runs and returns
    assert sched.dynamic_sd_lookup[1] == 2 and len(sched.seen) == 32


def test_scheduler_patch_refuses_a_draft_count_it_cannot_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKRING_SPEC_ADAPTIVE_WINDOW", "32")
    sched = Scheduler.__new__(Scheduler)
    with pytest.raises(ValueError, match="set num_speculative_tokens to 4, not 3"):
        make_scheduler_init(Scheduler.__init__)(sched, 3)
    monkeypatch.delenv("SPARKRING_SPEC_ADAPTIVE_WINDOW")
    make_scheduler_init(Scheduler.__init__)(sched, 3)
    assert sched.dynamic_sd_lookup is None  # not asked for: upstream's fixed depth
