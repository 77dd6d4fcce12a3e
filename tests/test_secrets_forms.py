"""Secrets in the forms they travel in: private key blocks wherever they appear, a secret
variable's value percent-encoded or in base64, Basic credentials; and the content rule that keeps
a plain word out of the last-line scrub, with the note a path gets when it does lose a component.

Each leak case has its over-redaction twin; the property tests draw values, encodings and
contexts at random. The capture-wide corpus (every entry point, every output) is
``secret_corpus.py``.
"""

from __future__ import annotations

import base64
import string
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus, unquote

import pytest
import tomllib
from helpers import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from envlock.probe import rules, scrub

R = rules.REDACTED
BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj"


def _key(kind: str = "", end: bool = True, sep: str = "\n") -> str:
    words = f"{kind}PRIVATE KEY"
    return f"-----BEGIN {words}-----{sep}{BODY}{sep}" + (f"-----END {words}-----" if end else "")


# -- private key blocks -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["", "RSA ", "EC ", "DSA ", "OPENSSH ", "ENCRYPTED ", "PGP "])
@pytest.mark.parametrize("context", ["{k}", "cert: {k} (rotate)", "a\n{k}\nb", '{{"key": "{k}"}}'])
def test_a_private_key_block_goes_wherever_it_appears(kind: str, context: str) -> None:
    text = context.format(k=_key(kind))
    cleaned = scrub.scrub_text(text)
    assert BODY not in cleaned and "PRIVATE KEY" not in cleaned and R in cleaned
    assert cleaned == context.format(k=R)  # only the block goes
    assert scrub.scrub_text(cleaned) == cleaned
    # and as a variable whose name says nothing (the defect: CUDA_MPS_CLIENT_CERT)
    assert scrub.env_value("CUDA_MPS_CLIENT_CERT", text) == cleaned


def test_a_key_block_in_any_spelling_goes() -> None:
    for text in (_key(end=False), "x " + _key("RSA ", end=False) + " trailing words",
                 _key(sep="\\n"),  # escaped newlines, as in a JSON or .env file
                 "https://h.example/x?cert=" + quote(_key("OPENSSH "), safe=""),
                 "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n" + BODY + "\n-----END PGP PRIVATE KEY BLOCK-----",
                 "---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\n" + BODY + "\n---- END SSH2 ENCRYPTED PRIVATE KEY ----"):
        cleaned = scrub.scrub_text(text)
        assert BODY not in cleaned and R in cleaned, text
        assert BODY[:20] not in unquote(cleaned)


