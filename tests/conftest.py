import pytest


@pytest.fixture(scope="session")
def guest():
    """One QEMU soft-RoCE guest for the whole session (tests marked interop; softdta/lab/rxe.py)."""
    from softdta.kernel.netns import NETNS_DIR
    from softdta.lab import rxe as rxe_lab
    rxe_lab.cleanup()
    with rxe_lab.Guest().boot() as booted:
        yield booted
    assert not (rxe_lab.RUN_DIR / booted.name).exists() and not (NETNS_DIR / booted.name).exists()
