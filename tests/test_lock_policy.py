"""Every field of the lock declares its policy beside itself, and what is derived from the
policies is what the lock always had (fingerprints of existing locks depend on it)."""

from __future__ import annotations

from pydantic import BaseModel

from envlock import lock as lockio
from envlock.lock import Lock, Policy, policies
from envlock.lock._policy import fingerprint_exclude, nested_model


def _models(model: type[BaseModel], seen: dict[str, type[BaseModel]]) -> dict[str, type[BaseModel]]:
    seen[model.__name__] = model
    for field in model.model_fields.values():
        inner = nested_model(field.annotation)
        if inner is not None and inner[0].__name__ not in seen:
            _models(inner[0], seen)
    return seen


def test_every_field_of_every_model_has_a_policy() -> None:
    models = _models(Lock, {})
    assert len(models) > 15  # the walk reaches the nested tables
    missing = [f"{name}.{field}" for name, model in models.items()
               for field in model.model_fields if field not in policies(model)]
    assert missing == []


def test_a_field_without_a_policy_is_found() -> None:
    class Bare(BaseModel):
        x: int = 0

    assert policies(Bare) == {}


def test_the_fingerprint_leaves_out_host_facts_and_process_state() -> None:
    # Process state (what a running process set: seeds, every torch flag) and the image's
    # identity (where the stack ran; a restored image is new by construction) are out too.
    from envlock.lock import Determinism

    spelled = {
        "envlock": True, "probe": True, "git": True, "env": True, "canary": True,
        # What a process loaded depends on what it imported; caches and requirements are not
        # the environment: one stack keeps one id whoever captured it.
        "native": True, "compile": True, "requires": True,
        "image": {"source", "reference", "container_id", "in_container", "engine", "digest", "id"},
        "platform": {"kernel", "cpu_model", "cpu_count", "os_pretty_name"},
        "python": {"executable", "prefix"},
        "torch": {"cuda_available", "device_count", "cpu_capability"},
        "gpu": {"devices": {"__all__": {"uuid_sha256", "index", "torch_kernels"}}},
        "determinism": set(Determinism.model_fields) - {"env"},
        "seeds": {"seed", "seed_source", "torch_initial_seed"},
        "packages": {"__all__": {"installer", "requested", "files_sha256"}},
        # Where a conda archive was fetched from and what was asked for, not what it is (its
        # sha256); the virtual packages are the capturing host's.
        "conda": {"packages": {"__all__": {"url", "requested_specs"}}, "virtual_packages": True},
    }

    def as_dicts(spec: object) -> object:
        if isinstance(spec, set):
            return dict.fromkeys(spec, True)
        if isinstance(spec, dict):
            return {k: as_dicts(v) for k, v in spec.items()}
        return spec

    assert fingerprint_exclude(Lock) == lockio.FINGERPRINT_EXCLUDE == as_dicts(spelled)


def test_policies_stay_out_of_the_json_schema() -> None:
    assert "Policy" not in lockio.schema_json() and '"custom"' not in lockio.schema_json()


def test_table_comments_are_declared_on_the_lock() -> None:
    comments = {name: p.comment for name, p in policies(Lock).items() if p.comment}
    assert set(comments) == {"image", "torch", "gpu", "determinism", "env", "git", "canary", "unreadable",
                             "probe", "requires", "native", "compile"}
    assert all(isinstance(p, Policy) for p in policies(Lock).values())
