"""Adaptive speculation depth: 2 or 4 draft tokens per round from the recent acceptance rate.

Deep drafts pay off only while the target model accepts most of them: at a low acceptance
rate the extra draft steps (and the verification of tokens that get rejected) cost more
than they return. The controller looks at the last ``window`` rounds (32) of the depth it
is running, and switches between ``shallow`` (2) and ``deep`` (4) with hysteresis so one
noisy window does not flip it back and forth. After a switch the window starts empty: the
new depth is judged on its own rounds. The caller executes only ``depth`` draft steps.

In vLLM 0.32 the controller drives the scheduler's per-step draft count (``AdaptiveLookup``),
fed by every verified round (``make_spec_decoding_stats``); ``SPARKRING_SPEC_ADAPTIVE_WINDOW``
(the launch profile's adaptive window) switches it on.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from overlay.recorder import RECORDER


@dataclass
class AdaptiveDepth:
    """Feed ``observe(proposed, accepted)`` once per round; read ``depth`` before drafting."""

    window: int = 32
    shallow: int = 2
    deep: int = 4
    # Switch up when the window accepts at least `raise_at` of its drafts, down below `lower_at`.
    raise_at: float = 0.6
    lower_at: float = 0.4
    depth: int = 4
    _rounds: deque[tuple[int, int]] = field(default_factory=deque, repr=False)
    switches: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.shallow < self.deep:
            raise ValueError(f"depths must satisfy 0 < shallow ({self.shallow}) < deep ({self.deep})")
        if not 0 <= self.lower_at < self.raise_at <= 1:
            raise ValueError(f"need 0 <= lower_at ({self.lower_at}) < raise_at ({self.raise_at}) <= 1")
        if self.window < 1:
            raise ValueError(f"window {self.window} must be at least one round")
        if self.depth not in (self.shallow, self.deep):
            raise ValueError(f"initial depth {self.depth} is neither {self.shallow} nor {self.deep}")
        self._rounds = deque(maxlen=self.window)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed draft tokens over the window; None until the window is full."""
        if len(self._rounds) < self.window:
            return None
        proposed = sum(p for p, _ in self._rounds)
        return sum(a for _, a in self._rounds) / proposed if proposed else 0.0

    def observe(self, proposed: int, accepted: int) -> int:
        """Record one verification round; returns the depth for the next round."""
        if not 0 <= accepted <= proposed:
            raise ValueError(f"accepted {accepted} must be within 0..proposed {proposed}")
        self._rounds.append((proposed, accepted))
        rate = self.acceptance_rate
        if rate is None:
            return self.depth
        target = self.depth
        if self.depth == self.shallow and rate >= self.raise_at:
            target = self.deep
        elif self.depth == self.deep and rate < self.lower_at:
            target = self.shallow
        if target != self.depth:
            self.depth, self.switches = target, self.switches + 1
            self._rounds.clear()
        return self.depth


class AdaptiveLookup:
    """Stands in for vLLM 0.32's dynamic-speculation table (``Scheduler.dynamic_sd_lookup``).

    The scheduler reads ``lookup[batch_size]`` every step as the number of draft tokens to
    schedule, and the drafter then runs exactly that many steps (n-gram, draft model, MTP,
    EAGLE alike): so answering with the controller's depth executes only the selected depth.
    Drafts are proposed one step before they are verified, so the round right after a switch
    still verifies the previous depth's drafts.
    """

    def __init__(self, controller: AdaptiveDepth) -> None:
        self.controller = controller

    def __getitem__(self, batch_size: int) -> int:
        return self.controller.depth


def make_scheduler_init(stock: Callable[..., None]) -> Callable[..., None]:
    """Wrap ``Scheduler.__init__``: with ``SPARKRING_SPEC_ADAPTIVE_WINDOW`` set, drive the depth."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        stock(self, *args, **kwargs)
        window = os.environ.get("SPARKRING_SPEC_ADAPTIVE_WINDOW")
        if not window or not self.num_spec_tokens:
            return
        controller = AdaptiveDepth(window=int(window))
        if self.num_spec_tokens != controller.deep:
            raise ValueError(
                f"adaptive speculation switches between {controller.shallow} and {controller.deep} tokens: "
                f"set num_speculative_tokens to {controller.deep}, not {self.num_spec_tokens}"
            )
        self.dynamic_sd_lookup = AdaptiveLookup(controller)

    __init__.__wrapped__ = stock  # type: ignore[attr-defined]
    return __init__


def make_spec_decoding_stats(stock: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``Scheduler.make_spec_decoding_stats``: every verified request-round feeds the controller."""

    def make_spec_decoding_stats(
        self: Any,
        spec_decoding_stats: Any,
        num_draft_tokens: int,
        num_accepted_tokens: int,
        num_invalid_spec_tokens: dict[str, int] | None,
        request_id: str,
    ) -> Any:
        lookup = self.dynamic_sd_lookup
        if isinstance(lookup, AdaptiveLookup) and num_draft_tokens:
            depth = lookup.controller.depth
            RECORDER.count(f"spec.rounds.depth{depth}")
            if num_draft_tokens > depth:  # proposed before a switch down, verified after it
                RECORDER.count("spec.rounds_over_depth")
            proposed = num_draft_tokens - (num_invalid_spec_tokens or {}).get(request_id, 0)
            lookup.controller.observe(proposed, min(num_accepted_tokens, proposed))
            RECORDER.counters["spec.switches"] = lookup.controller.switches
        return stock(
            self,
            spec_decoding_stats,
            num_draft_tokens,
            num_accepted_tokens,
            num_invalid_spec_tokens,
            request_id,
        )

    make_spec_decoding_stats.__wrapped__ = stock  # type: ignore[attr-defined]
    return make_spec_decoding_stats
