"""The verify report reads in one screen: a summary first when many things differ."""

from __future__ import annotations

from helpers import make_lock

from envlock.drift.compare import compare
from envlock.report.render import verify_text
from envlock.report.verify import DETAIL_LINES, SUMMARY_AFTER

DIGEST = "sha256:" + "ab" * 32


def _pkgs(n: int, version: str) -> list[dict[str, object]]:
    return [{"name": f"pkg{i:02d}", "version": version, "installer": "pip"} for i in range(n)]


def test_many_differences_lead_with_a_summary_then_the_first_details() -> None:
    old = make_lock(packages=_pkgs(30, "1.0"),
                    torch={"version": "2.13.0+cu130", "cuda": "13.0", "cudnn": "91200"})
    new = make_lock(packages=[*_pkgs(25, "2.0"), {"name": "extra", "version": "1"}],
                    python={"version": "3.12.3", "implementation": "cpython", "prefix_kind": "venv",
                            "soabi": "cpython-312-x86_64-linux-gnu"},
                    torch={"version": "1.13.0a0", "cuda": "13.0"})
    cmp = compare(old, new)
    text = verify_text(cmp, old, "env.lock")
    lines = text.splitlines()
    summary = lines[lines.index("  summary:") + 1:]
    assert summary[0].split() == ["python", "3.11.7", "->", "3.12.3"]
    assert "torch" in summary[1] and "2.13.0+cu130 -> 1.13.0a0" in summary[1]
    assert "cuDNN 91200 -> -" in summary[1] and "CUDA 13.0" in summary[1]
    packages = next(x for x in summary if x.strip().startswith("packages"))
    assert "31 breaking (5 packages removed, 1 package added, version changed in 25 packages)" in packages
    shown = [x for x in lines if x.lstrip().startswith(("BREAKING", "warning"))]
    assert len(shown) == DETAIL_LINES
    assert len(lines) < 30
    assert "--all lists every one" in text
    everything = verify_text(cmp, old, "env.lock", show_info=True)
    assert len([x for x in everything.splitlines() if x.lstrip().startswith("BREAKING")]) == len(cmp.breaking)


def test_few_differences_are_listed_without_a_summary() -> None:
    old = make_lock(packages=_pkgs(3, "1.0"))
    cmp = compare(old, make_lock(packages=_pkgs(3, "1.1")))
    assert len(cmp.breaking) <= SUMMARY_AFTER
    text = verify_text(cmp, old, "env.lock")
    assert "summary:" not in text and "pkg00 1.0 -> 1.1" in text


def test_lock_of_an_image_checked_outside_it_points_at_restore() -> None:
    old = make_lock(image={"in_container": True, "source": "engine", "reference": "repo/img:1",
                           "id": DIGEST})
    cmp = compare(old, make_lock())
    text = verify_text(cmp, old, "env.lock")
    assert "`envlock restore env.lock` rebuilds it and checks it from inside" in text
    # The twin: a lock of no image says nothing of the kind.
    plain = make_lock()
    assert "envlock restore" not in verify_text(compare(plain, make_lock()), plain, "env.lock")
    # The check of a restored image is another image by design: no hint to restore it again.
    inside = verify_text(cmp, old, "env.lock inside envlock/x:1", restored=True)
    assert "envlock restore" not in inside and "describes the image" not in inside


def test_the_summary_says_what_of_a_package_changed() -> None:
    """"packages 26 info (1 removed, ...)" read as a missing package where a URL was removed:
    a field is named, a whole package is called a package."""
    url = "https://files.example.org/pkg00-1.0-py3-none-any.whl"
    old = make_lock(packages=[{**p, "source": "url", "url": url} if p["name"] == "pkg00" else p for p in _pkgs(14, "1.0")]
                    + [{"name": "gone", "version": "1"}])
    new = make_lock(packages=[{**p, "installer": "uv"} if p["name"] != "pkg00" else {**p, "source": "url"}
                              for p in _pkgs(14, "1.0")])
    text = verify_text(compare(old, new), old, "env.lock", show_info=True)
    packages = next(x for x in text.splitlines() if x.strip().startswith("packages"))
    assert packages.split(None, 1)[1] == ("1 breaking, 1 warning, 13 info (1 package removed, "
                                          "installer changed in 13 packages, url removed in 1 package)"), text
