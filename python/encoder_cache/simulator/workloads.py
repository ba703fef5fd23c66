"""Seeded, deterministic multimodal serving workloads.

A workload is a list of requests in arrival order. A request that continues a
chat session (``think`` is set) arrives ``think`` steps after the session's
previous request finished (a user reads the answer, then types), and never
before its ``arrival`` step; every other request arrives at its ``arrival``
step. Every random draw comes from one ``numpy.random.Generator`` seeded by
``WorkloadConfig.seed``, so the same config always gives the same workload.

Prompts follow a chat template and are described by content (``spec.py``):
every request starts with the deployment's one system prompt (the same
tokens for all); every multimodal item is wrapped in its modality's start and
end tokens, and all of its placeholder tokens receive an embedding. A chat
turn re-sends the whole conversation: its prompt is the previous turn's prompt
and answer, then the new message. A ``video`` request asks its question after
the frames; a ``popular`` one after its images.

Requests are generated as a stream (a heap holds the chat turns that arrive
later than the next session), so a workload of any size replays in constant
memory; one of at most ``KEEP_IN_MEMORY`` requests is generated once and kept.

The parameters, and the published traffic they are shaped after, are
documented in docs/simulator.md.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from encoder_cache.simulator.spec import Answer, Item, ItemSegment, RequestSpec, Segment, Text, own_text

__all__ = [
    "KEEP_IN_MEMORY",
    "KINDS",
    "Item",
    "RequestSpec",
    "Workload",
    "WorkloadConfig",
    "generate",
    "option",
]

KINDS = ("chat", "video", "popular", "mix")
#: Generated workloads up to this many requests are generated once and kept;
#: larger ones are generated again, as a stream, on every replay.
KEEP_IN_MEMORY = 200_000
#: The system prompt's content key: one per deployment, shared by every request.
SYSTEM_PROMPT = "system"
#: Session arrival rates (per scheduler step) that keep the default scheduler
#: busy, with a waiting queue at bursts, without swamping its KV cache.
DEFAULT_RATES = {"chat": 0.03, "video": 0.004, "popular": 0.3, "mix": 0.03}
Range = tuple[int, int]


def option(default: Any, help: str, metavar: str | None = None, flag: str | None = None, choices: Any = None) -> Any:
    """A config field, with what the command line's option for it needs."""
    return field(default=default, metadata={"help": help, "metavar": metavar, "flag": flag, "choices": choices})


def _finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")


