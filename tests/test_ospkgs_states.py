"""dpkg states: a package caught mid-install, held, or waiting on triggers is on disk, not
removed; one whose files are gone (config-files, not-installed) is not listed."""

from __future__ import annotations

import pytest

from envlock.probe.ospkgs import parse_dpkg_status


def _stanza(name: str, status: str) -> str:
    return f"Package: {name}\nStatus: {status}\nArchitecture: amd64\nVersion: 1.0-1\nDescription: x\n y\n\n"


@pytest.mark.parametrize("status", [
    "install ok installed", "install ok half-configured", "install ok unpacked",
    "install reinstreq half-installed", "install ok triggers-pending", "install ok triggers-awaited",
    "hold ok installed", "deinstall ok installed"])
def test_a_package_whose_files_are_there_is_listed(status: str) -> None:
    assert parse_dpkg_status(_stanza("libfoo1", status)) == [
        {"name": "libfoo1", "version": "1.0-1", "arch": "amd64"}]


@pytest.mark.parametrize("status", ["deinstall ok config-files", "purge ok not-installed",
                                    "install ok", "", "install ok installed extra"])
def test_twin_a_package_whose_files_are_gone_or_whose_status_is_garbled_is_not(status: str) -> None:
    assert parse_dpkg_status(_stanza("libfoo1", status)) == []
