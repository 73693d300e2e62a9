"""Sharding of work across torchrun ranks (geosharp_ref.distributed)."""
from geosharp_ref.distributed import shard


def test_shard_is_a_disjoint_cover():
    items = list(range(11))
    shards = [x for r in range(3) for x in shard(items, r, 3)]
    assert sorted(shards) == items and len(shards) == len(items)
