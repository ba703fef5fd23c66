"""Seeded, deterministic multimodal serving workloads.

A workload is a list of sessions. A session arrives at a step drawn from a
Poisson process and sends its requests one after another: request ``i + 1``
arrives ``think[i]`` steps after request ``i`` finished (a chat user reads the
answer, then types the next turn). Every random draw comes from one
``numpy.random.Generator`` seeded by ``WorkloadConfig.seed``, so the same
config always gives the same workload.

Prompt layout: every multimodal item is wrapped in one start and one end token
(as vision-language chat templates do), and all of an item's placeholder
tokens receive an embedding.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

__all__ = [
    "KINDS",
    "Item",
    "RequestSpec",
    "Session",
    "Workload",
    "WorkloadConfig",
    "generate",
    "option",
]

KINDS = ("chat", "video", "popular", "mix")
#: Session arrival rates that load the default scheduler without swamping its KV cache.
DEFAULT_RATES = {"chat": 0.05, "video": 0.02, "popular": 0.5, "mix": 0.1}
Range = tuple[int, int]


def option(default: Any, help: str, metavar: str | None = None, flag: str | None = None, choices: Any = None) -> Any:
    """A config field, with what the command line's option for it needs."""
    return field(default=default, metadata={"help": help, "metavar": metavar, "flag": flag, "choices": choices})


@dataclass(frozen=True)
class WorkloadConfig:
    """Every knob of the generated traffic. Ranges are inclusive ``(min, max)``."""

    kind: str = option("chat", "the traffic", flag="--workload", choices=KINDS)
    requests: int = option(2000, "number of requests to generate (the scale)", "N")
    seed: int = option(0, "random seed: the same seed gives the same workload and the same counters", "N")
    arrival_rate: float | None = option(
        None,
        "new sessions per scheduler step, Poisson (default: "
        + ", ".join(f"{k} {r:g}" for k, r in DEFAULT_RATES.items())
        + ")",
        "RATE",
    )
    system_tokens: int = option(64, "system-prompt tokens at the start of every request", "N")
    text_tokens: Range = option((16, 256), "text tokens of each user message")
    output_tokens: Range = option((16, 256), "tokens each request decodes")
    image_embeds: Range = option((256, 1280), "encoder embeddings per image")
    turns: Range = option((2, 8), "chat: turns per conversation")
    images_per_turn: Range = option((0, 2), "chat: new images per turn (the first turn has at least one)")
    repeat_prob: float = option(
        0.5, "chat: chance that a turn re-attaches an earlier image (recent ones likelier)", "P"
    )
    think_steps: float = option(20.0, "chat: mean steps between an answer and the next turn", "STEPS")
    frames: Range = option((100, 300), "video: frame items per video")
    frame_embeds: Range = option((64, 256), "video: encoder embeddings per frame (drawn once per video)")
    catalogue: int = option(32, "popular: number of distinct popular images", "N")
    zipf: float = option(1.1, "popular: Zipf exponent of image popularity", "S")
    popular_images: Range = option((1, 2), "popular: images per request")
    mix: tuple[float, float, float] = option(
        (2.0, 1.0, 2.0), "mix: weights of chat, video and popular sessions", "C:V:P"
    )

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown workload {self.kind!r}; choose one of {', '.join(KINDS)}")
        if self.arrival_rate is None:
            object.__setattr__(self, "arrival_rate", DEFAULT_RATES[self.kind])
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
            "image_embeds min": self.image_embeds[0],
            "frame_embeds min": self.frame_embeds[0],
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
        """The largest item per modality, as a model would declare it for the encoder budget."""
        largest = {}
        if {"chat", "popular"} & set(self.kinds):
            largest["image"] = self.image_embeds[1]
        if "video" in self.kinds:
            largest["video"] = self.frame_embeds[1]
        return largest


@dataclass(frozen=True)
class Item:
    identifier: str
    offset: int
    length: int
    modality: str


@dataclass(frozen=True)
class RequestSpec:
    request_id: str
    prompt_tokens: int
    output_tokens: int
    items: tuple[Item, ...]  # sorted by offset

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True)
class Session:
    arrival: int
    requests: tuple[RequestSpec, ...]
    think: tuple[int, ...]  # steps before request i + 1 arrives, after request i finished


@dataclass(frozen=True)
class Workload:
    config: WorkloadConfig
    sessions: tuple[Session, ...]

    @property
    def requests(self) -> Iterator[RequestSpec]:
        return (r for s in self.sessions for r in s.requests)

    @property
    def num_requests(self) -> int:
        return sum(len(s.requests) for s in self.sessions)


