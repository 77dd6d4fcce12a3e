"""The capture summary is one line per fact, whatever the lock holds: every value escaped as a
terminal shows it (``text/terminal``), a newline in ``torch.cuda`` included."""

from __future__ import annotations

from helpers import LockFactory

from envlock.report.render import capture_summary


def test_a_newline_in_a_value_cannot_forge_a_summary_line(restore_lock: LockFactory) -> None:
    lock = restore_lock(torch={"version": "2.5.0", "cuda": "12.1"})
    assert lock.torch is not None
    forged = "12.1\nwrote /etc/passwd  id 000000000000\x1b[2K"
    # Built past validation: whatever a character rule allows, the summary must hold.
    bad = lock.model_copy(update={"torch": lock.torch.model_copy(update={"cuda": forged, "cudnn": "9\r1"})})
    summary, _ = capture_summary(bad, "env.lock", "locked the venv\nat ./x")
    assert summary.count("\n") == 3 and "\x1b" not in summary and "\r" not in summary
    assert "CUDA 12.1\\nwrote /etc/passwd" in summary and "cuDNN 9\\r1" in summary
    assert "locked the venv\\nat ./x" in summary
    # The twin: ordinary values print as they are.
    plain, _ = capture_summary(lock, "env.lock", None)
    assert "(CUDA 12.1, cuDNN " in plain and "\\" not in plain
