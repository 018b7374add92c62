"""Communication: halo exchange between graph partitions, byte and wait-time accounting."""

from lightning_gnnpipe.comm.accounting import KINDS, CommStats

__all__ = ["KINDS", "CommStats"]
