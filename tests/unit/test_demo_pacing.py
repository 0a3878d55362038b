"""The demo sender's pacing (demo.in_flight): what is in the links to the translator, what waits in it, and what
is on its way to the collector, from the counters it reads."""

from softdta.lab.demo import in_flight

NOTHING_WRITTEN_OFF = (0, 0, 0)


def test_the_python_engines_socket_splits_the_links_from_what_waits_in_the_engine():
    # 1000 sent since the counters stood at (50 off the link, 40 taken into steps and translated, 5 frames not
    # executed)
    counts, before = (50 + 900, 40 + 600, 40 + 600, 5 + 300), (50, 40, 40, 5)
    assert in_flight(1000, counts, before, NOTHING_WRITTEN_OFF) == (100, 300, 300)


def test_reports_in_a_step_no_longer_wait_so_the_next_step_gathers_meanwhile():
    """The engine publishes what it took off its socket before the step translates it."""
    assert in_flight(1000, (900, 800, 300, 0), (0, 0, 0, 0), NOTHING_WRITTEN_OFF) == (100, 100, 0)
    # where the translated count is ahead (a deferred essential report counts again when it is offered again), it
    # counts
    assert in_flight(1000, (900, 800, 850, 0), (0, 0, 0, 0), NOTHING_WRITTEN_OFF) == (100, 50, 0)


def test_without_a_socket_a_report_is_off_the_link_once_translated():
    """The XDP translator, or packet I/O: nothing counts reports off the link or into a step, the translated ones
    are."""
    assert in_flight(1000, (0, 0, 870, 0), (0, 0, 0, 0), NOTHING_WRITTEN_OFF) == (130, 0, 0)
    # a counter that lags the translated count (packet I/O) does not make reports wait twice
    assert in_flight(1000, (500, 0, 870, 0), (0, 0, 0, 0), NOTHING_WRITTEN_OFF) == (130, 0, 0)


def test_what_was_written_off_leaves_only_its_own_hop():
    counts, before = (900, 600, 600, 300), (0, 0, 0, 0)
    assert in_flight(1000, counts, before, (60, 0, 0)) == (40, 300, 300)  # lost in the links: never waits
    assert in_flight(1000, counts, before, (0, 200, 0)) == (100, 100, 300)
    assert in_flight(1000, counts, before, (0, 0, 250)) == (100, 300, 50)
