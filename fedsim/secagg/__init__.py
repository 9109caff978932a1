"""Secure aggregation, simulated end to end as a round stage (docs/secure-aggregation.md): quantization of each
update to the group Z_{2^b} (:mod:`fedsim.secagg.quantize`), SecAgg's and SecAgg+'s masks
(:mod:`fedsim.secagg.masking`), Shamir sharing (:mod:`fedsim.secagg.shamir`), one round of the protocol with dropouts
and recovery (:mod:`fedsim.secagg.protocol`), its bytes (:mod:`fedsim.secagg.costs`) and time
(:mod:`fedsim.secagg.timing`), distributed DP (:class:`DistributedDP`: the noise of :mod:`fedsim.secagg.noise` and
the accounting of :mod:`fedsim.secagg.accounting`, :mod:`fedsim.secagg.ddp`) and the stage itself
(:class:`SecureAggregation`, :mod:`fedsim.secagg.stages`). The package sits above :mod:`fedsim.server` and uses
only its public round API: the server does not know it."""

from fedsim.secagg.ddp import DistributedDP
from fedsim.secagg.stages import SecureAggregation

__all__ = ["DistributedDP", "SecureAggregation"]
