"""``restore/ociarchive``: the one skopeo conversion, as pack runs it (a real subprocess; a
stand-in skopeo that records what it was given)."""

from __future__ import annotations

import json
from pathlib import Path

from envlock.export.pack import _run_tool
from envlock.restore.ociarchive import to_oci


def test_pack_converts_with_a_policy_of_its_own_and_reports_a_failure(tmp_path: Path) -> None:
    skopeo = tmp_path / "skopeo"
    seen = tmp_path / "seen.json"
    skopeo.write_text("#!/bin/sh\n"
                      f"printf '%s\\n' \"$@\" > {seen}.argv\n"
                      f"cp \"$2\" {seen}\n"
                      "[ \"$6\" = oci-archive:fail ] && { echo 'FATA[0000] no such file' >&2; exit 1; }\n"
                      "exit 0\n")
    skopeo.chmod(0o755)
    archive = tmp_path / "base.docker.tar"
    code, _ = to_oci(str(skopeo), archive, tmp_path / "base.oci.tar", _run_tool)
    argv = (tmp_path / "seen.json.argv").read_text().splitlines()
    assert code == 0 and argv[2:] == ["copy", "--quiet", f"docker-archive:{archive}",
                                      f"oci-archive:{tmp_path / 'base.oci.tar'}"]
    assert json.loads(seen.read_text()) == {"default": [{"type": "insecureAcceptAnything"}]}
    assert not Path(argv[1]).exists()  # the policy lived as long as the call
    assert to_oci(str(skopeo), archive, Path("fail"), _run_tool) == (1, "FATA[0000] no such file\n")
