"""The shortest path through everything: build, register, a group, one of
each native collective, a delegated one."""

import torch
import torch.distributed as dist


def case_each_native_collective():
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.arange(6, dtype=torch.float32) + rank
    dist.all_reduce(t)
    assert t.tolist() == [world * i + world * (world - 1) / 2 for i in range(6)], t
    out = torch.empty(3 * world)
    dist.all_gather_into_tensor(out, torch.full((3,), float(rank)))
    assert out.tolist() == [float(r) for r in range(world) for _ in range(3)], out
    o = torch.empty(2)
    dist.reduce_scatter_tensor(o, torch.ones(2 * world) * (rank + 1))
    assert o.tolist() == [world * (world + 1) / 2] * 2, o
    b = torch.full((4,), float(rank))
    dist.broadcast(b, src=world - 1)
    assert b.tolist() == [float(world - 1)] * 4
    dist.barrier()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    return type(backend).__name__


def case_delegated_all_to_all():
    rank, world = dist.get_rank(), dist.get_world_size()
    out = torch.empty(world, dtype=torch.int64)
    dist.all_to_all_single(out, torch.arange(world) + 10 * rank)
    return out.tolist()


def test_native_collectives(pools):
    names = pools(2).run(case_each_native_collective)
    assert names == ["ProcessGroupSMDDP"] * 2


def test_delegated_collective(pools):
    results = pools(2).run(case_delegated_all_to_all)
    assert results == [[0, 10], [1, 11]]
