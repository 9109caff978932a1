"""FedSA-LoRA: LoRA's A matrices are averaged, each client keeps its own B.

Guo, Wu, Tang, Xie, Li, Lu. "Selective Aggregation for Low-Rank Adaptation in Federated Learning." ICLR 2025.
The paper observes that the A matrices learn what is general across clients and the B matrices what is specific to
each; it shares (averages) the A matrices and keeps every client's B on the client:

    client k:  load its own B (the global model's, zero, the first time) next to the global A, train A and B,
               keep the trained B in its client state
    server:    A ← Σₖ (nₖ / n) Aₖ;   the global model's B stays as it was

That is exactly :class:`~fedsim.strategy.fedper.FedPer` with the LoRA B entries as the personal layers, so this
class is FedPer with ``personal_layers`` defaulting to ``\\.lora_B\\.`` and a one-line refusal of a model without
LoRA adapters. Use it with ``adapter=lora`` (not ``adapter=ffa_lora``, whose A is frozen: nothing would be
federated). The global model's B is its initial zero, so the centralized ``eval/`` metrics score the base model:
judge FedSA-LoRA by the clients' personal models, ``eval_personal/...`` (``evaluate_clients=all``).
"""

from __future__ import annotations

from fedsim.strategy.context import RunContext
from fedsim.strategy.fedper import FedPer

LORA_B = r"\.lora_B\."


class FedSALoRA(FedPer):
    """FedAvg on the LoRA A matrices; every client's B matrices stay in its client state (FedPer over ``lora_B``)."""

    def __init__(self, *, personal_layers: str = LORA_B) -> None:
        super().__init__(personal_layers=personal_layers)

    def setup(self, context: RunContext) -> None:
        if not context.layout.matching(LORA_B):
            raise ValueError(
                "strategy=fedsa_lora needs a model with LoRA adapters (model=hf_causal_lm adapter=lora): "
                "the federated entries hold no lora_B"
            )
        super().setup(context)
