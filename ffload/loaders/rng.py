"""Counter-based per-sample randomness: SplitMix64 hashing of ``(seed, epoch, sample id, op salt)``.

Every random decision of a pipeline derives from one 64-bit seed per sample
(:func:`sample_seeds`), so a batch does not depend on its composition, on ``num_workers`` or on
thread timing. Inside a kernel an operation turns the sample's seed and its own salt into a
generator state (:func:`seed_state`) and draws from it with :func:`uniform`, :func:`uniform_range`
and :func:`randint`, each returning ``(value, new_state)``.

The generator is SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014; constants from Vigna's reference ``splitmix64.c``): the state advances
by the golden-ratio increment and each output is the state passed through the 64-bit finaliser
:func:`mix64`, a bijection with good avalanche.
"""

from __future__ import annotations

import zlib

import numpy as np
from numba import njit

GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_TWO_POW_M53 = 1.0 / 9007199254740992.0  # 2**-53
_U64_MASK = (1 << 64) - 1


@njit(nogil=True, cache=True)
def mix64(z):
    """SplitMix64's finaliser: ``uint64 -> uint64`` bijection (Vigna, ``splitmix64.c``)."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(nogil=True, cache=True)
def _sample_seeds(seed, epoch, indices, out):
    key = mix64(mix64(seed + GOLDEN_GAMMA) ^ (epoch + GOLDEN_GAMMA))
    for i in range(indices.shape[0]):
        out[i] = mix64(key ^ mix64(np.uint64(indices[i]) + GOLDEN_GAMMA))


def sample_seeds(seed: int, epoch: int, indices: np.ndarray) -> np.ndarray:
    """Per-sample seeds of one batch.

    Args:
        seed: the loader's seed (any Python int; taken modulo 2**64).
        epoch: the epoch number (int >= 0).
        indices: ``(B,)`` integer sample ids.

    Returns:
        ``(B,) uint64``: ``seeds[i]`` depends only on ``(seed, epoch, indices[i])``.
    """
    indices = np.ascontiguousarray(indices, dtype=np.int64)
    out = np.empty(indices.shape[0], dtype=np.uint64)
    _sample_seeds(np.uint64(int(seed) & _U64_MASK), np.uint64(int(epoch) & _U64_MASK), indices, out)
    return out


def op_salt(*parts) -> np.uint64:
    """A stable 64-bit salt from strings/ints (CRC-32 of their ``repr`` chained through
    :func:`mix64`): the same parts give the same salt in every process and Python version."""
    h = np.uint64(0)
    for p in parts:
        h = np.uint64(mix64(h ^ (np.uint64(zlib.crc32(repr(p).encode("utf8"))) + GOLDEN_GAMMA)))
    return h


@njit(nogil=True, cache=True)
def seed_state(seed, salt):
    """Generator state (``uint64``) of one sample for one operation: ``seed`` from
    :func:`sample_seeds`, ``salt`` the operation's :func:`op_salt`."""
    return mix64(np.uint64(seed) ^ np.uint64(salt))


@njit(nogil=True, cache=True)
def next_u64(state):
    """One SplitMix64 step: ``state -> (uint64 output, new state)``."""
    state = np.uint64(state) + GOLDEN_GAMMA
    return mix64(state), state


@njit(nogil=True, cache=True)
def uniform(state):
    """A float64 uniform in ``[0, 1)`` (53 random bits): ``state -> (u, new state)``."""
    z, state = next_u64(state)
    return np.float64(z >> _S11) * _TWO_POW_M53, state


@njit(nogil=True, cache=True)
def uniform_range(state, low, high):
    """A float64 uniform in ``[low, high)``: ``state -> (x, new state)``."""
    u, state = uniform(state)
    return low + (high - low) * u, state


@njit(nogil=True, cache=True)
def randint(state, n):
    """An int64 uniform in ``{0, ..., n - 1}`` (``n >= 1``; bias below ``n / 2**53``):
    ``state -> (k, new state)``."""
    u, state = uniform(state)
    k = np.int64(u * n)
    return min(k, n - 1), state
