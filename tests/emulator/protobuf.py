"""Just enough of Kubernetes' protobuf encoding for the bodies kubectl's typed commands send
(`kubectl create namespace|configmap|secret generic`): the `k8s\\x00` envelope (runtime.Unknown)
and the messages of Namespace, ConfigMap and Secret with their ObjectMeta. Any other protobuf
body is answered 415 with a message that says to use `kubectl create -f` (JSON/YAML) instead."""
from __future__ import annotations

import base64
from typing import Any, Callable, Iterator

MAGIC = b'k8s\x00'


class ProtobufError(ValueError):
    pass


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(buf):
            raise ProtobufError('truncated varint')
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def fields(buf: bytes) -> Iterator[tuple[int, Any]]:
    """(field number, value): ints for varints, bytes for length-delimited; fixed types skipped."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            yield num, value
        elif wire == 2:
            size, i = _varint(buf, i)
            yield num, buf[i:i + size]
            i += size
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ProtobufError('unsupported wire type %d' % wire)


def _map_entry(buf: bytes, as_bytes: bool = False) -> tuple[str, Any]:
    key, value = '', b''
    for num, v in fields(buf):
        if num == 1:
            key = v.decode()
        elif num == 2:
            value = v
    return key, (base64.b64encode(value).decode() if as_bytes else value.decode())


def object_meta(buf: bytes) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    names = {1: 'name', 2: 'generateName', 3: 'namespace', 5: 'uid', 6: 'resourceVersion'}
    for num, v in fields(buf):
        if num in names and v:
            meta[names[num]] = v.decode()
        elif num == 11:
            k, val = _map_entry(v)
            meta.setdefault('labels', {})[k] = val
        elif num == 12:
            k, val = _map_entry(v)
            meta.setdefault('annotations', {})[k] = val
        elif num == 14:
            meta.setdefault('finalizers', []).append(v.decode())
    return meta


def _namespace(buf: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {}}
    for num, v in fields(buf):
        if num == 1:
            obj['metadata'] = object_meta(v)
    return obj


def _configmap(buf: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {}}
    for num, v in fields(buf):
        if num == 1:
            obj['metadata'] = object_meta(v)
        elif num == 2:
            k, val = _map_entry(v)
            obj.setdefault('data', {})[k] = val
        elif num == 3:
            k, val = _map_entry(v, as_bytes=True)
            obj.setdefault('binaryData', {})[k] = val
        elif num == 4:
            obj['immutable'] = bool(v)
    return obj


def _secret(buf: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {'apiVersion': 'v1', 'kind': 'Secret', 'metadata': {}}
    for num, v in fields(buf):
        if num == 1:
            obj['metadata'] = object_meta(v)
        elif num == 2:
            k, val = _map_entry(v, as_bytes=True)
            obj.setdefault('data', {})[k] = val
        elif num == 3:
            obj['type'] = v.decode()
        elif num == 4:
            k, val = _map_entry(v)
            obj.setdefault('stringData', {})[k] = val
        elif num == 5:
            obj['immutable'] = bool(v)
    return obj


DECODERS: dict[tuple[str, str], Callable[[bytes], dict[str, Any]]] = {
    ('v1', 'Namespace'): _namespace,
    ('v1', 'ConfigMap'): _configmap,
    ('v1', 'Secret'): _secret,
}


def decode(body: bytes) -> dict[str, Any]:
    """The object in a protobuf request body; ProtobufError for anything not supported."""
    if not body.startswith(MAGIC):
        raise ProtobufError('not a Kubernetes protobuf body (no k8s\\x00 prefix)')
    api_version = kind = ''
    raw = b''
    for num, v in fields(body[len(MAGIC):]):
        if num == 1:
            for tnum, tv in fields(v):
                if tnum == 1:
                    api_version = tv.decode()
                elif tnum == 2:
                    kind = tv.decode()
        elif num == 2:
            raw = v
    decoder = DECODERS.get((api_version, kind))
    if decoder is None:
        raise ProtobufError('the emulator reads protobuf bodies only for %s; send %s %s as JSON or YAML '
                            '(kubectl create -f)' % (', '.join(k for _v, k in sorted(DECODERS)), api_version, kind))
    return decoder(raw)
