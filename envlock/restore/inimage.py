"""``envlock capture --in-image REF``: lock an image that is not running.

The probe runs in a throwaway container of REF with the image's main interpreter (the first of
python3/python on the image's PATH, or the one given), with no network. The image's identity
comes from the engine, not from inside: a container cannot learn its own image reliably, and
``RepoDigests`` is empty for images built locally, so the ``Id`` is always recorded too.
"""

from __future__ import annotations

from envlock.errors import CommandNotFound, InterpreterNotFound
from envlock.lock import Lock
from envlock.probe import imageref
from envlock.restore import values

CANDIDATES = ("python3", "python")


def capture_in_image(ref: str, *, python: str | None = None, torch: bool = True,
                     canary: bool = False, note: str | None = None,
                     engine: str | None = None) -> Lock:
    from envlock.probing.capture import build_lock
    from envlock.restore.endpoint import connect
    from envlock.restore.verify import probe_in_image

    values.image_ref(ref, what="--in-image")
    if python is not None:
        values.interpreter(python)
    with connect(engine) as eng:
        eng.remove_stale()
        info = eng.image(ref) or eng.pull(ref)
        repo = values.split_ref(ref)[0] or None
        pinned = info.repo_digest(repo, pullable=True)
        digest = imageref.split(pinned).digest if pinned else None
        env = {"ENVLOCK_IMAGE": ref, "ENVLOCK_IMAGE_ID": info.id}
        if digest:
            env["ENVLOCK_IMAGE_DIGEST"] = digest
        doc = None
        for cand in ([python] if python else list(CANDIDATES)):
            try:
                doc = probe_in_image(eng, info.id, python=cand, torch=torch, canary=canary, env=env)
                break
            except InterpreterNotFound:
                continue
        if doc is None:
            raise CommandNotFound(f"no python found in {ref} (tried {', '.join(CANDIDATES)})",
                                  hint="pass --python /path/to/python inside the image")
    image = {"in_container": True, "source": "engine", "reference": ref, "id": info.id,
             "engine": eng.name}
    if digest:
        image["digest"] = digest
    doc["image"] = image
    # The identity variables were ours, not the image's.
    doc["env"] = {k: v for k, v in (doc.get("env") or {}).items() if not k.startswith("ENVLOCK_IMAGE")}
    return build_lock(doc, note=note)
