"""Optimizers for training across workers over slow links: DiLoCo and gossip DiLoCo (optax)."""

from jaxcc.optim._diloco import DiLoCoState, diloco
from jaxcc.optim._gossip import GossipDiLoCoState, gossip_diloco
from jaxcc.optim._graphs import (GRAPHS, RoundCost, diloco_round_cost, gossip_round_cost,
                                 mixing_matrix)
from jaxcc.optim._metrics import averaged_params, consensus_distance, outer_params
from jaxcc.optim._rejoin import Admission, admit, rejoin

__all__ = [
    "GRAPHS",
    "Admission",
    "DiLoCoState",
    "GossipDiLoCoState",
    "RoundCost",
    "admit",
    "averaged_params",
    "consensus_distance",
    "diloco",
    "diloco_round_cost",
    "gossip_diloco",
    "gossip_round_cost",
    "mixing_matrix",
    "outer_params",
    "rejoin",
]