class _Prompt:
    """Lays out text and items, one start and one end token around each item."""

    def __init__(self, system_tokens: int) -> None:
        self.length = system_tokens
        self.items: list[Item] = []

    def text(self, tokens: int) -> None:
        self.length += tokens

    def item(self, identifier: str, embeds: int, modality: str) -> None:
        self.items.append(Item(identifier, self.length + 1, embeds, modality))
        self.length += embeds + 2

    def spec(self, request_id: str, output_tokens: int) -> RequestSpec:
        return RequestSpec(request_id, self.length, output_tokens, tuple(self.items))


class _Generator:
    def __init__(self, config: WorkloadConfig) -> None:
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        c = config
        self.catalogue_embeds = [self.draw(c.image_embeds) for _ in range(c.catalogue)]
        ranks = np.arange(1, c.catalogue + 1, dtype=float)
        weights = ranks**-c.zipf
        self.popularity = weights / weights.sum()

    def draw(self, bounds: Range) -> int:
        return int(self.rng.integers(bounds[0], bounds[1] + 1))

    def chat(self, name: str, max_requests: int) -> tuple[list[RequestSpec], list[int]]:
        """One conversation: every turn re-sends the whole history, images included."""
        c = self.config
        history: list[tuple[str, int, str]] = []  # (kind, size, identifier): "text" or "image"
        images: list[tuple[str, int]] = []
        specs, think = [], []
        for turn in range(min(self.draw(c.turns), max_requests)):
            message: list[tuple[str, int, str]] = []
            if images and self.rng.random() < c.repeat_prob:
                # Users mostly refer back to recent images: each older one is half as likely.
                recency = 0.5 ** np.arange(len(images), 0, -1)
                identifier, embeds = images[int(self.rng.choice(len(images), p=recency / recency.sum()))]
                message.append(("image", embeds, identifier))
            new = self.draw(c.images_per_turn)
            for _ in range(max(new, 1) if turn == 0 else new):
                images.append((f"{name}-img{len(images)}", self.draw(c.image_embeds)))
                message.append(("image", images[-1][1], images[-1][0]))
            message.append(("text", self.draw(c.text_tokens), ""))
            prompt = _Prompt(c.system_tokens)
            for kind, size, identifier in history + message:
                if kind == "text":
                    prompt.text(size)
                else:
                    prompt.item(identifier, size, "image")
            output = self.draw(c.output_tokens)
            specs.append(prompt.spec(f"{name}-turn{turn}", output))
            history += [*message, ("text", output, "")]
            think.append(int(self.rng.exponential(c.think_steps)) if c.think_steps else 0)
        return specs, think[:-1]

    def video(self, name: str) -> RequestSpec:
        c = self.config
        prompt = _Prompt(c.system_tokens)
        embeds = self.draw(c.frame_embeds)
        for frame in range(self.draw(c.frames)):
            prompt.item(f"{name}-frame{frame}", embeds, "video")
        prompt.text(self.draw(c.text_tokens))
        return prompt.spec(name, self.draw(c.output_tokens))

    def popular(self, name: str) -> RequestSpec:
        c = self.config
        prompt = _Prompt(c.system_tokens)
        count = self.draw(c.popular_images)
        for rank in self.rng.choice(c.catalogue, size=count, replace=False, p=self.popularity):
            prompt.item(f"popular{rank}", self.catalogue_embeds[rank], "image")
        prompt.text(self.draw(c.text_tokens))
        return prompt.spec(name, self.draw(c.output_tokens))

    def sessions(self) -> Iterator[Session]:
        c = self.config
        kinds = c.kinds
        weights = np.array([w for k, w in zip(KINDS, c.mix) if k in kinds]) if c.kind == "mix" else np.ones(1)
        weights = weights / weights.sum()
        remaining, clock, index = c.requests, 0.0, 0
        while remaining > 0:
            clock += self.rng.exponential(1.0 / c.arrival_rate)
            kind = kinds[int(self.rng.choice(len(kinds), p=weights))]
            name = f"{kind}{index}"
            if kind == "chat":
                specs, think = self.chat(name, remaining)
            else:
                specs, think = [self.video(name) if kind == "video" else self.popular(name)], []
            yield Session(int(clock), tuple(specs), tuple(think))
            remaining -= len(specs)
            index += 1


def generate(config: WorkloadConfig) -> Workload:
    """The workload ``config`` describes; the same config always gives the same one."""
    return Workload(config, tuple(_Generator(config).sessions()))
