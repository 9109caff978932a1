"""Known answers for every codec and for a chain: round trips, exact sizes, unbiasedness of the stochastic ones over
many draws, top-k's choice, and the error-feedback residual."""

from __future__ import annotations

import math

import pytest
import torch

from fedsim.comm import QSGD, BFloat16, Chain, Compression, Float16, RandomMask, TopK
from fedsim.core.types import ClientUpdate
from fedsim.server.exchange import RESIDUAL, Exchange


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_casts_round_to_the_nearest_half_and_bfloat16_value() -> None:
    values = torch.tensor([1.0, 1 + 2**-11, 1 + 3 * 2**-11, 1e-8, 70000.0, -0.1])
    half = Float16().code(values, _gen())
    assert half.dtype == torch.float32
    # 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to even (1); 1 + 3·2^-11 goes up to 1 + 2^-9
    assert half[:3].tolist() == [1.0, 1.0, 1 + 2**-9]
    assert half[3] == 0.0 and math.isinf(half[4]) and half[5] == torch.tensor(-0.1).half().float()
    brain = BFloat16().code(values, _gen())
    assert brain[4] == 70144.0  # bfloat16 keeps 8 significant bits: 70000 rounds to 70144, finite
    assert Float16().nbytes(10) == BFloat16().nbytes(10) == 20


def test_qsgd_levels_are_the_two_neighbours_of_the_scaled_value() -> None:
    codec = QSGD(bits=3, bucket_size=4)  # s = 3 levels of |v|/‖v‖ per bucket
    values = torch.tensor([3.0, -4.0, 0.0, 0.0, 1.0])  # buckets: [3, -4, 0, 0] (norm 5) and [1] (norm 1)
    for seed in range(20):
        out = codec.code(values, _gen(seed))
        # 3·3/5 = 1.8 → level 1 or 2 (of 3), i.e. 5/3 or 10/3; 3·4/5 = 2.4 → 2 or 3 → -10/3 or -5
        assert out[0].item() in (pytest.approx(5 / 3), pytest.approx(10 / 3))
        assert out[1].item() in (pytest.approx(-10 / 3), pytest.approx(-5.0))
        assert out[2] == 0 and out[3] == 0 and out[4] == 1.0  # a lone value is its own norm: level s exactly
    assert codec.nbytes(5) == 2 * 4 + math.ceil(5 * 3 / 8)


@pytest.mark.parametrize("bits", [2, 8])
def test_qsgd_is_unbiased_and_its_variance_bound_holds(bits: int) -> None:
    torch.manual_seed(1)
    values = torch.randn(64)
    codec = QSGD(bits=bits, bucket_size=16)
    draws = torch.stack([codec.code(values, _gen(seed)) for seed in range(4000)])
    mean = draws.mean(0)
    std_err = draws.std(0) / math.sqrt(len(draws))
    assert torch.all((mean - values).abs() <= 5 * std_err + 1e-6)
    # the paper's bound (Lemma 3.1): E‖Q(v) − v‖² ≤ min(d/s², √d/s)·‖v‖² per bucket of d values
    s, d = 2 ** (bits - 1) - 1, 16
    error = ((draws - values) ** 2).sum(1).mean()
    assert error <= min(d / s**2, math.sqrt(d) / s) * (values**2).sum() * 1.05


def test_qsgd_buckets_far_below_and_above_float32s_square_range_decode_as_the_same_bucket_at_scale_one() -> None:
    # [3, -4, 0, 0]·2^k: its norm 5·2^k is exact in float64 and in float32, and scaling by a power of two is exact,
    # so the ratios, the levels drawn and the decoded values are those of [3, -4, 0, 0] times 2^k, draw for draw.
    # k = -80 (values ~3e-24): float32 squares underflow to 0, so a float32 norm of 0 decoded everything to 0;
    # k = 70 (values ~4e21): float32 squares overflow, so a float32 norm of inf decoded to NaN.
    codec = QSGD(bits=3, bucket_size=4)
    unit = torch.tensor([3.0, -4.0, 0.0, 0.0])
    for k in (-80, 70):
        for seed in range(50):
            expected = codec.code(unit, _gen(seed)) * 2.0**k
            assert torch.equal(codec.code(unit * 2.0**k, _gen(seed)), expected)
            assert expected[0] > 0 and expected[1] < 0  # 3·3/5 = 1.8 and 3·4/5 = 2.4: level 1 at least
    # unbiased at the tiny scale itself: E[Q(v)] = v within 5 standard errors of the mean over 4000 draws
    values = torch.tensor([3e-23, -4e-23, 1e-24, 0.0, -2e-23])  # buckets [3, -4, 0.1, 0]e-23 and [-2e-23]
    draws = torch.stack([codec.code(values, _gen(seed)) for seed in range(4000)])
    std_err = draws.std(0) / math.sqrt(len(draws))
    assert torch.all((draws.mean(0) - values).abs() <= 5 * std_err + 1e-6 * values.abs())
    assert draws[:, 4].eq(-2e-23).all()  # a lone value is its own norm: level s exactly, as at any scale


