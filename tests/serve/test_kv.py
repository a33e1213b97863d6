"""The scheduler's reservations on the host KV manager: promised blocks are never taken by others,
growth beyond a reservation needs spare blocks, a refused admission changes nothing."""

from __future__ import annotations

import numpy as np

from mcpc.serve import ServingKV


def test_reservations_are_kept_for_their_owner():
    kv = ServingKV(6, bytes_per_token=2)
    assert kv.admit(0, np.arange(100), reserve=256) == 0  # 4 blocks promised, none allocated yet
    assert kv.used_blocks == 0 and kv.spare == 2
    assert kv.admit(1, np.arange(500, 700), reserve=200) is None  # needs 4, only 2 spare
    assert kv.kv.sequences == [0] and kv.spare == 2
    assert kv.append(0, range(100)) and kv.used_blocks == 2 and kv.spare == 2  # within the reservation
    assert kv.admit(1, np.arange(500, 564), reserve=128) == 0 and kv.spare == 0
    assert kv.extra_blocks(1, 64) == 0 and kv.extra_blocks(1, 129) == 1
    assert not kv.append(1, range(129))  # one block beyond its reservation, none spare
    assert kv.append(0, range(156))  # 256 tokens: the rest of its reservation
    kv.check([0, 1])
    kv.free(0)
    assert kv.spare == 4  # its four full blocks stay cached, evictable
    kv.check([1])


def test_prefix_hit_and_undo():
    kv = ServingKV(4)
    prompt = np.arange(129)
    assert kv.admit(0, prompt, reserve=129) == 0
    assert kv.append(0, prompt)
    kv.free(0)  # blocks 0 and 1 stay cached
    assert kv.admit(1, prompt, reserve=129) == 128  # two full blocks reused, the last token computed
    assert kv.hit_tokens == 128 and kv.lookup_tokens == 258
    kv.check([1])
    assert kv.spare == 1  # 2 blocks in use, 1 owed to sequence 1
    # a prompt sharing only the first block: the best case (two hits) would fit, the real hit does
    # not, so the admission is undone and nothing is kept
    other = np.concatenate([prompt[:64], np.arange(1000, 1065)])
    assert kv.admit(2, other, reserve=192) is None
    assert kv.kv.sequences == [1] and kv.hit_tokens == 128 and kv.spare == 1
    kv.check([1])
