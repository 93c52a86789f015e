"""The one atomic writer: readers see the old file or the new one, never a torn one, and
what a killed writer leaves behind is cleared."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from fabricscope.atomicfile import remove_orphans, write_atomically


def test_replaces_with_the_requested_mode_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "sub" / "targets.json"
    write_atomically(target, "one\n", mode=0o644)
    write_atomically(target, b"two\n", mode=0o600, durable=True)
    assert target.read_bytes() == b"two\n"
    assert oct(target.stat().st_mode & 0o777) == oct(0o600)
    assert os.listdir(target.parent) == ["targets.json"]


def test_staging_directory_keeps_temporary_files_out_of_the_listed_one(tmp_path):
    (tmp_path / ".staging").mkdir()
    write_atomically(tmp_path / "counters" / "port_rcv_packets", "7\n", mode=0o444, staging_dir=tmp_path / ".staging")
    assert os.listdir(tmp_path / "counters") == ["port_rcv_packets"]
    assert os.listdir(tmp_path / ".staging") == []


def test_a_writer_killed_mid_write_leaves_the_old_file_and_an_orphan_that_is_removed(tmp_path):
    target = tmp_path / "state.json"
    write_atomically(target, '{"old": true}')
    # A writer stopped between creating its temporary file and the rename, as SIGKILL would.
    script = textwrap.dedent(f"""
        import os, signal, tempfile
        import fabricscope.atomicfile as a
        real = os.replace
        def die(*args):
            os.kill(os.getpid(), signal.SIGKILL)
        os.replace = die
        a.write_atomically({str(target)!r}, '{{"new": true}}')
    """)
    child = subprocess.run([sys.executable, "-c", script])
    assert child.returncode == -signal.SIGKILL
    assert target.read_text() == '{"old": true}'
    orphans = [name for name in os.listdir(tmp_path) if name != "state.json"]
    assert len(orphans) == 1 and orphans[0].startswith(".state.json.")
    assert remove_orphans(target) == [tmp_path / orphans[0]]
    assert os.listdir(tmp_path) == ["state.json"]
