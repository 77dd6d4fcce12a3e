"""``envlock.probe.imageref``: the one image-reference parser (probe, restore, engine)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envlock.probe import imageref
from envlock.probe.imageref import ImageRef, InvalidReference

DIGEST = "sha256:" + "ab" * 32
IMAGE_ID = "sha256:" + "cd" * 32


@pytest.mark.parametrize(("ref", "parts"), [
    ("python", ("python", None, None)),
    ("python:3.11-slim", ("python", "3.11-slim", None)),
    (f"python@{DIGEST}", ("python", None, DIGEST)),
    (f"nvcr.io/nvidia/pytorch:24.01-py3@{DIGEST}", ("nvcr.io/nvidia/pytorch", "24.01-py3", DIGEST)),
    ("localhost:5000/team/img", ("localhost:5000/team/img", None, None)),  # a port, not a tag
    ("localhost:5000/team/img:v1", ("localhost:5000/team/img", "v1", None)),
    ("localhost/envlock/x:1", ("localhost/envlock/x", "1", None)),
    ("a__b/c-d.e_f:T_1.x-y", ("a__b/c-d.e_f", "T_1.x-y", None)),
    (IMAGE_ID, ("", None, IMAGE_ID)),
])
def test_parse_gives_the_parts(ref: str, parts: tuple[str, str | None, str | None]) -> None:
    parsed = imageref.parse(ref)
    assert (parsed.repo, parsed.tag, parsed.digest) == parts
    assert imageref.split(ref) == parsed
    assert parsed.pinned is (parts[2] is not None)


@pytest.mark.parametrize(("ref", "reason"), [
    ("Python:3.11", "not an image reference"),  # upper case in a path component
    ("python:", "bad tag"),
    ("python:-x", "bad tag"),
    ("python@sha256:abc", "the digest is not sha256:<64 hex digits>"),
    ("python@", "the digest is not sha256:<64 hex digits>"),
    (f"@{DIGEST}", "not an image reference"),  # a digest with no repository is no image id
    (f"python@{DIGEST}@{DIGEST}", "the digest is not sha256:<64 hex digits>"),
    ("a b", "not an image reference"),
    ("x;rm -rf /", "not an image reference"),
    ("a" * 513, "not an image reference"),
    (None, "not an image reference"),
])
def test_parse_refuses_with_the_reason(ref: object, reason: str) -> None:
    with pytest.raises(InvalidReference) as exc:
        imageref.parse(ref)
    assert exc.value.reason == reason and isinstance(exc.value, ValueError)


def test_split_digest_keeps_what_a_container_said() -> None:
    assert imageref.split_digest(f"python:3.11@{DIGEST}") == ("python:3.11", DIGEST)
    assert imageref.split_digest("python:3.11") == ("python:3.11", None)
    assert imageref.split_digest(IMAGE_ID) == (IMAGE_ID, None)  # an id is no repository digest
    assert imageref.split_digest("odd@md5:00") == ("odd@md5:00", None)


def test_repositories_compare_as_engines_spell_them() -> None:
    assert imageref.same_repo("docker.io/library/python", "python")
    assert imageref.same_repo("library/python", "docker.io/python")
    assert imageref.same_repo("localhost/envlock/x", "envlock/x")
    assert not imageref.same_repo("other/python", "python")  # a suffix is not the same repository
    assert not imageref.same_repo("ghcr.io/a/python", "python")
    assert ImageRef("localhost/x").local and not ImageRef("localhost:5000/x").local
    assert imageref.same_ref("localhost/envlock/proj:0123", "envlock/proj:0123")
    assert imageref.same_ref("docker.io/library/python:3.11", "python:3.11")
    assert not imageref.same_ref("myenvlock/proj:0123", "envlock/proj:0123")
    assert not imageref.same_ref("envlock/proj:0123", "envlock/proj:01234")


def test_module_is_python38_stdlib_only_and_imports_nothing_of_envlock() -> None:
    source = Path(imageref.__file__).read_text(encoding="utf-8")
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


# -- fuzz ---------------------------------------------------------------------------------------

_component = st.from_regex(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*", fullmatch=True)
_domain = st.from_regex(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[a-z0-9]+)*(?::[0-9]{1,5})?",
                        fullmatch=True)
_tag = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True)
_digest = st.from_regex(r"sha256:[0-9a-f]{64}", fullmatch=True)


@st.composite
def _valid(draw: st.DrawFn) -> tuple[str, str | None, str | None]:
    path = "/".join(draw(st.lists(_component, min_size=1, max_size=3)))
    domain = draw(st.one_of(st.none(), _domain))
    repo = f"{domain}/{path}" if domain else path
    return repo, draw(st.one_of(st.none(), _tag)), draw(st.one_of(st.none(), _digest))


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(_valid())
def test_every_reference_of_the_grammar_parses_into_its_parts(parts: tuple[str, str | None, str | None]) -> None:
    repo, tag, digest = parts
    ref = repo + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")
    if len(ref) > imageref.MAX_LENGTH:
        return
    assert imageref.parse(ref) == ImageRef(repo, tag, digest)


_junk = st.text(alphabet=st.sampled_from("aZ09:/@._-+ $;\n" + "sha256" + "\x00é"), max_size=40)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=60), _junk))
def test_any_text_is_parsed_or_refused_and_nothing_else(value: str) -> None:
    cut = imageref.split(value)  # never raises
    rebuilt = cut.digest if imageref.is_image_id(value) else (
        cut.name + (f"@{cut.digest}" if cut.digest is not None else ""))
    assert rebuilt == value
    name, digest = imageref.split_digest(value)
    assert (name if digest is None else f"{name}@{digest}") == value
    try:
        parsed = imageref.parse(value)
    except InvalidReference as exc:
        assert exc.reason and exc.value == value
        return
    assert parsed == cut
    assert not any(c in value for c in " $;\n\x00")
