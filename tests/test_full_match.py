"""Validation regexes match the whole value: ``$`` alone accepts a trailing newline."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from envlock.errors import UnsafeValue
from envlock.lock import Package
from envlock.restore import values

CASES: list[tuple[Callable[[str], object], str]] = [
    (values.dist_name, "evilx"),
    (lambda v: values.version(v), "1.0"),
    (values.digest, "sha256:" + "a" * 64),
    (lambda v: values.package_hash(v), "sha256:" + "a" * 64),
    (values.image_ref, "python:3.11"),
    (values.env_name, "CUBLAS_WORKSPACE_CONFIG"),
    (lambda v: values.env_value(v), ":4096:8x"),
    (lambda v: values.abs_path(v), "/opt/venvx"),
    (lambda v: values.url(v), "https://example.org/simple"),
    (lambda v: values.vcs_commit(v, vcs="git"), "a" * 40),
]


@pytest.mark.parametrize("check, good", CASES)
def test_a_trailing_newline_is_refused(check: Callable[[str], object], good: str) -> None:
    check(good)  # the value itself is fine
    with pytest.raises(UnsafeValue):
        check(good + "\n")


def test_the_model_refuses_a_name_with_a_trailing_newline() -> None:
    Package(name="evilx", version="1.0")
    with pytest.raises(ValidationError, match="distribution name"):
        Package(name="evilx\n", version="1.0")


def test_no_validation_regex_relies_on_match_with_a_dollar() -> None:
    # re.match(r"^...$") accepts "x\n"; every validation in the package uses fullmatch.
    root = Path(__file__).resolve().parent.parent / "envlock"
    offenders = []
    for path in root.rglob("*.py"):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\bre\.match\(r?[\"'][^\"']*\$[\"']", line):
                offenders.append(f"{path.name}:{n}")
    assert offenders == []
