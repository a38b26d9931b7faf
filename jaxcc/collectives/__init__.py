"""The collectives, each a JAX primitive usable inside jax.shard_map."""

from jaxcc.collectives.all_gather import all_gather
from jaxcc.collectives.all_reduce import all_reduce
from jaxcc.collectives.broadcast import broadcast
from jaxcc.collectives.lax_names import (pbroadcast, pmax, pmean, pmin, psum,
                                         psum_scatter)
from jaxcc.collectives.ppermute import ppermute
from jaxcc.collectives.recover import recover
from jaxcc.collectives.reduce_scatter import reduce_scatter

__all__ = ["all_gather", "all_reduce", "broadcast", "pbroadcast", "pmax", "pmean", "pmin",
           "ppermute", "psum", "psum_scatter", "recover", "reduce_scatter"]
