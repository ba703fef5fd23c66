"""Print an engine's cache events as JSON lines: ``python -m encoder_cache.events ENDPOINT``.

Each line is one batch: ``{"seq": ..., "timestamp": ..., "engine": ..., "events": [...]}``.
With ``--replay`` it first asks for the batches published before it
connected. It stops after ``--batches`` batches or ``--seconds`` seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import TextIO

from encoder_cache.events import wire
from encoder_cache.events.publisher import _zmq


def _print_batch(seq: int, payload: bytes, out: TextIO) -> None:
    timestamp, events, engine = wire.decode_batch(payload)
    out.write(json.dumps({"seq": seq, "timestamp": timestamp, "engine": engine, "events": events}) + "\n")
    out.flush()


def watch(
    endpoint: str,
    *,
    replay: str | None = None,
    topic: str = wire.DEFAULT_TOPIC,
    batches: int | None = None,
    seconds: float | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """Print batches from ``endpoint`` until ``batches`` were printed or ``seconds`` passed; returns how many."""
    zmq = _zmq()
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.connect(endpoint)
    printed, last = 0, -1
    deadline = None if seconds is None else time.monotonic() + seconds
    try:
        if replay is not None:
            dealer = context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(replay)
            dealer.send_multipart((b"", wire.encode_seq(0)))
            while (batches is None or printed < batches) and dealer.poll(2000):
                frames = dealer.recv_multipart()
                if len(frames) != 4 or wire.decode_seq(frames[2]) < 0:
                    break
                last = wire.decode_seq(frames[2])
                _print_batch(last, frames[3], out)
                printed += 1
            dealer.close(0)
        while batches is None or printed < batches:
            wait = 1000 if deadline is None else int(max(0.0, deadline - time.monotonic()) * 1000)
            if deadline is not None and wait == 0:
                break
            if not sub.poll(min(wait, 1000)):
                continue
            frames = sub.recv_multipart()
            if len(frames) != 3:
                continue
            seq = wire.decode_seq(frames[1])
            if seq <= last:
                continue  # replayed already
            last = seq
            _print_batch(seq, frames[2], out)
            printed += 1
    finally:
        sub.close(0)
        context.term()
    return printed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m encoder_cache.events", description=__doc__.splitlines()[0])
    parser.add_argument("endpoint", help="the engine's events_endpoint, e.g. tcp://10.0.0.5:5570")
    parser.add_argument("--replay", help="its events_replay_endpoint: print what was published before, first")
    parser.add_argument("--topic", default=wire.DEFAULT_TOPIC, help="events_topic (default %(default)s)")
    parser.add_argument("--batches", type=int, help="stop after this many batches")
    parser.add_argument("--seconds", type=float, help="stop after this many seconds")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        watch(args.endpoint, replay=args.replay, topic=args.topic, batches=args.batches, seconds=args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
