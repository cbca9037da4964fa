"""Per-trial seeds derived from the run's secret seed.

Only the parent ever holds a seed: it draws every input itself and shares the tensors, so the
solution's process can neither replay the run nor know the inputs of a future call.
"""
import hashlib
import secrets


def new_master_seed() -> int:
    return secrets.randbits(62)


def derive_seed(master: int, *parts) -> int:
    # surrogateescape: a file name that is not UTF-8 comes back from the OS with lone surrogates
    text = "/".join([str(master), *map(str, parts)]).encode("utf-8", "surrogateescape")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 2
