"""The parent-child channel: length-prefixed JSON frames over raw pipes, each one authenticated.

The parent never unpickles, imports or executes anything the child sends: a frame is a length, an
HMAC-SHA256 tag and UTF-8 JSON, nothing else. The key is made by the parent and handed to the child
in its first frame, before any solution code exists in that process; the child keeps it in a closure.
Each direction counts its frames and the count is part of the tag, so a frame cannot be replayed,
reordered or forged by code in the child that finds the pipe's file descriptor. Anything malformed
raises ChannelError, which the parent turns into a rejection, never a crash of its own.

Tensors never travel here. The parent describes its own shared tensors (CUDA IPC handles, or files in
shared memory on the CPU) as plain data and the child maps them with `open_shared` alone.
"""
from __future__ import annotations

import base64
import hmac
import json
import os
import select
import struct
import time

MAX_FRAME = 16 * 2**20
FRAME_SECONDS = 60.0  # a frame that has begun must be whole within this
_HEADER = struct.Struct(">I")
_TAG = 32


class ChannelError(Exception):
    """A frame was malformed, forged, out of order or too large, or the other end went away."""


def new_key() -> bytes:
    return os.urandom(32)


def _read_exact(fd: int, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise ChannelError("the other end closed the channel")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def open_channel(read_fd: int, write_fd: int, key: bytes) -> tuple:
    """One end of the channel as two closures, (send, recv): frames out on `write_fd`, frames in on
    `read_fd`, both tagged with `key`. Everything they use is bound now, at C level where it can be (the
    JSON encoder and scanner of _json, HMAC from _hashlib, os.read/os.write): no class whose attribute
    lookup or methods a solution could replace stands between a message and its tag, and the key lives
    only in these closures' cells."""
    import _hashlib
    import _json
    import types

    digest, compare, write, read, wait = _hashlib.hmac_digest, hmac.compare_digest, os.write, os.read, select.select
    pack, unpack, now = _HEADER.pack, _HEADER.unpack, time.monotonic
    header, tag_size, limit = _HEADER.size, _TAG, MAX_FRAME

    def refuse(value):
        raise TypeError(f"{type(value).__name__} cannot travel on the channel")

    encode = _json.make_encoder(None, refuse, _json.encode_basestring_ascii, None, ":", ",", False, False, True)
    constants = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
    scan = _json.make_scanner(types.SimpleNamespace(strict=True, object_hook=None, object_pairs_hook=None, parse_float=float,
                                                    parse_int=int, parse_constant=constants.__getitem__, memo={}))
    counts = [0, 0]  # frames sent, frames received

    def tag(counter: int, payload: bytes) -> bytes:
        return digest(key, counter.to_bytes(8, "big") + payload, "sha256")

    def read_exact(n: int, deadline) -> bytes:
        chunks, got = [], 0
        while got < n:
            if deadline is not None:
                left = deadline - now()
                if left <= 0 or not wait([read_fd], [], [], left)[0]:
                    raise TimeoutError
            chunk = read(read_fd, min(n - got, 1 << 20))
            if not chunk:
                raise ChannelError("the other end closed the channel")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def send(message: dict) -> None:
        payload = "".join(encode(message, 0)).encode()
        frame = pack(len(payload)) + tag(counts[0], payload) + payload
        counts[0] += 1
        view = memoryview(frame)
        while view:
            view = view[write(write_fd, view):]

    def recv(timeout: float | None = None) -> dict:
        """The next message; TimeoutError when none began to arrive in `timeout` seconds (None: wait).
        Once a frame has begun it is read whole (a frame cut short is an error, never a timeout that
        would leave the stream in the middle of a frame)."""
        if not wait([read_fd], [], [], timeout)[0]:  # None: as long as it takes (the child between requests)
            raise TimeoutError
        deadline = now() + FRAME_SECONDS  # from the frame's first byte, never from the wait before it
        try:
            (length,) = unpack(read_exact(header, deadline))
            if length > limit:
                raise ChannelError(f"a frame of {length} bytes (the limit is {limit})")
            tagged = read_exact(tag_size, deadline)
            payload = read_exact(length, deadline)
        except TimeoutError:
            raise ChannelError(f"a frame was cut short (not whole after {FRAME_SECONDS:.0f} s)") from None
        if not compare(tagged, tag(counts[1], payload)):
            raise ChannelError("a frame failed authentication (forged, replayed or out of order)")
        counts[1] += 1
        try:
            text = payload.decode()
            message, end = scan(text, 0)
        except (UnicodeDecodeError, ValueError, StopIteration, RecursionError, MemoryError) as error:
            # RecursionError: a frame nested deeper than the scanner goes (tens of thousands of "[")
            raise ChannelError(f"a frame is not JSON: {type(error).__name__}: {str(error)[:200]}") from None
        if end != len(text) or not isinstance(message, dict):
            raise ChannelError("a frame is not one JSON object")
        return message

    return send, recv


def send_plain(fd: int, message: dict) -> None:
    """The first frame (parent to child): it carries the key, so it is not tagged."""
    payload = json.dumps(message).encode()
    os.write(fd, _HEADER.pack(len(payload)) + payload)


def recv_plain(fd: int) -> dict:
    (length,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    return json.loads(_read_exact(fd, length).decode())


# ---- shared tensors, described as data ---------------------------------------------------------
_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")


def describe_shared(tensor, cpu_dir=None, name: str = "") -> dict:
    """Parent side: a plain-data description of `tensor` that open_shared can map in the child. A CUDA
    tensor travels as its CUDA IPC handle; a CPU tensor must live in a file under `cpu_dir` made by
    shared_cpu_tensor (its path travels)."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    meta = {"dtype": dtype, "shape": list(tensor.shape), "stride": list(tensor.stride()), "offset": tensor.storage_offset()}
    if tensor.is_cuda:
        storage = tensor.untyped_storage()
        (device, handle, size, offset, ref_handle, ref_offset, event_handle, event_sync) = storage._share_cuda_()
        meta.update(kind="cuda", device=int(device), handle=base64.b64encode(handle).decode(), size=int(size),
                    storage_offset=int(offset), ref_handle=base64.b64encode(ref_handle).decode(), ref_offset=int(ref_offset),
                    event_handle=base64.b64encode(event_handle).decode() if event_handle else "", event_sync=bool(event_sync))
    else:
        path = getattr(tensor, "_harness_shared_path", None)
        if path is None:
            raise ValueError("a CPU tensor must be made by shared_cpu_tensor to be shared")
        meta.update(kind="file", path=path, numel_storage=tensor.untyped_storage().nbytes() // tensor.element_size())
    return meta


def shared_cpu_tensor(directory, name: str, shape, dtype):
    """Parent side, CPU: a tensor backed by a file in `directory` (shared memory), mappable by the child."""
    import torch

    numel = 1
    for n in shape:
        numel *= int(n)
    path = os.path.join(str(directory), name)
    with open(path, "wb") as handle:
        handle.truncate(max(1, numel) * torch.empty((), dtype=dtype).element_size())
    flat = torch.from_file(path, shared=True, size=max(1, numel), dtype=dtype)
    tensor = flat[:numel].view(tuple(shape))
    tensor._harness_shared_path = path
    return tensor


def _checked_meta(meta) -> dict:
    """The description's fields with their types checked: anything else is a malformed frame."""
    if not isinstance(meta, dict) or meta.get("dtype") not in _DTYPES or meta.get("kind") not in ("cuda", "file"):
        raise ChannelError("a malformed tensor description")
    for key in ("shape", "stride"):
        if not isinstance(meta.get(key), list) or not all(isinstance(n, int) and n >= 0 for n in meta[key]):
            raise ChannelError(f"a malformed tensor {key}")
    if not isinstance(meta.get("offset"), int) or meta["offset"] < 0:
        raise ChannelError("a malformed tensor offset")
    return meta


def open_shared(meta: dict):
    """Child side, the one function that turns a description into a tensor: it maps the parent's memory
    (CUDA IPC) or file, and builds a view of the described shape, stride and dtype."""
    import torch

    meta = _checked_meta(meta)
    dtype = getattr(torch, meta["dtype"])
    if meta["kind"] == "cuda":
        storage = torch.UntypedStorage._new_shared_cuda(
            meta["device"], base64.b64decode(meta["handle"]), meta["size"], meta["storage_offset"],
            base64.b64decode(meta["ref_handle"]), meta["ref_offset"],
            base64.b64decode(meta["event_handle"]) if meta["event_handle"] else b"", meta["event_sync"])
        device = torch.device("cuda", meta["device"])
    else:
        if not isinstance(meta.get("path"), str) or not isinstance(meta.get("numel_storage"), int):
            raise ChannelError("a malformed file description")
        storage = torch.from_file(meta["path"], shared=True, size=meta["numel_storage"], dtype=dtype).untyped_storage()
        device = torch.device("cpu")
    return torch.empty(0, dtype=dtype, device=device).set_(storage, meta["offset"], meta["shape"], meta["stride"])
