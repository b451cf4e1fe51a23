"""The bench's pure logic: Nchan ids, process-tree accounting, the Done-when ratio line,
the paced publishers' sleeps.

The benchmarks themselves never run under pytest (``bench/`` is outside ``testpaths``);
these check the parts whose mistakes would silently skew a table.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from bench import common, nchan
from bench.loadgen import Subscriber
from bench.measure import correctness, median_ratio_line
from bench.servers import descendants, parse_stat, tree_stats


def test_parse_id_reads_time_and_sequence():
    assert nchan.parse_id("1764600000:12") == (1764600000, 12)
    assert nchan.parse_id("1764600000:0\n") == (1764600000, 0)


@pytest.mark.parametrize("bad", ["", "12", "12:", ":3", "1:[0],[1]", "a:1", "1:2:3"])
def test_parse_id_refuses_other_shapes(bad):
    with pytest.raises(ValueError, match="nchan message id"):
        nchan.parse_id(bad)


def test_ids_compare_by_time_then_sequence():
    # A new second restarts the sequence: (t+1, 0) comes after (t, 99).
    assert nchan.parse_id("101:0") > nchan.parse_id("100:99")


def _frame(event_id: str, seq: int) -> bytes:
    return b'id: %s\ndata: {"seq":%d,"t":%d,"pad":""}' % (event_id.encode(), seq, seq)


def test_loadgen_counts_nchan_ids_that_do_not_go_up():
    async def feed() -> Subscriber:
        sub = Subscriber(0, 4, False, False, b"", nchan_ids=True)
        frames = [_frame("100:0", 1), _frame("100:1", 2), _frame("100:1", 3), _frame("x", 4)]
        sub.body_received(b"\n\n".join(frames) + b"\n\n", 10)
        return sub

    sub = asyncio.run(feed())
    # Loss and duplicates are judged on the payload's seq; the ids are an extra check.
    assert (sub.unique, sub.dups, sub.id_disorder) == (4, 0, 2)


def test_parse_stat_sums_own_and_reaped_children_cpu():
    # pid (comm with ") (" inside) state ppid ... utime stime cutime cstime ... threads
    fields = ["S", "7"] + ["0"] * 9 + ["100", "20", "3", "4"] + ["0", "0", "5"]
    stat = parse_stat("42 (a) (b) " + " ".join(fields) + " 0 0")
    assert (stat.pid, stat.ppid, stat.ticks, stat.threads) == (42, 7, 127, 5)


def test_descendants_walks_the_whole_tree_only():
    parents = {1: 0, 10: 1, 11: 10, 12: 10, 13: 11, 20: 1, 30: 99}
    assert descendants(10, parents) == [10, 11, 12, 13]
    assert descendants(13, parents) == [13]


def test_tree_stats_of_this_process_includes_a_child(tmp_path: Path):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child waits until the parent has looked
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    try:
        os.close(read)
        pids = [stat.pid for stat in tree_stats(os.getpid())]
        assert pids[0] == os.getpid()
        assert pid in pids
    finally:
        os.close(write)
        os.waitpid(pid, 0)


def test_median_ratio_line_states_the_median_and_the_verdict():
    line = median_ratio_line("qwenweb-serve", "floor", [0.8, None, 1.1, 0.95], 0.9)
    assert line == (
        "median ratio qwenweb-serve ÷ floor: **0.95** "
        "(per repetition: 0.80, 1.10, 0.95; target ≥ 0.9: met)"
    )
    assert "MISSED" in median_ratio_line("a", "b", [1.0, 1.2, 1.4], 1.5)
    assert "no paired repetition" in median_ratio_line("a", "b", [None])


def test_nchan_conf_keeps_everything_in_its_directory(tmp_path: Path):
    conf = nchan.write_conf(tmp_path, 8123).read_text()
    assert "listen 127.0.0.1:8123;" in conf
    assert f"pid {tmp_path}/nginx.pid;" in conf
    assert f"nchan_message_buffer_length {nchan.BUFFER_LENGTH};" in conf
    assert "nchan_subscriber_first_message newest;" in conf
    tls = nchan.write_conf(tmp_path, 8124, (tmp_path / "c.pem", tmp_path / "k.pem"), 8125)
    assert "listen 127.0.0.1:8124 ssl http2;" in tls.read_text()
    assert "listen 127.0.0.1:8125;" in tls.read_text()


def test_correctness_flags_a_healthy_reader_evicted_but_not_a_stalled_one():
    # Issue 23: an eviction of a reader that keeps up is the server's failure, even announced.
    assert correctness({"evicted_subs": 2}) == "**EVICTED 2 subs**"
    assert correctness({"evicted_subs": 1, "stalled": 1}) == "OK"


@pytest.mark.parametrize("paced", ["burst", "sessions"])
def test_a_paced_publisher_sleeps_whole_milliseconds_not_a_spin(
    paced: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # uvloop returns at once from a sleep under 0.5 ms: sleeping until each due time of
    # 4,000 events/s spun the server's loop (hundreds of thousands of wake-ups a second).
    import uvloop

    sleeps: list[float] = []
    real_sleep = asyncio.sleep

    async def counted(delay: float) -> None:
        sleeps.append(delay)
        await real_sleep(delay)

    monkeypatch.setattr(asyncio, "sleep", counted)  # (bench.common calls asyncio.sleep)
    published: list[dict[str, object]] = []

    def publish(data: dict[str, object]) -> bool:
        published.append(data)
        return True

    if paced == "burst":
        run = common.run_burst(publish, 800, 60, 4000.0, 1)
    else:
        run = common.run_paced_sessions([publish] * 4, 1000.0, 0.2, (40, 60))
    outcome = uvloop.run(run)
    assert outcome["published"] == len(published) == 800
    assert min(sleeps) >= common.MIN_SLEEP_S
    assert len(sleeps) <= 0.2 / common.MIN_SLEEP_S + 1  # at most one per millisecond