def test_a_certificate_or_a_public_key_is_kept() -> None:
    """Twin: a certificate, a public key and the words alone are no secret."""
    for text in ("-----BEGIN CERTIFICATE-----\n" + BODY + "\n-----END CERTIFICATE-----",
                 "-----BEGIN PUBLIC KEY-----\n" + BODY + "\n-----END PUBLIC KEY-----",
                 "-----BEGIN RSA PUBLIC KEY-----\n" + BODY + "\n-----END RSA PUBLIC KEY-----",
                 "the PRIVATE KEY of the service, BEGIN to END", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI alice@host"):
        assert scrub.scrub_text(text) == text
        assert scrub.env_value("CUDA_MPS_CLIENT_CERT", text) == text


def test_the_model_refuses_a_key_block_in_a_hand_edited_lock() -> None:
    from helpers import make_lock

    from envlock.errors import LockInvalid
    from envlock.lock import from_dict

    data = make_lock().model_dump(mode="json", exclude_none=True)
    data["env"] = {"CUDA_MPS_CLIENT_CERT": _key()}
    with pytest.raises(LockInvalid, match=r"env\.CUDA_MPS_CLIENT_CERT"):
        from_dict(data, verify_seal=False)
    data["env"] = {"CUDA_MPS_CLIENT_CERT": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"}
    from_dict(data, verify_seal=False)  # the twin


# -- a secret value, encoded ----------------------------------------------------------------------

VALUE = "Hx7q+Zr/Tk9=w@p:ss!"
OTHER = "Qa2w+Zr/Tk9=w@p:ss!"  # the same shape, not the secret


def _b64(text: str, urlsafe: bool = False) -> str:
    return (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(text.encode()).decode()


ENCODINGS: dict[str, Callable[[str], str]] = {
    "percent": lambda v: quote(v, safe=""),
    "percent, lower-case hex": lambda v: quote(v, safe="").replace("%2B", "%2b").replace("%2F", "%2f"),
    "percent, some characters": lambda v: v.replace("+", "%2B").replace(":", "%3A"),
    "form": lambda v: quote_plus(v + " and more"),
    "base64": _b64,
    "base64 url-safe, unpadded": lambda v: _b64(v, urlsafe=True).rstrip("="),
    "base64 of user:value": lambda v: _b64("alice:" + v),
    "base64 of user:value, percent-encoded": lambda v: quote(_b64("bo:" + v), safe=""),
}


@pytest.mark.parametrize("form", sorted(ENCODINGS))
def test_a_secret_value_goes_in_every_encoding(form: str) -> None:
    secrets = scrub.secret_values({"DB_PASSWORD": VALUE})
    encoded = ENCODINGS[form](VALUE)
    for text in (encoded, f"note {encoded} end", f"https://h.example/cb?state={encoded}&page=2",
                 f"Authorization: Bearer {encoded}"):
        cleaned = scrub.scrub_string(text, secrets)
        assert encoded not in cleaned and VALUE not in unquote(cleaned), (form, cleaned)
        assert R in cleaned and scrub.scrub_string(cleaned, secrets) == cleaned
    # only the value goes: "+and+more" after the form-encoded one is the note's own text
    assert scrub.scrub_string(f"note {encoded} end", secrets) == f"note {encoded.replace(quote_plus(VALUE), R)} end" \
        if form == "form" else f"note {R} end"


@pytest.mark.parametrize("form", sorted(ENCODINGS))
def test_the_same_encoding_of_another_value_is_kept(form: str) -> None:
    """Twin: escapes and base64 that do not hold the secret value come out verbatim."""
    secrets = scrub.secret_values({"DB_PASSWORD": VALUE})
    text = f"note {ENCODINGS[form](OTHER)} end"
    assert scrub.scrub_string(text, secrets) == text


def test_basic_credentials_go_whoever_wrote_them() -> None:
    header = "Authorization: Basic " + base64.b64encode(b"deploy:n0t-in-any-variable").decode()
    assert scrub.scrub_text(header) == f"Authorization: Basic {R}"
    assert scrub.scrub_text("curl -H 'authorization: basic YWxpY2U6cHc='") == f"curl -H 'authorization: basic {R}'"
    # twins: no user:password behind the word
    for text in ("Basic training, run 3", "basic dGVzdA== decodes to test", "BASIC settings", "Basic"):
        assert scrub.scrub_text(text) == text


# -- which values are scrubbed from everywhere: the content rule -----------------------------------

CREDENTIALS = ["tok3nvalue99", "Summer2024", "hunter2!", "p@ss word", "Zq7x001LEAKv9W", "a1b2c3d4e5f6a7b8",
               "correcthorsebatterystaple", "hf_" + "a" * 34, "s3cr3t/passw0rd", "Exp3riments2024"]
NAMES = ["experiments", "my-experiments", "run-2024-01-15", "gnome-classic", "MyExperiments",
         "/home/alice/experiments", "requests", "12345678", "cuda-12.1", "x86_64"]


@pytest.mark.parametrize("value", CREDENTIALS)
def test_a_value_that_could_be_a_credential_is_scrubbed_everywhere(value: str) -> None:
    assert rules.could_be_credential(value)
    assert scrub.secret_values({"MY_API_KEY": value}) == [value]


@pytest.mark.parametrize("value", NAMES)
def test_a_value_shaped_like_a_name_is_redacted_only_as_its_variable(value: str) -> None:
    assert not rules.could_be_credential(value)
    assert scrub.secret_values({"MY_API_KEY": value}) == []
    assert scrub.env_value("MY_API_KEY", value) == R


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def test_a_project_under_a_secret_word_keeps_its_paths(tmp_path: Path) -> None:
    """MY_API_KEY=experiments and a project under .../experiments/: the lock still says which
    environment it describes (it read ``/…/<redacted>/.venv/bin/python``)."""
    project = tmp_path / "experiments" / "proj"
    project.mkdir(parents=True)
    python = _venv(project / ".venv")
    res = run_cli("capture", "--no-torch", "--python", str(python), "-o", "env.lock", cwd=project,
                  env={"MY_API_KEY": "experiments"})
    assert res.returncode == 0, res.stderr
    lock = tomllib.loads((project / "env.lock").read_text())
    assert lock["python"]["executable"].startswith(str(project / ".venv"))
    assert lock["python"]["prefix"] == str(project / ".venv")
    assert R not in (project / "env.lock").read_text() and "paths" not in lock.get("probe", {}).get("errors", {})


def test_a_path_that_loses_a_component_says_so(tmp_path: Path) -> None:
    """Twin: a value that could be a credential still goes from every path, and the lock and
    capture say that those paths name no real location."""
    project = tmp_path / "Exp3riments2024"
    project.mkdir()
    python = _venv(project / ".venv")
    res = run_cli("capture", "--no-torch", "--python", str(python), "-o", "env.lock", cwd=project,
                  env={"MY_API_KEY": "Exp3riments2024"})
    assert res.returncode == 0, res.stderr
    text = (project / "env.lock").read_text()
    assert "Exp3riments2024" not in text
    lock = tomllib.loads(text)
    assert lock["python"]["prefix"] == str(tmp_path / R / ".venv")
    note = lock["probe"]["errors"]["paths"]
    assert "python.executable" in note and "python.prefix" in note and "no real location" in note
    assert "paths not captured" in res.stderr and "Exp3riments2024" not in res.stderr + res.stdout


def test_the_paths_note_names_every_changed_path_by_its_scrubbed_key() -> None:
    doc = {"python": {"executable": "/srv/Tok3nDir99/bin/python", "prefix": "/srv/other"},
           "env": {"HF_HOME": "/srv/Tok3nDir99/hf", "Tok3nDir99_X": "/srv/Tok3nDir99"}, "note": "Tok3nDir99"}
    out = scrub.scrub_lock_document(doc, ["Tok3nDir99"])
    note = out["probe"]["errors"]["paths"]
    assert note.startswith("3 paths (python.executable, env.HF_HOME, env.<redacted>_X)")
    assert "Tok3nDir99" not in str(out) and out["python"]["prefix"] == "/srv/other"
    # twin: nothing changed, nothing said
    assert "probe" not in scrub.scrub_lock_document({"python": {"prefix": "/srv/other"}}, ["Tok3nDir99"])


# -- properties -----------------------------------------------------------------------------------

# A credential-like value: letters, digits and the characters a URL must escape, with a letter
# and a digit next to each other so that the content rule holds whatever else is drawn.
_VALUE = st.text(alphabet=string.ascii_letters + string.digits + "+/=@:!#$&?%~ é", min_size=6, max_size=30) \
    .map(lambda s: "Q7" + s + "x")
_CONTEXT = st.sampled_from(["{e}", "see {e} now", "--auth={e}", "https://h.example/x?state={e}&p=1",
                            "a\n{e}\nb", "({e})", "'{e}'", "Authorization: Basic {e}", "k={e};"])


def _percent(value: str, which: list[bool], lower: bool) -> str:
    """``value`` with the characters ``which`` picks (cyclically) percent-encoded; a "%" too
    whenever anything is (an encoder that escapes anything escapes its own escape character)."""
    out = []
    for i, c in enumerate(value):
        hexes = "".join(f"%{b:02X}" for b in c.encode())
        escape = which[i % len(which)] or (c == "%" and any(which))
        out.append((hexes.lower() if lower else hexes) if escape else c)
    return "".join(out)


@settings(max_examples=300, deadline=None)
@given(_VALUE, st.lists(st.booleans(), min_size=1, max_size=8), st.booleans(),
       st.sampled_from(["percent", "base64", "base64-urlsafe"]), st.sampled_from(["", "a:", "bob:", "user1:"]),
       st.booleans(), _CONTEXT)
def test_a_secret_value_never_survives_in_any_encoding(value: str, which: list[bool], lower: bool, how: str,
                                                       user: str, pad: bool, context: str) -> None:
    assert rules.could_be_credential(value)
    secrets = scrub.secret_values({"TORCH_DB_PASSWORD": value})
    if how == "percent":
        encoded = _percent(value, which, lower)
    else:
        encode = base64.b64encode if how == "base64" else base64.urlsafe_b64encode
        encoded = encode((user + value).encode()).decode()
        encoded = encoded if pad else encoded.rstrip("=")
    text = context.format(e=encoded)
    cleaned = scrub.scrub_string(text, secrets)
    assert encoded not in cleaned and value not in cleaned and value not in unquote(cleaned)
    assert scrub.scrub_string(cleaned, secrets) == cleaned and scrub.scrub_text(cleaned) == cleaned


@settings(max_examples=300, deadline=None)
@given(st.lists(st.from_regex(r"[a-z]{2,9}|[0-9]{1,6}", fullmatch=True), min_size=1, max_size=5),
       st.sampled_from(["-", "_", ".", "/"]), _CONTEXT)
def test_a_value_shaped_like_a_name_is_kept_wherever_it_appears(words: list[str], sep: str, context: str) -> None:
    """Twin of the property above: a secret-named variable holding a word or a slug scrubs
    nothing else, so every path and note holding the same text is kept."""
    value = sep.join(words)
    secrets = scrub.secret_values({"MY_API_KEY": value})
    assert secrets == []
    doc: dict[str, Any] = {"python": {"executable": f"/srv/{value}/.venv/bin/python"}, "note": context.format(e=value)}
    if scrub.scrub_text(doc["note"]) == doc["note"]:  # the context alone may be a shape
        assert scrub.scrub_lock_document(doc, secrets) == doc


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["RSA", "EC", "DSA", "OPENSSH", "ENCRYPTED", "SSH2", "PGP"]), max_size=2),
       st.text(alphabet=string.ascii_letters + string.digits + "+/=\n", min_size=20, max_size=200),
       st.booleans(), st.booleans(), st.sampled_from(["{k}", "x {k} y", "a\n{k}\n", '"{k}"', "u?c={k}"]))