@dataclass(frozen=True)
class WorkloadConfig:
    """Every knob of the generated traffic. Ranges are inclusive ``(min, max)``."""

    kind: str = option("mix", "the traffic", flag="--workload", choices=KINDS)
    requests: int = option(2000, "number of requests to generate (the scale)", "N")
    seed: int = option(0, "random seed: the same seed gives the same workload and the same counters", "N")
    arrival_rate: float | None = option(
        None,
        "new sessions per scheduler step, Poisson (default: "
        + ", ".join(f"{k} {r:g}" for k, r in DEFAULT_RATES.items())
        + ")",
        "RATE",
    )
    system_tokens: int = option(
        64, "tokens of the deployment's system prompt, the same at the start of every request", "N"
    )
    text_tokens: Range = option((16, 512), "text tokens of each user message")
    output_tokens: Range = option((16, 512), "tokens each request decodes")
    image_embeds: Range = option((256, 1280), "chat: encoder embeddings per image")
    turns: Range = option((2, 8), "chat: turns per conversation")
    images_per_turn: Range = option((0, 2), "chat: new images per turn (the first turn has at least one)")
    repeat_prob: float = option(
        0.3, "chat: chance that a turn re-attaches an earlier image (recent ones likelier)", "P"
    )
    think_steps: float = option(200.0, "chat: mean steps between an answer and the next turn", "STEPS")
    frames: Range = option((16, 64), "video: frame items per video")
    frame_embeds: Range = option((64, 256), "video: encoder embeddings per frame (drawn once per video)")
    video_catalogue: int = option(50, "video: distinct videos; a request picks one by Zipf popularity", "N")
    catalogue: int = option(1000, "popular: number of distinct images", "N")
    zipf: float = option(0.9, "popular and video: Zipf exponent of popularity", "S")
    popular_embeds: Range = option((64, 2560), "popular: embeddings per image, log-uniform (thumbnail to multi-tile)")
    popular_images: Range = option((1, 8), "popular: images per request, heavy-tailed (P(k) ~ k^-2.5 within the range)")
    mix: tuple[float, float, float] = option(
        (2.0, 1.0, 2.0), "mix: weights of chat, video and popular sessions", "C:V:P"
    )

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown workload {self.kind!r}; choose one of {', '.join(KINDS)}")
        if self.arrival_rate is None:
            object.__setattr__(self, "arrival_rate", DEFAULT_RATES[self.kind])
        for name in ("arrival_rate", "repeat_prob", "think_steps", "zipf"):
            _finite(name, getattr(self, name))
        for weight in self.mix:
            _finite("mix", weight)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "Range":
                lo, hi = value
                if not 0 <= lo <= hi:
                    raise ValueError(f"{f.name} must be a range MIN:MAX with 0 <= MIN <= MAX, got {lo}:{hi}")
        positive = {
            "requests": self.requests,
            "arrival_rate": self.arrival_rate,
            "catalogue": self.catalogue,
            "video_catalogue": self.video_catalogue,
            "image_embeds min": self.image_embeds[0],
            "frame_embeds min": self.frame_embeds[0],
            "popular_embeds min": self.popular_embeds[0],
            "output_tokens min": self.output_tokens[0],
            "turns min": self.turns[0],
            "frames min": self.frames[0],
            "popular_images min": self.popular_images[0],
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        for name in ("seed", "system_tokens", "think_steps", "zipf"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.repeat_prob <= 1.0:
            raise ValueError(f"repeat_prob must be in [0, 1], got {self.repeat_prob}")
        if self.popular_images[1] > self.catalogue:
            raise ValueError(
                f"popular_images max ({self.popular_images[1]}) exceeds the catalogue ({self.catalogue} images)"
            )
        if len(self.mix) != 3 or min(self.mix) < 0 or sum(self.mix) <= 0:
            raise ValueError(f"mix needs three weights >= 0 with a positive sum, got {self.mix}")

    @property
    def kinds(self) -> tuple[str, ...]:
        """The session kinds this workload draws from."""
        if self.kind != "mix":
            return (self.kind,)
        return tuple(k for k, w in zip(KINDS, self.mix) if w > 0)

    def max_embeds_per_item(self) -> dict[str, int]:
        """The largest item per modality the config allows."""
        largest: dict[str, int] = {}
        kinds = self.kinds
        if "chat" in kinds:
            largest["image"] = self.image_embeds[1]
        if "popular" in kinds:
            largest["image"] = max(largest.get("image", 0), self.popular_embeds[1])
        if "video" in kinds:
            largest["video"] = self.frame_embeds[1]
        return largest

    def describe(self) -> str:
        return (
            f"workload {self.kind}: {self.requests:,} requests, seed {self.seed}, {self.arrival_rate:g} sessions/step"
        )


@dataclass(frozen=True)
class Workload:
    """Requests in arrival order, with what the scheduler needs to size the
    encoder budget. ``specs`` None: generated from ``config`` as a stream."""

    config: Any  # WorkloadConfig, or a trace's description
    specs: tuple[RequestSpec, ...] | None = None

    def requests(self) -> Iterator[RequestSpec]:
        if self.specs is not None:
            return iter(self.specs)
        return _Generator(self.config).stream()

    @property
    def num_requests(self) -> int:
        return len(self.specs) if self.specs is not None else self.config.requests

    def max_embeds_per_item(self) -> dict[str, int]:
        """The largest item per modality: it stands for the model's declared
        maximum when vLLM sizes the encoder budget. Kept requests give the
        largest they hold (a trace knows no other, and the same rule keeps
        export and replay alike); a streamed workload, the largest its
        config allows."""
        if self.specs is None:
            return self.config.max_embeds_per_item()
        largest: dict[str, int] = {}
        for spec in self.specs:
            for item in spec.items:
                if largest.get(item.modality, 0) < item.length:
                    largest[item.modality] = item.length
        return largest

    def max_tokens(self) -> int | None:
        """The longest request's prompt and answer, if known without generating."""
        if self.specs is None:
            return None
        return max((s.total_tokens for s in self.specs), default=0)

    def describe(self) -> str:
        return self.config.describe()


class _Generator:
    def __init__(self, config: WorkloadConfig) -> None:
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        c = config
        lo, hi = np.log(c.popular_embeds[0]), np.log(c.popular_embeds[1] + 1)
        self.catalogue_embeds = [int(np.exp(self.rng.uniform(lo, hi))) for _ in range(c.catalogue)]
        self.popularity = self._zipf(c.catalogue)
        self.video_popularity = self._zipf(c.video_catalogue)
        self.videos: dict[int, tuple[int, int]] = {}  # video -> (frames, embeds per frame)
        counts = np.arange(c.popular_images[0], c.popular_images[1] + 1)
        weights = counts.astype(float) ** -2.5
        self.image_counts, self.image_count_p = counts, weights / weights.sum()
        self.system: tuple[Segment, ...] = (Text(SYSTEM_PROMPT, c.system_tokens),) if c.system_tokens else ()

    def _zipf(self, n: int) -> np.ndarray:
        weights = np.arange(1, n + 1, dtype=float) ** -self.config.zipf
        return weights / weights.sum()

    def draw(self, bounds: Range) -> int:
        return int(self.rng.integers(bounds[0], bounds[1] + 1))

    def chat(self, name: str, max_requests: int) -> list[tuple[RequestSpec, int]]:
        """One conversation: every turn re-sends the whole history, images
        included. Returns (spec without timing, think steps before it)."""
        c = self.config
        history: tuple[Segment, ...] = ()
        images: list[tuple[str, int]] = []
        out: list[tuple[RequestSpec, int]] = []
        think = 0
        for turn in range(min(self.draw(c.turns), max_requests)):
            message: list[Segment] = []
            if images and self.rng.random() < c.repeat_prob:
                # Users mostly refer back to recent images: each older one is half as likely.
                recency = 0.5 ** np.arange(len(images), 0, -1)
                identifier, embeds = images[int(self.rng.choice(len(images), p=recency / recency.sum()))]
                message.append(ItemSegment(identifier, embeds, "image"))
            new = self.draw(c.images_per_turn)
            for _ in range(max(new, 1) if turn == 0 else new):
                images.append((f"{name}-img{len(images)}", self.draw(c.image_embeds)))
                message.append(ItemSegment(images[-1][0], images[-1][1], "image"))
            message.append(Text(None, self.draw(c.text_tokens)))
            request_id = f"{name}-turn{turn}"
            # A turn's own segments (the first opens with the system prompt) are
            # keyed by their place among them, as a trace line lists them.
            segments = history + own_text(request_id, (*(() if history else self.system), *message))
            output = self.draw(c.output_tokens)
            out.append((RequestSpec.described(request_id, 0, name, None, segments, output), think))
            history = (*segments, Answer(request_id, output))
            think = int(self.rng.exponential(c.think_steps)) if c.think_steps else 0
        return out

    def video(self, name: str) -> RequestSpec:
        """A question about one video of a popular catalogue (its frames are the items), after the frames."""
        c = self.config
        video = int(self.rng.choice(c.video_catalogue, p=self.video_popularity))
        if video not in self.videos:
            self.videos[video] = (self.draw(c.frames), self.draw(c.frame_embeds))
        frames, embeds = self.videos[video]
        segments: list[Segment] = [ItemSegment(f"video{video}-frame{f}", embeds, "video") for f in range(frames)]
        segments.append(Text(None, self.draw(c.text_tokens)))
        prompt = own_text(name, (*self.system, *segments))
        return RequestSpec.described(name, 0, None, None, prompt, self.draw(c.output_tokens))

    def popular(self, name: str) -> RequestSpec:
        """Images of a popular catalogue, right after the system prompt, then the question."""
        c = self.config
        count = int(self.rng.choice(self.image_counts, p=self.image_count_p))
        segments: list[Segment] = [
            ItemSegment(f"popular{rank}", self.catalogue_embeds[rank], "image")
            for rank in self.rng.choice(c.catalogue, size=count, replace=False, p=self.popularity)
        ]
        segments.append(Text(None, self.draw(c.text_tokens)))
        prompt = own_text(name, (*self.system, *segments))
        return RequestSpec.described(name, 0, None, None, prompt, self.draw(c.output_tokens))

    def stream(self) -> Iterator[RequestSpec]:
        """The requests in arrival order (ties: in the order generated)."""
        c = self.config
        kinds = c.kinds
        weights = np.array([w for k, w in zip(KINDS, c.mix) if k in kinds]) if c.kind == "mix" else np.ones(1)
        weights = weights / weights.sum()
        remaining, clock, index, order = c.requests, 0.0, 0, 0
        later: list[tuple[int, int, RequestSpec]] = []  # (arrival, order generated, spec)
        while remaining > 0:
            clock += self.rng.exponential(1.0 / c.arrival_rate)
            arrival = int(clock)
            # Every request still to come arrives at ``arrival`` or later.
            while later and later[0][0] < arrival:
                yield heapq.heappop(later)[2]
            kind = kinds[int(self.rng.choice(len(kinds), p=weights))]
            name = f"{kind}{index}"
            if kind == "chat":
                turns = self.chat(name, remaining)
                for turn, (spec, think) in enumerate(turns):
                    if turn:
                        # Never before the previous turn's earliest arrival, one step, and the think time.
                        arrival += 1 + think
                    heapq.heappush(later, (arrival, order, _timed(spec, arrival, think if turn else None)))
                    order += 1
                remaining -= len(turns)
            else:
                spec = self.video(name) if kind == "video" else self.popular(name)
                heapq.heappush(later, (arrival, order, _timed(spec, arrival, None)))
                order += 1
                remaining -= 1
            index += 1
        while later:
            yield heapq.heappop(later)[2]


def _timed(spec: RequestSpec, arrival: int, think: int | None) -> RequestSpec:
    return replace(spec, arrival=arrival, think=think)


def generate(config: WorkloadConfig) -> Workload:
    """The workload ``config`` describes; the same config always gives the
    same one. Up to ``KEEP_IN_MEMORY`` requests it is generated now and kept;
    beyond, it is generated as a stream on each replay."""
    if config.requests > KEEP_IN_MEMORY:
        return Workload(config)
    return Workload(config, tuple(_Generator(config).stream()))
