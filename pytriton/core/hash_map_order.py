"""The order in which tritonserver's core visits a request's inputs: that of a libstdc++ `std::unordered_map`.

Triton's InferenceRequest keeps its inputs in an `std::unordered_map<std::string, Input>` and checks them, and lists
them in its messages, in that map's iteration order. With GCC's libstdc++ (which tritonserver is built with) that
order follows from the keys' `std::hash` (`_Hash_bytes`, a 64-bit Murmur2 variant) and the bucket counts of its prime
rehash policy: each key goes to the front of its bucket's group, a bucket not yet used to the front of the list.
For keys in distinct buckets this is the last inserted first.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

_MUL = (0xC6A4A793 << 32) + 0x5BD1E995
_MASK = (1 << 64) - 1
_SEED = 0xC70F6907
# libstdc++'s _Prime_rehash_policy: a fast table below 14, then the primes (those a request's inputs can reach).
_FAST_BUCKETS = (2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13)
_PRIMES = (17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 103, 109, 113, 127, 137, 139)


def _shift_mix(value: int) -> int:
    return value ^ (value >> 47)


def string_hash(key: str) -> int:
    """`std::hash<std::string>` of the key's UTF-8 bytes on a 64-bit libstdc++ (`std::_Hash_bytes`)."""
    data = key.encode("utf-8", "surrogatepass")
    length = len(data)
    aligned = length & ~7
    value = (_SEED ^ (length * _MUL)) & _MASK
    for start in range(0, aligned, 8):
        word = (_shift_mix((int.from_bytes(data[start : start + 8], "little") * _MUL) & _MASK) * _MUL) & _MASK
        value = ((value ^ word) * _MUL) & _MASK
    if length & 7:
        value = ((value ^ int.from_bytes(data[aligned:], "little")) * _MUL) & _MASK
    return _shift_mix((_shift_mix(value) * _MUL) & _MASK)


def _next_bucket_count(wanted: int) -> int:
    if wanted < len(_FAST_BUCKETS):
        return _FAST_BUCKETS[wanted]
    for prime in _PRIMES:
        if prime >= wanted:
            return prime
    prime = wanted | 1  # past the table (hundreds of inputs): the next odd number that is prime
    while any(prime % factor == 0 for factor in range(3, int(prime**0.5) + 1, 2)):
        prime += 2
    return prime


def _insert(order: List[str], buckets: Dict[str, int], key: str) -> None:
    """Put `key` where libstdc++ links a new node: the front of its bucket's group, or of the list."""
    bucket = buckets[key]
    for index, other in enumerate(order):
        if buckets[other] == bucket:
            order.insert(index, key)
            return
    order.insert(0, key)


def hash_map_order(keys: Sequence[str]) -> List[str]:
    """The distinct `keys`, inserted in their order, as an `std::unordered_map` (default-constructed) visits them."""
    hashes = {key: string_hash(key) for key in keys}
    bucket_count, next_resize = 1, 0
    order: List[str] = []
    buckets: Dict[str, int] = {}
    for count, key in enumerate(keys):
        if count + 1 > next_resize:  # _M_need_rehash: the first insert allocates 13 buckets
            wanted = max(count + 1, 0 if next_resize else 11)
            if wanted >= bucket_count:
                bucket_count = _next_bucket_count(max(wanted + 1, bucket_count * 2))
                old, order = order, []
                buckets = {name: hashes[name] % bucket_count for name in old}
                for name in old:  # _M_rehash walks the list in order
                    _insert(order, buckets, name)
            next_resize = bucket_count
        buckets[key] = hashes[key] % bucket_count
        _insert(order, buckets, key)
    return order


def visited_before(names: Sequence[str], failed: str, later: Sequence[str]) -> List[int]:
    """The indices of `later` (inputs after `failed` in the request) whose names the core visits before `failed`.

    In the order it visits them: a codec that checks the inputs in the request's order, and finds `failed` the first
    to fail, checks these next, and names the first of them that fails (else `failed`), as Triton's core does.
    """
    position = {name: index for index, name in enumerate(hash_map_order(names))}
    limit = position.get(failed, len(position))
    before = [index for index, name in enumerate(later) if position.get(name, limit) < limit]
    return sorted(before, key=lambda index: position[later[index]])
