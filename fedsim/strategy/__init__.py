"""Aggregation strategies: the base class, pure aggregation math, and one file per algorithm."""

from fedsim.strategy.apfl import APFL, Mixture
from fedsim.strategy.base import LocalTraining, Strategy, gradients
from fedsim.strategy.basgd import BASGD
from fedsim.strategy.bulyan import Bulyan
from fedsim.strategy.centered_clipping import CenteredClipping
from fedsim.strategy.ditto import Ditto, PersonalModel
from fedsim.strategy.fedavg import FedAvg
from fedsim.strategy.fedbn import FedBN, LocalNorms
from fedsim.strategy.fedbuff import FedBuff
from fedsim.strategy.feddyn import DynamicRegulariser, FedDyn
from fedsim.strategy.fednova import FedNova
from fedsim.strategy.fedper import FedPer, PersonalLayers
from fedsim.strategy.fedprox import FedProx, ProximalTerm
from fedsim.strategy.fedrep import FedRep, HeadThenBody
from fedsim.strategy.fedsa_lora import FedSALoRA
from fedsim.strategy.fltrust import FLTrust
from fedsim.strategy.moon import MOON, ModelContrast
from fedsim.strategy.norm_bounding import NormBounding
from fedsim.strategy.perfedavg import MetaStep, PerFedAvg
from fedsim.strategy.pfedme import MoreauEnvelope, PFedMe
from fedsim.strategy.qffl import QFFL, StartLoss
from fedsim.strategy.robust import Krum, Median, TrimmedMean
from fedsim.strategy.scaffold import ControlCorrection, Scaffold
from fedsim.strategy.server_opt import FedAdagrad, FedAdam, FedAvgM, FedOpt, FedYogi
from fedsim.strategy.zeno import Zeno

__all__ = [
    "APFL",
    "BASGD",
    "Bulyan",
    "ControlCorrection",
    "Ditto",
    "DynamicRegulariser",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedBN",
    "FedBuff",
    "FedDyn",
    "FedNova",
    "FLTrust",
    "FedOpt",
    "FedPer",
    "FedProx",
    "FedSALoRA",
    "FedRep",
    "FedYogi",
    "HeadThenBody",
    "Krum",
    "LocalNorms",
    "LocalTraining",
    "MetaStep",
    "MOON",
    "Median",
    "Mixture",
    "ModelContrast",
    "MoreauEnvelope",
    "PerFedAvg",
    "PersonalLayers",
    "PersonalModel",
    "PFedMe",
    "ProximalTerm",
    "QFFL",
    "Scaffold",
    "StartLoss",
    "Strategy",
    "TrimmedMean",
    "Zeno",
    "CenteredClipping",
    "NormBounding",
    "gradients",
]