def test_qsgd_draws_are_a_function_of_the_generator_alone() -> None:
    values = torch.randn(1000)
    codec = QSGD(bits=4)
    assert torch.equal(codec.code(values, _gen(3)), codec.code(values, _gen(3)))
    assert not torch.equal(codec.code(values, _gen(3)), codec.code(values, _gen(4)))


def test_topk_keeps_the_largest_magnitudes_with_ties_to_the_lower_position() -> None:
    values = torch.tensor([0.1, -5.0, 2.0, -2.0, 3.0, 0.0, 2.0, 1.0, 0.5, 0.2])
    chain = Chain.of([TopK(fraction=0.4)], "up")
    out = chain.apply(values, _gen())
    # the 4 largest |v|: -5, 3, then three values of magnitude 2 compete for two places: positions 2 and 3 win
    assert out.tolist() == [0, -5.0, 2.0, -2.0, 3.0, 0, 0, 0, 0, 0]
    assert chain.nbytes(10) == 4 * 4 + 4 * 4  # four int32 positions, four float32 values


def test_random_mask_sends_a_seeded_subset_scaled_to_be_unbiased() -> None:
    values = torch.arange(1.0, 11.0)
    chain = Chain.of([RandomMask(fraction=0.3)], "up")
    out = chain.apply(values, _gen(5))
    kept = out.nonzero().view(-1)
    assert len(kept) == 3 and torch.equal(out[kept], values[kept] * 10 / 3)
    assert torch.equal(out, chain.apply(values, _gen(5)))
    mean = torch.stack([chain.apply(values, _gen(s)) for s in range(6000)]).mean(0)
    assert torch.allclose(mean, values, rtol=0.1)
    assert chain.nbytes(10) == 8 + 3 * 4  # the seed and three float32 values


def test_a_chain_codes_only_the_values_its_sparsifiers_kept() -> None:
    values = torch.tensor([1.0, 1 + 2**-11, -7.0, 0.0])
    chain = Chain.of([TopK(fraction=0.5), Float16()], "up")
    assert chain.apply(values, _gen()).tolist() == [0.0, 1.0, -7.0, 0.0]
    assert chain.nbytes(1000) == 500 * 4 + 500 * 2  # int32 positions, float16 values
    assert str(chain) == "TopK(fraction=0.5) > Float16()"


@pytest.mark.parametrize(
    ("up", "down", "feedback", "message"),
    [
        ([Float16(), TopK()], [], False, "compression.uplink[1]: TopK(fraction=0.01) comes after the value codec"),
        (
            [Float16(), QSGD()],
            [],
            False,
            "compression.uplink[1]: QSGD(bits=8, bucket_size=512) is a second value codec",
        ),
        ([], [TopK()], False, "compression.downlink: TopK(fraction=0.01) would sparsify the global model's weights"),
        ([], [], True, "compression.error_feedback=true needs a lossy compression.uplink"),
        (["fp16"], [], False, "compression.uplink[0]: a str is neither"),
    ],
)
def test_chains_that_make_no_sense_are_refused_in_one_line(up, down, feedback, message) -> None:  # noqa: ANN001
    with pytest.raises(
        ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
    ):
        Compression(uplink=up, downlink=down, error_feedback=feedback)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: QSGD(bits=4.5), "qsgd.bits must be an integer between 2 and 8 (got 4.5)"),
        (lambda: QSGD(bits=True), "qsgd.bits must be an integer between 2 and 8 (got True)"),
        (lambda: QSGD(bucket_size=0.5), "qsgd.bucket_size must be an integer >= 1 (got 0.5)"),
        (lambda: TopK(fraction="abc"), "topk.fraction must be in (0, 1] (got 'abc')"),
        (lambda: RandomMask(fraction=math.nan), "random_mask.fraction must be in (0, 1] (got nan)"),
        (lambda: Compression(error_feedback="no"), "compression.error_feedback must be true or false (got 'no')"),
    ],
)
def test_codec_arguments_of_the_wrong_kind_are_refused_in_one_line(build, message) -> None:  # noqa: ANN001
    with pytest.raises(ValueError) as caught:
        build()
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def _update(params: torch.Tensor, state: dict | None = None) -> ClientUpdate:
    return ClientUpdate(client_id=3, round_num=1, params=params, num_examples=5, state=state)


