# shellcheck shell=bash
# Prerequisites of the scenario matrix (tests/test_scenarios_*.py), sourced by scripts/test.sh
# after scripts/engine.sh (it uses _engine_apt, _engine_apt_install and $CACHE, $REBUILD, log).
# Every function is idempotent and cached; each exports what the tests read:
#
#   matrix_tools       gcc (the NVML stand-in), git, Debian's chromium + chromium-driver (the
#                      notebook scenario, the report pages' browser tests), skopeo
#                      (the OCI archive of `envlock pack`), charliecloud + umoci (`restore
#                      --target charliecloud`)
#   matrix_debs        ENVLOCK_TEST_DEBS: .debs of python3-six, python3-yaml (+ libyaml) for the
#                      Debian system-python scenario (containers cannot reach apt)
#   matrix_torch_cuda  ENVLOCK_TEST_TORCH_CUDA_VENV: a venv with PyPI's default torch==2.13.0
#                      (CUDA 13.0, ~15 nvidia-* wheels, ~4.8 GB), made once, never in the repo
#
# uv (the uv scenario) comes with the dev extra.

MATRIX_DEBS=(python3-six python3-yaml libyaml-0-2)
# `envlock run --ssh` needs sshd in the image: openssh-server and what the base image lacks of
# its dependencies, installed with dpkg into a test base image (tests/test_run_ssh.py). A
# directory of their own: the Debian scenario installs every .deb of its directory.
SSH_DEBS=(openssh-server openssh-sftp-server openssh-client libwrap0 ucf runit-helper procps
          libproc2-0 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1
          libcbor0.8 libfido2-1 libedit2 libbsd0 libmd0)
MATRIX_TORCH_CUDA="torch==2.13.0"

matrix_tools() {
    local missing=()
    command -v gcc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
    command -v git >/dev/null 2>&1 || missing+=(git)
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
    command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
    command -v ch-image >/dev/null 2>&1 || missing+=(charliecloud)
    command -v umoci >/dev/null 2>&1 || missing+=(umoci)
    if [[ ${#missing[@]} -gt 0 ]]; then
        local t0=$SECONDS
        _engine_apt_install "${missing[@]}"
        log "apt install ${missing[*]} took $((SECONDS - t0)) s"
    fi
}

# _matrix_download DIR VAR PACKAGE...: the .debs of PACKAGE... downloaded into DIR once (a stamp
# of the list; ENVLOCK_TEST_REBUILD=1 downloads again), exported as VAR.
_matrix_download() {
    local dir="$1" var="$2" want
    shift 2
    want="$(printf '%s\n' "$@" | sha256sum | cut -d' ' -f1)"
    if [[ "$REBUILD" == "1" || ! -f "$dir/.stamp" || "$(cat "$dir/.stamp")" != "$want" ]]; then
        rm -rf "$dir" "$dir.tmp"
        mkdir -p "$dir.tmp"
        chmod 777 "$dir.tmp"  # apt-get download drops privileges to _apt where it can
        # The host is Debian bookworm like the base image, so its apt serves the same release.
        if ! (cd "$dir.tmp" && apt-get download "$@" >/dev/null 2>&1); then
            _engine_apt update
            (cd "$dir.tmp" && apt-get download "$@" >/dev/null)
        fi
        echo "$want" >"$dir.tmp/.stamp"
        mv "$dir.tmp" "$dir"
        log "downloaded $(find "$dir" -name '*.deb' | wc -l) .debs into $dir"
    fi
    export "$var=$dir"
}

matrix_debs() {
    _matrix_download "$CACHE/debs" ENVLOCK_TEST_DEBS "${MATRIX_DEBS[@]}"
}

# A directory of its own: the Debian scenario installs every .deb of ENVLOCK_TEST_DEBS.
matrix_ssh_debs() {
    _matrix_download "$CACHE/ssh-debs" ENVLOCK_TEST_SSH_DEBS "${SSH_DEBS[@]}"
}

matrix_torch_cuda() {
    local venv="$CACHE/torch-cuda-venv" py="$1" want
    want="$(printf '%s %s\n' "$MATRIX_TORCH_CUDA" "$("$py" -VV)" | sha256sum | cut -d' ' -f1)"
    if [[ "$REBUILD" == "1" || ! -f "$venv/.envlock-stamp" || "$(cat "$venv/.envlock-stamp")" != "$want" ]]; then
        rm -rf "$venv" "$venv.tmp"
        local t0=$SECONDS
        log "pip install $MATRIX_TORCH_CUDA from PyPI into $venv (CUDA build, ~4.8 GB, once)"
        "$py" -m venv "$venv.tmp"
        # No local find-links or config: the default index's torch is the CUDA build.
        PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= "$venv.tmp/bin/python" -m pip install -q \
            --progress-bar off --isolated --disable-pip-version-check "$MATRIX_TORCH_CUDA"
        "$venv.tmp/bin/python" -c 'import torch, sys; sys.exit(torch.version.cuda is None)'
        echo "$want" >"$venv.tmp/.envlock-stamp"
        mv "$venv.tmp" "$venv"
        log "CUDA torch venv took $((SECONDS - t0)) s"
    fi
    export ENVLOCK_TEST_TORCH_CUDA_VENV="$venv"
}
