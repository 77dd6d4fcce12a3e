"""Rebuild a lock as a container image, prove it from inside, and replay commands in it.

``context`` plans a restore from a lock, passing every value through ``values`` first;
``dockerfile`` renders the plan as a build context; ``engine`` is the container-engine interface,
``dockerengine`` its Docker/Podman implementation (``endpoint`` connects, ``buildlog`` reads the
build output); ``verify`` runs the stdlib probe inside the built image (copied in, never
installed); ``inimage`` locks an existing image; ``wheelhouse`` collects wheels for offline
replays; ``restore`` and ``run`` tie them together for the commands
(``envlock.commands.restore``, ``run``, ``bundle``), which import them when they run.
"""
