"""smddp against the other shared-memory collectives of this host (gloo, MPICH
and Open MPI through mpi4py, DeepSpeed's shared-memory AllReduce), measured
alike with smddp.bench's core, in one table:

    python -m bench.peers                                 # everything (about 15 min)
    python -m bench.peers --ranks 2 --sizes 1M,16M        # a subset
    python -m bench.peers --impls smddp,openmpi --ops all_gather --dtypes float32
    python -m bench.peers --setup-only                    # only create the peer environments

bench/README.md ("Against MPI and DeepSpeed") says what each implementation
runs, how every point is timed and checked, where the peers' environments
live and what the outputs hold. The driver (``driver``) starts one job per
implementation and world size; its ranks run ``worker`` (torch.distributed),
``mpi`` or ``deepspeed_shm``.
"""
