"""Module-level (picklable) pieces for the shard cache tests: deterministic payloads, fetch
callables that log every download to a file (O_APPEND lines, so processes can share it), the
entry points of the processes the tests start, and probes of the cache folder."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import time
from dataclasses import dataclass
from typing import BinaryIO

import crc32c

from stoker.storage import ShardCache


def payload(key: str, size: int) -> bytes:
    """The bytes of object ``key``: the same in every process."""
    return hashlib.shake_256(key.encode()).digest(size)


def crc_of(key: str, size: int) -> int:
    return crc32c.crc32c(payload(key, size))


def log_line(log: str, text: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def logged(log: str) -> list[str]:
    """The keys of the downloads logged so far, in order."""
    try:
        with open(log) as f:
            return [line.split()[0] for line in f if line.strip()]
    except FileNotFoundError:
        return []


@dataclass(frozen=True)
class LoggedFetch:
    """Writes ``payload(key, size)`` in two halves, sleeping ``delay`` s between them; logs
    each call. ``bad`` calls (counted in the log) write wrong bytes of the right size first;
    ``short`` makes them write half the bytes instead."""

    key: str
    size: int
    log: str
    delay: float = 0.0
    bad: int = 0
    short: bool = False

    def __call__(self, out: BinaryIO) -> None:
        calls = logged(self.log).count(self.key)
        log_line(self.log, f"{self.key} {os.getpid()}")
        data = payload(self.key, self.size)
        if calls < self.bad:
            data = data[: self.size // 2] if self.short else bytes(b ^ 0xFF for b in data)
        half = len(data) // 2
        out.write(data[:half])
        out.flush()
        if self.delay:
            time.sleep(self.delay)
        out.write(data[half:])


@dataclass(frozen=True)
class HangingFetch:
    """Writes half the object, creates ``ready``, then sleeps (to be killed mid-download)."""

    key: str
    size: int
    ready: str

    def __call__(self, out: BinaryIO) -> None:
        out.write(payload(self.key, self.size)[: self.size // 2])
        out.flush()
        touch(self.ready)
        time.sleep(600)


def reader_main(
    root: str, limit: int, keys: list[str], size: int, log: str, out: str, seed: int, go: str
) -> None:
    """One "rank x worker": once ``go`` exists, gets every key in its own random order, reading
    each file whole while pinned; writes {key: sha256 of what it read} to ``out``."""
    cache = ShardCache(root, limit)
    order = list(keys)
    random.Random(seed).shuffle(order)
    wait_for(go)
    seen = {}
    for key in order:
        fetch = LoggedFetch(key, size, log, delay=0.02)
        with cache.get(key, size=size, crc32c=crc_of(key, size), fetch=fetch, name=key) as pin:
            with open(pin.path, "rb") as f:
                seen[key] = hashlib.sha256(f.read()).hexdigest()
    with open(out, "w") as f:
        json.dump(seen, f)


def churn_main(root: str, limit: int, keys: list[str], size: int, log: str, rounds: int, seed: int):
    """Many gets in random order, each pin held while the file is read."""
    cache = ShardCache(root, limit)
    rng = random.Random(seed)
    for _ in range(rounds):
        key = rng.choice(keys)
        fetch = LoggedFetch(key, size, log, delay=0.002)
        with cache.get(key, size=size, crc32c=crc_of(key, size), fetch=fetch) as pin:
            with open(pin.path, "rb") as f:
                if f.read() != payload(key, size):
                    raise AssertionError(f"{key}: the cached bytes differ from the object")


def hold_pin_main(root: str, limit: int, key: str, size: int, log: str, ready: str, release: str):
    """Pins ``key``, creates ``ready``, and keeps the pin until ``release`` exists."""
    cache = ShardCache(root, limit)
    fetch = LoggedFetch(key, size, log)
    with cache.get(key, size=size, crc32c=crc_of(key, size), fetch=fetch, name=f"shard {key}"):
        touch(ready)
        deadline = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)


def hang_main(root: str, limit: int, key: str, size: int, ready: str) -> None:
    cache = ShardCache(root, limit)
    cache.get(key, size=size, crc32c=crc_of(key, size), fetch=HangingFetch(key, size, ready))


def du(root: str) -> int:
    """The bytes of every file under ``root`` (st_size; files vanishing meanwhile skipped).
    ``entries/`` is listed before ``tmp/``: files only move from ``tmp/`` to ``entries/``, so a
    file renamed during the walk is missed rather than counted twice."""
    total = 0
    subs = ["entries", "tmp"]
    subs += sorted(set(os.listdir(root)) - set(subs)) if os.path.isdir(root) else []
    for sub in subs:
        if os.path.isfile(os.path.join(root, sub)):
            total += os.lstat(os.path.join(root, sub)).st_size
        for folder, _, names in os.walk(os.path.join(root, sub)):
            for name in names:
                try:
                    total += os.lstat(os.path.join(folder, name)).st_size
                except FileNotFoundError:
                    pass
    return total


def pinned(root: str, key: str) -> bool:
    """True while some process holds ``key``'s entry lock (a pin or a download)."""
    try:
        fd = os.open(os.path.join(root, "locks", key), os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def wait_for(path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.002)


def touch(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
