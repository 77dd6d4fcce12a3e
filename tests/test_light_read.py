"""The read path without pydantic (lockdata) agrees with the models on every lock it accepts,
and leaves every other lock to them: same form, same report, same verdict, same errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import make_lock, probe_doc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envlock import shapegen
from envlock._capture import build_lock
from envlock._verify import check, current_lock, judge
from envlock.commands import main
from envlock.errors import LockInvalid, LockTampered
from envlock.lockdata import is_view, light_data, light_load
from envlock.lockfile import dumps, load, save, seal
from envlock.model import Lock
from envlock.render import comparison_json, show_json, show_markdown, show_text, verify_text

REPO = Path(__file__).resolve().parent.parent

TORCH = {"version": "2.13.0+cu126", "cuda": "12.6", "cudnn": "90501", "nccl": "2.21.5",
         "arch_list": ["sm_80", "sm_90"], "config_sha256": "a" * 64, "cpu_capability": "AVX2",
         "build": {"compiler": "GCC 11.2", "blas": "MKL", "options": {"USE_CUDA": "ON"}}}
GPU = {"source": "nvml", "driver": "550.54", "cuda_driver": "12.4",
       "devices": [{"index": 0, "name": "NVIDIA H100", "compute_capability": "9.0",
                    "memory_total_mib": 81559, "uuid_sha256": "b" * 64}]}
RICH: dict[str, Any] = {
    "image": {"in_container": True, "source": "env", "reference": "ghcr.io/lab/train:1",
              "digest": "sha256:" + "c" * 64},
    "torch": TORCH,
    "gpu": GPU,
    "determinism": {"torch_loaded": True, "deterministic_algorithms": True, "cudnn_benchmark": False,
                    "float32_matmul_precision": "high", "num_threads": 8,
                    "env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, "late": ["OMP_NUM_THREADS"]},
    "seeds": {"seed": 1234, "seed_source": "envlock", "python_hash_seed": "0",
              "hash_randomization": False, "torch_initial_seed": 1234},
    "env": {"LD_LIBRARY_PATH": "/usr/local/cuda/lib64", "HF_TOKEN": "<redacted>"},
    "git": {"commit": "d" * 40, "branch": "main", "dirty": True, "untracked": 2},
    "canary": {"version": 1, "torch": "2.13.0", "settings": {"threads": 8, "env.OMP_NUM_THREADS": "8"},
               "results": [{"name": "matmul", "device": "cpu", "dtype": "float32", "sha256": "e" * 64}],
               "errors": {"matmul[cuda:0,bfloat16]": "no bf16"}},
    "conda": {"packages": [{"name": "mkl", "version": "2024.0", "build": "h1", "channel": "conda-forge"}]},
    "os_packages": {"manager": "dpkg", "packages": ["libc6:amd64=2.36-9", "zlib1g:amd64=1:1.2.13"]},
    "packages": [
        {"name": "numpy", "version": "2.1.0", "installer": "pip", "requested": True,
         "hashes": ["sha256:" + "f" * 64], "record_sha256": "1" * 64, "files_sha256": "2" * 64},
        {"name": "torch", "version": "2.13.0+cu126", "source": "url",
         "url": "https://download.pytorch.org/whl/torch.whl", "record_sha256": "3" * 64},
    ],
    "duplicates": [{"name": "numpy", "version": "1.26.0", "active_version": "2.1.0", "path_index": 3}],
    "probe": {"version": 1, "errors": {"git": "not a repository"}, "torch_facts": "cached"},
}


def _write(tmp_path: Path, lock: Lock, name: str = "env.lock") -> Path:
    path = tmp_path / name
    save(lock, path)
    return path


def _canonical(lock: Lock) -> dict[str, Any]:
    return dict(lock.model_dump(mode="json", exclude_none=True))


LOCKS = {
    "minimal": {},
    "rich": RICH,
    "optional sections missing": {"image": {}, "determinism": {}, "seeds": {}, "packages": [],
                                  "probe": {}},
    "no packages, no env": {"packages": [], "env": {}},
}


@pytest.mark.parametrize("sections", LOCKS.values(), ids=list(LOCKS))
def test_light_read_is_the_models_canonical_form(tmp_path: Path, sections: dict[str, Any]) -> None:
    path = _write(tmp_path, make_lock(**sections))
    light, full = light_load(path), load(path)
    assert light is not None and is_view(light)
    assert light.model_dump(mode="json", exclude_none=True) == _canonical(full)
    assert light.short_id == full.short_id and light.envlock.created_at == full.envlock.created_at
    for render in (show_text, show_json, show_markdown):
        assert render(light) == render(full)


def test_optional_tables_left_out_of_the_file_mean_the_models_defaults(tmp_path: Path) -> None:
    """The writer leaves empty tables and `hashes = []` out; reading fills them back as the model's
    defaults, or the hash would not match."""
    path = _write(tmp_path, make_lock(packages=[{"name": "six", "version": "1.16.0"}], env={}))
    text = path.read_text()
    assert "[env]" not in text and "hashes" not in text and "[image]" in text
    light = light_load(path)
    assert light is not None
    assert light.env == {} and light.packages[0].hashes == [] and light.packages[0].source == "index"
    assert light.torch is None and light.image.in_container is False


def _verdicts(tmp_path: Path, expected: dict[str, Any], now: dict[str, Any], *,
              strict: bool = False, deep: dict[str, Any] | None = None) -> tuple[str, str]:
    """The JSON and text report of one comparison, read both ways."""
    path = _write(tmp_path, make_lock(**expected))
    doc = probe_doc(**now)
    out = []
    for light in (True, False):
        lock = light_load(path) if light else load(path)
        assert lock is not None and is_view(lock) is light
        cur = current_lock(json.loads(json.dumps(doc)), light=light)
        assert is_view(cur) is light
        cmp = judge(lock, cur, deep, strict=strict, process_state="report", limit=10)
        out.append((comparison_json(cmp, id=lock.short_id, torch_facts=cur.probe.torch_facts),
                    verify_text(cmp, lock, "env.lock", show_info=True)))
    assert out[0] == out[1]
    return out[0]


CHANGES = {
    "same": ({}, {}),
    "rich vs minimal": (RICH, {}),
    "minimal vs rich": ({}, RICH),
    "package version": (RICH, {**RICH, "packages": [{**RICH["packages"][0], "version": "2.2.0"},
                                                     RICH["packages"][1]]}),
    "package rebuilt": (RICH, {**RICH, "packages": [{**RICH["packages"][0], "record_sha256": "9" * 64},
                                                     RICH["packages"][1]]}),
    "torch build": (RICH, {**RICH, "torch": {**TORCH, "build": {"compiler": "GCC 12"}}}),
    "os packages": (RICH, {**RICH, "os_packages": {"manager": "dpkg",
                                                   "packages": ["libc6:amd64=2.37-1", "curl:amd64=8"]}}),
    "seeds and flags": (RICH, {**RICH, "seeds": {"hash_randomization": True},
                               "determinism": {"torch_loaded": True}}),
    "gpu gone": (RICH, {**RICH, "gpu": None}),
    "no deep fields now": (RICH, {**RICH, "packages": [{"name": "numpy", "version": "2.1.0"},
                                                        RICH["packages"][1]]}),
}


@pytest.mark.parametrize(("expected", "now"), CHANGES.values(), ids=list(CHANGES))
def test_light_and_full_give_the_same_report(tmp_path: Path, expected: dict[str, Any],
                                              now: dict[str, Any]) -> None:
    for strict in (False, True):
        _verdicts(tmp_path, expected, now, strict=strict)


def test_deep_findings_merge_the_same_way(tmp_path: Path) -> None:
    report = {"dists": {"numpy": {"modified": ["numpy/core.py"], "added": ["numpy/x.py"]}},
              "files": 10, "bytes": 100, "seconds": 0.1, "workers": 2}
    as_json, _ = _verdicts(tmp_path, RICH, RICH, deep=report)
    assert '"files.numpy.numpy/core.py"' in as_json


def test_tampered_lock_is_refused_as_before(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, make_lock(**RICH))
    path.write_text(path.read_text().replace('version = "2.1.0"', 'version = "2.1.1"'))
    assert light_load(path) is None
    with pytest.raises(LockTampered):
        load(path)
    assert main(["verify", str(path), "--python", sys.executable, "--no-torch"]) == 2
    assert "was edited after capture" in capsys.readouterr().err
    assert main(["show", str(path)]) == 2
    assert "was edited after capture" in capsys.readouterr().err


def test_tampered_fingerprint_alone_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, make_lock())
    text = path.read_text()
    fp = load(path).envlock.fingerprint
    assert fp is not None
    path.write_text(text.replace(fp, "sha256:" + "0" * 64))
    assert light_load(path) is None
    with pytest.raises(LockTampered):
        load(path)


def test_unsealed_lock_goes_through_the_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lock = make_lock()
    bare = lock.model_copy(update={"envlock": lock.envlock.model_copy(
        update={"fingerprint": None, "integrity": None})})
    path = tmp_path / "env.lock"
    path.write_text(dumps(bare))
    assert light_load(path) is None
    assert main(["show", str(path)]) == 2
    assert "is not sealed" in capsys.readouterr().err


def test_newer_schema_is_refused_as_before(tmp_path: Path) -> None:
    path = _write(tmp_path, make_lock())
    path.write_text(path.read_text().replace("schema_version = 1", "schema_version = 2"))
    assert light_load(path) is None
    with pytest.raises(LockInvalid, match="reads up to"):
        load(path)


def test_older_schema_version_is_read_by_the_models_and_verifies_the_same(tmp_path: Path) -> None:
    """A lock of another schema version is never read by the light path; the verdict and the
    report of a real verify (probe included) are the same either way."""
    current = _write(tmp_path, make_lock(), "current.lock")
    older_lock = make_lock()
    older_lock = older_lock.model_copy(update={"envlock": older_lock.envlock.model_copy(
        update={"schema_version": 0})})
    older = _write(tmp_path, older_lock, "older.lock")
    assert light_load(older) is None and light_load(current) is not None
    results = [check(p, python=sys.executable, torch=False, in_process=False, limit=10)
               for p in (current, older)]
    assert [r.light for r in results] == [True, False]
    assert results[0].comparison.to_dict() == results[1].comparison.to_dict()
    assert results[0].expected.short_id == results[1].expected.short_id


def test_cli_verify_json_is_the_same_on_both_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fresh = _write(tmp_path, build_lock(probe_doc()), "fresh.lock")
    lock = load(fresh)
    older = _write(tmp_path, lock.model_copy(update={"envlock": lock.envlock.model_copy(
        update={"schema_version": 0})}), "older.lock")
    reports = []
    for path in (fresh, older):
        code = main(["verify", str(path), "--python", sys.executable, "--no-torch", "--json"])
        out = json.loads(capsys.readouterr().out)
        out.pop("lock")
        reports.append((code, out))
    assert reports[0] == reports[1]


def test_the_generated_shape_is_the_models() -> None:
    """lockshape.py is derived from model.py; regenerate it with `python -m envlock.shapegen`."""
    assert (REPO / "envlock" / "lockshape.py").read_text() == shapegen.render()


# -- fuzz: the light read takes exactly what the models accept, as they dump it ---------------------

def _paths(data: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    out: list[tuple[str | int, ...]] = []
    if isinstance(data, dict):
        for k, v in data.items():
            out.append((*prefix, k))
            out += _paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += _paths(v, (*prefix, i))
    return out


_RICH_DATA = _canonical(make_lock(**RICH))
_RICH_PATHS = [p for p in _paths(_RICH_DATA) if isinstance(p[-1], str)]


def _without(data: Any, path: tuple[str | int, ...]) -> Any:
    data = json.loads(json.dumps(data))
    node = data
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return data


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_RICH_PATHS), max_size=4), st.sampled_from([None, 0, "", [], {}, "x"]),
       st.sampled_from(_RICH_PATHS))
def test_canonical_agrees_with_the_models(removed: list[tuple[str | int, ...]], value: Any,
                                          replaced: tuple[str | int, ...]) -> None:
    """Keys removed (a default stands in) or a value replaced by one of another type, then sealed
    as the models would: the light read gives exactly the models' dump, or leaves the lock to them
    (where a validator reorders rows, so the seal over the raw order cannot match)."""
    data = _RICH_DATA
    for path in removed:
        try:
            data = _without(data, path)
        except (KeyError, IndexError, TypeError):
            continue
    data = json.loads(json.dumps(data))
    node = data
    try:
        for key in replaced[:-1]:
            node = node[key]
        node[replaced[-1]] = value
    except (KeyError, IndexError, TypeError):
        pass
    if isinstance(data.get("envlock"), dict):
        data["envlock"]["created_at"] = Lock.model_validate(_RICH_DATA).envlock.created_at
    try:
        sealed = _canonical(seal(Lock.model_validate(data)))
    except ValueError:
        return  # the models refuse it, so no lock envlock sealed holds it
    data["envlock"].update(fingerprint=sealed["envlock"]["fingerprint"],
                           integrity=sealed["envlock"]["integrity"])
    got = light_data(data)
    assert got is None or got == sealed
    reordered = any(p[0] in ("packages", "os_packages") for p in (*removed, replaced))
    if not reordered and sealed["envlock"].get("schema_version") == 1:
        # No validator reorders these tables, and the schema is this one: the light read must
        # take it (another schema version is the models' to read, by design).
        assert got == sealed


def test_a_lock_sealed_before_the_hashes_moved_to_lockcore_still_verifies() -> None:
    """fixtures/sealed/rich.lock was sealed by the pydantic-side hashing (model_dump with
    exclude=FINGERPRINT_EXCLUDE) that lockcore replaced: both read paths must accept it."""
    path = REPO / "tests" / "fixtures" / "sealed" / "rich.lock"
    full = load(path)
    light = light_load(path)
    assert light is not None
    assert light.model_dump(mode="json", exclude_none=True) == _canonical(full)
    assert full.envlock.fingerprint == seal(full).envlock.fingerprint
