"""tests.common.wait_for_line, which the live tests wait on: a line is found however the pipe delivered it."""

import subprocess
import sys

import pytest

from tests.common import wait_for_line


@pytest.fixture
def two_lines_in_one_write():
    process = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                                "sys.stderr.write('first\\nsecond\\n'); sys.stderr.flush(); time.sleep(30)"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield process
    process.kill()
    process.wait()


def test_a_line_that_came_in_one_write_with_the_line_before_is_found(two_lines_in_one_write):
    """A buffered readline of the first would take the second in too, where select no longer sees it."""
    assert wait_for_line(two_lines_in_one_write, "first", 5, stream="stderr") == "first\n"
    assert wait_for_line(two_lines_in_one_write, "second", 5, stream="stderr") == "second\n"


def test_a_process_that_exits_without_the_line_is_reported_at_once():
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stderr.write('bye\\n'); sys.exit(3)"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(AssertionError, match=r"exited \(3\)"):
        wait_for_line(process, "never", 20)