def test_error_feedback_keeps_what_was_not_sent_and_adds_it_to_the_next_update() -> None:
    exchange = Exchange(Compression(uplink=[TopK(fraction=0.25)], error_feedback=True), num_params=4, seed=0)
    start = torch.tensor([1.0, 1.0, 1.0, 1.0])
    first = exchange.receive(_update(start + torch.tensor([0.5, -3.0, 0.25, 0.0]), {"mine": 1}), start, start, {})
    assert first.params.tolist() == [1.0, -2.0, 1.0, 1.0]  # only -3 went
    assert first.state["mine"] == 1 and first.state[RESIDUAL].tolist() == [0.5, 0.0, 0.25, 0.0]
    # next time the client's Δ = [0.25, 0, 0, 0.5]: with the residual [0.75, 0, 0.25, 0.5], 0.75 goes
    second = exchange.receive(_update(start + torch.tensor([0.25, 0.0, 0.0, 0.5]), None), start, start, first.state)
    assert second.params.tolist() == [1.75, 1.0, 1.0, 1.0]
    assert second.state == {"mine": 1, RESIDUAL: second.state[RESIDUAL]}
    assert second.state[RESIDUAL].tolist() == [0.0, 0.0, 0.25, 0.5]


def test_the_update_is_rebuilt_on_the_servers_weights_not_on_what_the_client_received() -> None:
    exchange = Exchange(Compression(downlink=[Float16()]), num_params=2, seed=0)
    exact = torch.tensor([1 + 2**-12, 3.0])
    received = exchange.broadcast(exact, round_num=1)
    assert received.tolist() == [1.0, 3.0]
    update = exchange.receive(_update(received + torch.tensor([0.5, 0.5])), received, exact, {})
    assert update.params.tolist() == [1.5 + 2**-12, 3.5]
    assert (exchange.down_bytes, exchange.up_bytes) == (4, 8)


def test_updates_the_server_will_reject_pass_unchanged() -> None:
    exchange = Exchange(Compression(uplink=[QSGD()]), num_params=3, seed=0)
    start = torch.zeros(3)
    bad = _update(torch.tensor([1.0, float("nan"), 0.0]))
    short = _update(torch.zeros(2))
    assert exchange.receive(bad, start, start, {}) is bad and exchange.receive(short, start, start, {}) is short


def test_topk_equals_a_stable_sort_by_magnitude_on_ties_and_large_vectors() -> None:
    torch.manual_seed(3)
    values = torch.randn(50_000).round(decimals=1)  # many equal magnitudes
    selection = TopK(fraction=0.01).select(values, _gen())
    reference = torch.sort(torch.sort(values.abs(), descending=True, stable=True).indices[:500]).values
    assert torch.equal(selection.positions, reference)


def test_qsgd_levels_never_exceed_the_bit_width() -> None:
    values = torch.zeros(200_000)
    values[::2] = 1.3e-20  # squares are subnormal: the float32 norm is 1.0000018 times too small, so without the
    # float64 norm of such buckets and the bound, about 0.02 % of the 100,000 buckets would draw level 128
    decoded = QSGD(bits=8, bucket_size=2).code(values, _gen())
    norm = torch.linalg.vector_norm(values[:2])
    assert int(((decoded[::2] / norm * 127).round() > 127).sum()) == 0
