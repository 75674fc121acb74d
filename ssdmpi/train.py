"""``ssdmpi train`` (placeholder until the trainer lands: it checks that all ranks can talk)."""


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    total = comm.allreduce(comm.Get_rank())
    if comm.Get_rank() == 0:
        print(f"ssdmpi train: {comm.Get_size()} ranks up (sum of ranks {total}); the trainer is not implemented yet")
    return 0
