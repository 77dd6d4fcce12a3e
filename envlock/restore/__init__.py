"""Rebuild a lock as a container image, prove it from inside, and replay commands in it.

``context`` renders a build context (Dockerfile + requirement files) from a lock, passing every
value through ``values`` first; ``engine`` talks to Docker or Podman through the docker SDK;
``verify`` runs the stdlib probe inside the built image (copied in, never installed);
``inimage`` locks an existing image; ``wheelhouse`` collects wheels for offline replays;
``restore`` and ``run`` tie them together for the CLI (``cli``).

Nothing here is imported by ``envlock --help``: the CLI module imports the rest lazily.
"""