def test_a_key_block_never_survives(words: list[str], body: str, end: bool, encoded: bool, context: str) -> None:
    kind = "".join(w + " " for w in words) + "PRIVATE KEY"
    block = f"-----BEGIN {kind}-----\n{body}\n" + (f"-----END {kind}-----" if end else "")
    block = quote(block, safe="") if encoded else block
    cleaned = scrub.scrub_text(context.format(k=block))
    assert block not in cleaned and "PRIVATE" not in cleaned and R in cleaned
    assert scrub.scrub_text(cleaned) == cleaned
    if end:  # what stands around a whole block stays
        assert cleaned == context.format(k=R)


def test_a_value_in_a_url_goes_before_the_url_rules_cut_it() -> None:
    """An unescaped "#" in a value cut the URL there and left the value's first part, which no
    longer matched, in the lock; a value in the userinfo still takes the user with it."""
    value = "Ab3dE5#fG7!h"
    secrets = scrub.secret_values({"DB_PASSWORD": value})
    assert scrub.scrub_string(f"https://h.example/cb?state={value}&page=2", secrets) == \
        f"https://h.example/cb?state={R}&page=2"
    assert scrub.scrub_string(f"index https://alice:{value}@h.example/simple", secrets) == "index https://h.example/simple"
    # twin: the same URLs without the value are kept
    for text in ("https://h.example/cb?state=open&page=2", "https://h.example/simple#egg=x"):
        assert scrub.scrub_string(text, secrets) == text


def test_an_index_token_goes_from_the_file_urls_it_lists_in_any_escape() -> None:
    """export: the index's own token, carried by a file link with other escapes, is replaced
    by the same rule as a secret value in a lock (it was replaced only as written)."""
    from envlock.export.index import SimpleIndex

    index = SimpleIndex("https://idx.lab.example/simple?token=Ab3dE5f%2BGh7iJ9kL1")
    sha = "#sha256=" + "ab" * 32
    for link in ("https://idx.lab.example/files/x-1.0-py3-none-any.whl?state=Ab3dE5f%2bGh7iJ9kL1",
                 "https://idx.lab.example/files/x-1.0-py3-none-any.whl?state=Ab3dE5f+Gh7iJ9kL1"):
        public = index.public_file(link + sha)
        assert public == f"https://idx.lab.example/files/x-1.0-py3-none-any.whl?state={R}{sha}"
    # twin: a link without the token is kept as it is
    plain = "https://idx.lab.example/files/x-1.0-py3-none-any.whl?plain=1" + sha
    assert index.public_file(plain) == plain
