"""The byte model of fedsim/secagg/costs.py against numbers worked out by hand from the table in its docstring."""

from __future__ import annotations

from fedsim.secagg.costs import cohort_bytes, cost_metrics, round_bytes
from fedsim.secagg.masking import complete_graph, harary_graph


def test_a_round_of_four_with_one_dropout_known_answer() -> None:
    """SecAgg, n = 4 (k = 3), d' = 8 coordinates of b = 16 bits, client 3 dropped. A survivor (2 surviving
    neighbours): advertise 2·32 + 3·(4 + 64) = 268, share 2·3·(4 + 56) = 360, masked 8·16/8 + 2·4 = 24, unmask
    (3 + 1)·(4 + 16) = 80: 732 bytes. The dropped client: 268 + 360 = 628. Server: 3·732 + 628 = 2824, of which the
    clients sent 3·(64 + 180 + 16 + 80) + (64 + 180) = 1264."""
    per_client = round_bytes(complete_graph([0, 1, 2, 3]), [0, 1, 2], coordinates=8, bits=16)
    assert per_client[0] == {"advertise": (64, 204), "share": (180, 180), "masked": (16, 8), "unmask": (80, 0)}
    assert per_client[3] == {"advertise": (64, 204), "share": (180, 180), "masked": (0, 0), "unmask": (0, 0)}
    metrics = cost_metrics(per_client)
    assert metrics["bytes_client_max"] == 732 and metrics["bytes_server"] == 2824
    assert [metrics[f"{p}/bytes_server"] for p in ("advertise", "share", "masked", "unmask")] == [1072, 1440, 72, 240]
    assert metrics["masked/bytes_client_max"] == 24 and metrics["bytes_up"] == 1264 and metrics["bytes_down"] == 1560


def test_the_closed_form_matches_a_round_and_secagg_plus_grows_with_log_n() -> None:
    """b = 12 bits of d' = 1000 coordinates: 1500 bytes of masked input each."""
    for n, k in ((12, 11), (12, 4)):
        clients = list(range(n))
        graph = complete_graph(clients) if k == n - 1 else harary_graph(clients, k, 0, 1)
        metrics = cost_metrics(round_bytes(graph, clients, coordinates=1000, bits=12))
        assert cohort_bytes(n, k, 1000, 12) == (metrics["bytes_client_max"], metrics["bytes_server"])
    # 2K + k(I + 2K) + 2k(I + C) + 1500 + k·I + (k + 1)(I + S) = 64 + 68k + 120k + 1500 + 4k + 20k + 20
    assert cohort_bytes(10_000, 9_999, 1000, 12)[0] == 1584 + 212 * 9_999
    assert cohort_bytes(10_000, 40, 1000, 12) == (1584 + 212 * 40, 10_000 * (1584 + 212 * 40))
