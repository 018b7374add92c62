"""Communication: the halo row exchange of graph and hybrid parallelism, gradient sums, byte and time accounting."""

from lightning_gnnpipe.comm.accounting import KINDS, CommStats

__all__ = ["KINDS", "CommStats"]
