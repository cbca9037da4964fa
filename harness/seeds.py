"""Per-trial seeds derived from the run's secret seed.

The solution's process only ever receives derived seeds, one trial at a time, so it can neither
replay the run nor know the inputs of a future trial.
"""
import hashlib
import secrets


def new_master_seed() -> int:
    return secrets.randbits(62)


def derive_seed(master: int, *parts) -> int:
    text = "/".join([str(master), *map(str, parts)]).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 2
