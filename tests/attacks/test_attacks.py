"""Known answers for every model-poisoning attack and for the malicious set."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest
import torch

from fedsim.attacks import ALittleIsEnough, GaussianNoise, InnerProductManipulation, Scaling, SignFlip, alie_z
from fedsim.attacks.base import client_generator

DELTAS = {
    0: torch.tensor([1.0, 2.0]),
    3: torch.tensor([3.0, -2.0]),
    5: torch.tensor([2.0, 0.0]),
    7: torch.tensor([-2.0, 4.0]),
}


def test_the_malicious_set_is_the_fraction_drawn_from_the_seed_fixed_or_per_round() -> None:
    fixed = SignFlip(fraction=0.2)
    sets = [fixed.malicious(seed=1, round_num=r, num_clients=30) for r in range(1, 6)]
    assert all(s == sets[0] for s in sets) and len(sets[0]) == 6 and all(0 <= c < 30 for c in sets[0])
    assert fixed.malicious(seed=2, round_num=1, num_clients=30) != sets[0]
    moving = SignFlip(fraction=0.2, per_round=True)
    drawn = [moving.malicious(seed=1, round_num=r, num_clients=30) for r in range(1, 6)]
    assert len(set(drawn)) > 1 and all(len(s) == 6 for s in drawn)
    assert len(SignFlip(fraction=0.01).malicious(0, 1, 30)) == 1  # any fraction > 0 makes at least one
    assert SignFlip(fraction=0.0).malicious(0, 1, 30) == frozenset()
    with pytest.raises(ValueError, match=r"^attack.fraction must be in \[0, 1\]"):
        SignFlip(fraction=1.5)


def test_sign_flip_scaling_and_gaussian_replace_only_the_malicious_updates() -> None:
    bad = frozenset({3, 7, 11})  # 11 did not return an update this round
    assert {c: v.tolist() for c, v in SignFlip(scale=2.0).poison(DELTAS, bad, 0, 1).items()} == {
        3: [-6.0, 4.0],
        7: [4.0, -8.0],
    }
    assert {c: v.tolist() for c, v in Scaling(boost=10.0).poison(DELTAS, bad, 0, 1).items()} == {
        3: [30.0, -20.0],
        7: [-20.0, 40.0],
    }
    noise = GaussianNoise(std=0.5).poison(DELTAS, bad, 9, 4)
    assert set(noise) == {3, 7}
    assert torch.equal(noise[3], torch.randn(2, generator=client_generator(9, 4, 3)) * 0.5)
    assert not torch.equal(noise[3], noise[7])


def test_alie_sends_mean_minus_z_times_std_with_the_papers_z_max() -> None:
    # n = 4 updates, m = 2 attackers: s = floor(4/2 + 1) - 2 = 1 supporter, z_max = Φ⁻¹(3/4)
    z = alie_z(4, 2)
    assert z == pytest.approx(NormalDist().inv_cdf(0.75))
    stack = torch.stack(list(DELTAS.values())).double()
    expected = (stack.mean(0) - z * stack.std(0, unbiased=False)).float()
    crafted = ALittleIsEnough().poison(DELTAS, frozenset({3, 7}), 0, 1)
    assert set(crafted) == {3, 7} and torch.allclose(crafted[3], expected) and torch.equal(crafted[3], crafted[7])
    assert ALittleIsEnough(z=1.0).poison(DELTAS, frozenset({0}), 0, 1)[0].tolist() == pytest.approx(
        (stack.mean(0) - stack.std(0, unbiased=False)).tolist()
    )
    # the paper's example: 50 workers, 24 % of them corrupted (m = 12): s = 14, z_max = Φ⁻¹(36/50) ≈ 0.58
    assert alie_z(50, 12) == pytest.approx(NormalDist().inv_cdf(0.72)) and math.isclose(
        alie_z(50, 12), 0.5828, abs_tol=1e-3
    )


def test_ipm_sends_minus_epsilon_times_the_mean() -> None:
    crafted = InnerProductManipulation(epsilon=0.5).poison(DELTAS, frozenset({5}), 0, 1)
    assert crafted[5].tolist() == [-0.5, -0.5]  # mean [1, 1]
    mean = torch.stack(list(DELTAS.values())).mean(0)
    assert float(crafted[5] @ mean) < 0
    with pytest.raises(ValueError, match="^attack.epsilon must be a finite number > 0"):
        InnerProductManipulation(epsilon=0)
