"""``envlock show --format latex``: a booktabs table for a paper's appendix.

Every value passes ``escape.latex`` (locks hold user text: notes, paths, package names), long
unbreakable values (digests, fingerprints) get break points, and the table says how a
reader replays the environment with envlock or with only uv/pip.
"""

from __future__ import annotations

import re

from envlock.lock import Lock
from envlock.report.render import replay_lines
from envlock.text.escape import latex as escape
from envlock.text.escape import latex_tt as tt


def _flag(value: bool | None) -> str:
    return "n/a" if value is None else ("on" if value else "off")


def rows(lock: Lock, name: str) -> list[tuple[str, str]]:
    py, plat, t = lock.python, lock.platform, lock.torch
    out = [("Environment id", tt(lock.short_id) + " (" + tt(lock.envlock.fingerprint or "unsealed") + ")"),
           ("Python", escape(f"{py.version} ({py.implementation})"))]
    if t:
        out.append(("PyTorch / CUDA / cuDNN",
                    escape(f"{t.version} / {t.cuda or 'none'} / {t.cudnn or 'none'}")
                    + (" / " + escape(f"NCCL {t.nccl}") if t.nccl else "")))
    else:
        out.append(("PyTorch", "not recorded"))
    gpu = lock.gpu
    out.append(("NVIDIA driver", escape(gpu.driver) if gpu and gpu.driver else "none"))
    if gpu and gpu.devices:
        counts: dict[str, int] = {}
        for dev in gpu.devices:
            counts[dev.name] = counts.get(dev.name, 0) + 1
        out.append(("GPU", escape(", ".join(f"{n} x {d}" for d, n in counts.items()))))
    else:
        out.append(("GPU", "none"))
    os_name = plat.os_pretty_name or f"{plat.os} {plat.os_version_id or ''}".strip()
    out.append(("OS", escape(f"{os_name}, {plat.machine}")))
    img = lock.image
    if img.digest or img.id:
        ref = (img.reference or "").split("@", 1)[0]
        out.append(("Container image", tt(f"{ref}@{img.digest or img.id}".lstrip("@"))))
    else:
        out.append(("Container image", "none recorded"))
    s = lock.seeds
    seeds = [f"seed {s.seed}" if s.seed is not None else "no global seed recorded",
             f"PYTHONHASHSEED={s.python_hash_seed}" if s.python_hash_seed is not None else "hash randomisation on"]
    out.append(("Seeds", escape(", ".join(seeds))))
    d = lock.determinism
    if d.torch_loaded:
        out.append(("Determinism", escape(
            f"deterministic algorithms {_flag(d.deterministic_algorithms)}, "
            f"cuDNN deterministic {_flag(d.cudnn_deterministic)}, "
            f"cuDNN benchmark {_flag(d.cudnn_benchmark)}, TF32 matmul {_flag(d.cuda_matmul_allow_tf32)}")))
    if d.env:
        out.append(("Numerics variables", escape(", ".join(f"{k}={v}" for k, v in d.env.items()))))
    out.append(("Packages", escape(f"{len(lock.packages)} Python distributions, pinned in") + " " + tt(name)))
    return out


def show_latex(lock: Lock, name: str = "env.lock") -> str:
    body = "\n".join(f"{k} & {v} \\\\" for k, v in rows(lock, name))
    with_envlock, without = replay_lines(name)
    label = re.sub(r"[^a-z0-9]", "", lock.short_id.lower())
    return (
        f"% Software environment table written by envlock ({lock.short_id}).\n"
        "% Needs \\usepackage{booktabs} in the preamble.\n"
        "\\begin{table}[ht]\n\\centering\n\\small\n"
        f"\\caption{{Software environment of the experiments (envlock {tt(lock.short_id)}).}}\n"
        f"\\label{{tab:envlock-{label}}}\n"
        "\\begin{tabular}{@{}lp{0.62\\linewidth}@{}}\n\\toprule\n"
        "Component & Version \\\\\n\\midrule\n"
        f"{body}\n\\bottomrule\n\\end{{tabular}}\n\n"
        "\\smallskip\n\\footnotesize Replay: " + tt(with_envlock, every=24)
        + "; without envlock: " + tt(without, every=24) + ".\n"
        "\\end{table}\n"
    )
