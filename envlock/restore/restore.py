"""``envlock restore``: lock -> pinned build context -> image (or cache hit) -> verified.

The cache key is the sha256 of the whole build context (Dockerfile, requirement files, wheels),
stored as the image label ``org.envlock.context``: the same lock restored with the same options
finds its image and skips the build entirely, while a different ``--base`` or wheelhouse builds
anew. Images are tagged ``envlock/<name>:<short id>``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envlock.errors import NotRestorable, UsageError
from envlock.restore import cachedir, dockerfile, values
from envlock.restore import context as ctx
from envlock.restore.image import (
    LABEL_CONTEXT,
    LABEL_OPTIONS,
    LABEL_SHORT_ID,
    Options,
    image_tag,
    options_key,
)

if TYPE_CHECKING:
    from envlock.drift.result import Comparison
    from envlock.lock import Lock
    from envlock.restore.engine import ContainerEngine, ImageInfo
    from envlock.restore.progress import Progress


@dataclass(frozen=True)
class RestoreResult:
    plan: ctx.Plan
    image_id: str
    tag: str
    cached: bool
    seconds: float  # build (or cache lookup) time
    comparison: Comparison | None
    size: int | None


def cache_dir() -> Path:
    """Restore's part of envlock's one cache directory (``probe.cache_dir``)."""
    from envlock.probe.statcache import cache_dir as envlock_cache

    return Path(envlock_cache()) / "restore"


def resolve_base(engine: ContainerEngine | None, lock: Lock, options: Options) -> ctx.BaseChoice:
    """The base, pinned through the engine when it is a tag (pulled if missing)."""
    base = ctx.choose_base(lock, options)
    if engine is None:
        return base
    if base.ref.startswith("sha256:"):
        if engine.image(base.ref) is None:
            raise NotRestorable(
                f"the lock's image {base.display} ({base.ref[:19]}...) exists only on the machine "
                "that captured it (a local build without a registry digest)",
                hint="push it to a registry and capture again, or pass --base REF")
        return base
    if base.pinned:
        return base
    repo, _, _ = values.split_ref(base.ref)
    info = engine.image(base.ref) or engine.pull(base.ref)
    # No registry digest (a local build, or Podman's localhost/ one): the id says the same.
    pinned = info.repo_digest(repo, pullable=True) or info.id
    return ctx.BaseChoice(pinned, base.origin, True, base.ref)


def prepare(lock: Lock, options: Options, engine: ContainerEngine | None = None
            ) -> tuple[ctx.Plan, dict[str, str]]:
    """The validated plan and the rendered files, ready to write or build."""
    base = resolve_base(engine, lock, options)
    options, wheels_for, own = wheel_inputs(lock, options)
    uv = None
    if options.wheelhouse is not None:
        from envlock.restore import uvbin

        uv = uvbin.find(options.checked_wheels, cache_dir() / cachedir.UV)
    plan = ctx.plan(lock, options, base, wheels_for, own, uv)
    return plan, dockerfile.render(plan)


def wheel_inputs(lock: Lock, options: Options
                 ) -> tuple[Options, dict[str, tuple[Path, ...]] | None, Path | None]:
    """What a plan installs from files, for every target (image, Charliecloud, venv): the
    wheelhouse's wheels, each build proven against the lock before anything is installed, with
    the options the wheelhouse adds (its manifest's hashes, its rebuilt local wheels); and a
    wheel of the running envlock when the lock holds envlock, whatever its source and whatever
    the wheelhouse holds (see ``ownwheel``). (options, wheels by package or None, own wheel or None)."""
    from envlock.restore.ownwheel import OWN_DIST, own_wheel

    wheels_for = None
    others = [p for p in lock.packages if p.name != OWN_DIST]
    house = options.wheelhouse
    if house is not None:
        from envlock.restore import wheelhouse

        wheels_for = wheelhouse.select(house, others)
        # Prove each build before it is installed: a swapped wheel fails here, naming its package.
        wheelhouse.check_builds(others, wheels_for)
        manifest = wheelhouse.read_manifest(house)
        if manifest and not options.extra_hashes:
            options = dataclasses.replace(options, extra_hashes=manifest)
        local_wheels = wheelhouse.read_local_wheels(house)
        if local_wheels:
            options = dataclasses.replace(options, local_wheels=options.local_wheels | local_wheels)
    own = None
    if len(others) != len(lock.packages):
        where = cache_dir() / cachedir.OWN_WHEELS
        where.mkdir(parents=True, exist_ok=True)
        own = own_wheel(where, offline=options.offline)
    return options, wheels_for, own


def write_dockerfile_only(lock: Lock, options: Options, directory: Path, *,
                          force: bool = False, say: Callable[[str], None] | None = None) -> ctx.Plan:
    plan, rendered = prepare(lock, options, None)
    dockerfile.write_context(plan, directory, rendered, force=force, say=say)
    return plan


def cache_labels(plan: ctx.Plan, key: str) -> dict[str, str]:
    """The labels the image of a build of this context carries, checked on the image its tag
    names (``tagged_image``).

    Podman puts build labels on every stage it commits, so the build stage (root, wheels,
    never verified) carries the context label too; only the final stage has the Dockerfile's
    own ``LABEL``s, the short id among them.
    """
    return {LABEL_CONTEXT: key, LABEL_SHORT_ID: plan.short_id}


def tagged_image(engine: ContainerEngine, tag: str, labels: Mapping[str, str]) -> ImageInfo | None:
    """The image envlock's own ``tag`` names, when it carries ``labels``: what a restore reuses.

    By the tag, checked by the labels, never by the labels alone: an image built ``FROM`` a
    restored one inherits every label of it, so a user's image on top of the lock's (newer,
    with files of its own) would be found first, tagged as the lock's and given its verdict.
    Only envlock puts its tag on what it built; a moved tag names an image whose labels then
    decide."""
    found = engine.image(tag)
    if found is None or any(found.labels.get(k) != v for k, v in labels.items()):
        return None
    return found


def restore(lock: Lock, options: Options, *, engine: ContainerEngine, name: str,
            workdir: Path | None = None, progress: Progress | None = None, verify: bool = True,
            use_cache: bool = True, say: Callable[[str], None] = lambda s: None,
            network: bool = True, quiet: bool = False) -> RestoreResult:
    """Build (or find) the image of ``lock`` and, when ``verify``, prove it from inside.

    ``network=False`` builds with the engine's network ``none`` (a pack: everything the build
    needs is in the context), unless the plan installs the lock's OS packages with the image's
    package manager, which fetches them from its sources (a note says so)."""
    from envlock.restore.progress import make_progress

    engine.remove_stale()
    mode = engine.build_mode()
    if mode.note:
        say(f"note: {mode.note}")
    # The tag the Dockerfile names; how the wheels reach pip is the builder's (``Plan.mounts``).
    options = dataclasses.replace(options, image_name=name, mounts=mode.mounts)
    plan, rendered = prepare(lock, options, engine)
    for note in plan.notes:
        say(note if note.startswith("warning: ") else f"note: {note}")
    if plan.skipped:
        say(f"note: not restored (--skip-local or from the image): {', '.join(plan.skipped)}")
    if not network and plan.os_install is not None and not plan.os_install.offline:
        say(f"note: the lock's OS packages are installed with {plan.os_install.manager}, which needs "
            "the network: this build has it")
        network = True
    key = dockerfile.context_key(plan, rendered)
    tag = image_tag(name, lock.short_id)
    if workdir is None:
        workdir = cache_dir() / f"{name}-{lock.short_id}"
        # What is built is what is in the context: in a directory others can write, another
        # user could swap a requirement file between envlock's write and the engine's read.
        from envlock.probe.statcache import refusal

        why = refusal(path=str(workdir / "context" / "Dockerfile"))
        if why:
            raise UsageError(f"refusing to build in the cache directory: {why}",
                             hint="pass --context-dir DIR (a directory of your own), or make the "
                                  "cache directory yours and private (chmod 700)")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    context_dir = workdir / "context"
    labels = {LABEL_CONTEXT: key, LABEL_OPTIONS: options_key(options)}
    t0 = time.monotonic()
    # One restore of a lock at a time writes and builds its context; another waits, then finds
    # the image this one built.
    with cachedir.hold(workdir, exclusive=True,
                       waiting=lambda: say(f"waiting for another restore of this lock ({workdir} is in use)")):
        cachedir.touch(workdir)
        found = tagged_image(engine, tag, cache_labels(plan, key)) if use_cache else None
        if found is not None:
            image_id, cached = found.id, True
            say(f"cache hit: {tag} ({image_id[7:19]}) was built from this exact context; not rebuilding")
        else:
            # envlock's own context of an earlier build of this lock is replaced; anything else
            # at that place (a user's --context-dir) is refused.
            dockerfile.write_context(plan, context_dir, rendered, force=True, say=say)
            log_path = workdir / "build.log"
            build_kw: dict[str, Any] = {} if network else {"network": False}
            if plan.split_torch:
                layer_id = torch_layer(engine, plan, context_dir, workdir, use_cache=use_cache, say=say,
                                       quiet=quiet, build_kw=build_kw)
                build_kw.update(files=dockerfile.main_build_files(plan, rendered),
                                buildargs={dockerfile.TORCH_LAYER_ARG: layer_id})
            elif plan.mounts:
                build_kw["buildargs"] = base_buildargs(plan)
            say(f"building {tag} from {plan.base.display} with {mode.builder} (context: {context_dir})")
            with build_stage(engine, build_kw, dockerfile.staged(plan)):
                image_id = engine.build(context_dir, tag=tag, labels=labels, log_path=log_path,
                                        progress=progress or make_progress(quiet=quiet, log=log_path), **build_kw)
            cached = False
    seconds = time.monotonic() - t0
    info = engine.image(image_id)
    comparison = None
    if verify:
        _, comparison = verify_image_for(engine, plan, image_id, tag, say=say)
    return RestoreResult(plan=plan, image_id=image_id, tag=tag, cached=cached, seconds=seconds,
                         comparison=comparison, size=info.size if info else None)


def torch_layer(engine: ContainerEngine, plan: ctx.Plan, context_dir: Path, workdir: Path, *,
                use_cache: bool, say: Callable[[str], None], quiet: bool,
                build_kw: dict[str, Any]) -> str:
    """The id of the torch layer's image: found by its key, else built from the torch
    wheels alone (``dockerfile.torch_layer_dockerfile``) and tagged by its key."""
    from envlock.restore.progress import make_progress

    key = dockerfile.torch_layer_key(plan)
    layer_tag = dockerfile.torch_layer_tag(key)
    # An image that merely inherits the label (a step of a build on top of the layer, left
    # behind by a failed build) is not the layer.
    found = tagged_image(engine, layer_tag, {dockerfile.LABEL_TORCH_LAYER: key}) if use_cache else None
    if found is not None:
        say(f"torch layer: reusing {layer_tag} ({found.id[7:19]}), built from the same torch wheels")
        return found.id
    say(f"building the torch layer {layer_tag} from {plan.base.display}")
    kw = {**build_kw, **({"buildargs": base_buildargs(plan)} if plan.mounts else {})}
    log = workdir / "torch-layer.log"
    with build_stage(engine, kw, not plan.mounts):
        return engine.build(context_dir, tag=layer_tag, labels={}, log_path=log,
                            progress=make_progress(quiet=quiet, log=log), files=dockerfile.torch_layer_files(plan),
                            dockerfile=dockerfile.TORCH_LAYER_DOCKERFILE, **kw)


def base_buildargs(plan: ctx.Plan) -> dict[str, str]:
    """With mounts the Dockerfile takes its base as a build argument (``dockerfile.BASE_ARG``),
    whose default is the plan's base; it is given all the same, so that a builder that cannot
    read an image id in FROM can give it a name (``clibuild``)."""
    return {dockerfile.BASE_ARG: plan.base.ref}


@contextlib.contextmanager
def build_stage(engine: ContainerEngine, build_kw: dict[str, Any], staged: bool) -> Iterator[None]:
    """Around a build whose Dockerfile has a build stage: give the stage this build's own id
    (a build argument, ``build_kw`` is updated) and remove the stage afterwards, whether the
    build succeeded or not. A stage is the wheels plus the venv installed from them, over
    1 GB with torch; left behind it would be an untagged image per fresh restore."""
    if not staged:
        yield
        return
    build = secrets.token_hex(8)
    build_kw["buildargs"] = {**build_kw.get("buildargs", {}), dockerfile.BUILD_STAGE_ARG: build}
    try:
        yield
    finally:
        engine.remove_build_stage(build)


def verify_image_for(engine: ContainerEngine, plan: ctx.Plan, image_id: str, tag: str, *,
                     say: Callable[[str], None] = lambda s: None) -> tuple[Lock, Comparison]:
    """(lock captured inside ``image_id``, comparison with the plan's lock): the check inside.

    It runs once per image: what the probe found is kept per image id (``inside``) and judged
    again by the next restore that finds the image; only an image without such an entry (new,
    restored with --no-verify, its entry pruned) starts a container for it."""
    from envlock.errors import EnvlockError
    from envlock.restore import inside
    from envlock.restore.verify import judge_document, probe_image

    kept = inside.find(engine.name, plan.lock, image_id)
    if kept is not None:
        try:
            found = judge_document(plan.lock, kept.document, restored=plan.restored)
        except EnvlockError:
            pass  # a document this envlock no longer accepts: the probe runs again
        else:
            say(f"verified before: the check inside {image_id[7:19]} ran at {kept.checked_at} and is "
                "kept per image id (ENVLOCK_NO_CACHE=1 runs it again)")
            return found
    say("verifying: running the probe inside a fresh container")
    doc = probe_image(engine, plan.lock, image_id, python=plan.python, reference=tag)
    found = judge_document(plan.lock, doc, restored=plan.restored)
    inside.keep(engine.name, plan.lock, image_id, python=plan.python, restored=plan.restored,
                document=doc, ok=found[1].ok)
    return found
