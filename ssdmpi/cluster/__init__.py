"""A multi-node cluster on one machine, out of Linux namespaces (``bin/ssdmpi-cluster``).

Each node is a network namespace with one veth "NIC" into a switch (a Linux bridge in a
namespace of its own), rate-limited by ``tc tbf`` in both directions, plus a holder process
with its own UTS namespace (the node's host name) and mount namespace (a per-cluster
``/etc/hosts`` bind-mounted over the host's). Nothing is routed to or from the host's
interfaces. Standard library only; no MPI import. See docs/CLUSTER.md.

- :mod:`.nodes`: bring a cluster up, find it again from its state directory, enter a node,
  take it down;
- :mod:`.mpi`: MPICH's ``mpiexec`` across the nodes (a launcher that enters a node);
- :mod:`.cli`: the ``ssdmpi-cluster`` command line.
"""

from ssdmpi.cluster.nodes import Cluster, ClusterError, Node

__all__ = ["Cluster", "ClusterError", "Node"]
