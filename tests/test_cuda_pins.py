"""The CUDA libraries a torch wheel was built with, read from the pins of its METADATA: directly
(``nvidia-*-cu12==``, the CUDA 12 wheels) or through the extras it asks of NVIDIA's
``cuda-toolkit`` metapackage (the CUDA 13 wheels), and the installed metapackage's own pins.

The METADATA excerpts are the lines of the real wheels (torch 2.13.0+cu130 and cuda-toolkit
13.0.3.0 as scripts/test.sh installs them; torch 2.7's CUDA 12.8 wheel for the direct form);
tests/test_scenarios_cuda.py reads the installed ones.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from envlock.lock import TorchInfo
from envlock.probe.torchstack import torch_pins

MARK = ("(sys_platform == 'linux' and platform_machine == 'aarch64' or sys_platform == 'linux' "
        "and platform_machine == 'x86_64' or sys_platform == 'win32' and platform_machine == 'AMD64')")
TORCH_CU130 = """Metadata-Version: 2.4
Name: torch
Version: 2.13.0
Requires-Dist: filelock
Requires-Dist: typing-extensions>=4.10.0
Requires-Dist: cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3; platform_system == "Linux"
Requires-Dist: cuda-bindings<14,>=13.0.3; platform_system == "Linux" and python_version < "3.15"
Requires-Dist: nvidia-cudnn-cu13==9.20.0.48; platform_system == "Linux"
Requires-Dist: nvidia-cusparselt-cu13==0.8.1; platform_system == "Linux"
Requires-Dist: nvidia-nccl-cu13==2.29.7; platform_system == "Linux"
Requires-Dist: nvidia-nvshmem-cu13==3.4.5; platform_system == "Linux"
Requires-Dist: triton==3.7.1; platform_system == "Linux" and python_version < "3.15"
Requires-Dist: optree>=0.13.0; extra == "optree"
"""
TOOLKIT = f"""Metadata-Version: 2.4
Name: cuda-toolkit
Version: 13.0.3.0
Requires-Dist: nvidia-cublas==13.1.1.3.*; {MARK} and extra == 'all'
Requires-Dist: nvidia-cuda-runtime==13.0.96.*; {MARK} and extra == 'all'
Requires-Dist: nvidia-npp==13.0.1.2.*; {MARK} and extra == 'all'
Requires-Dist: nvidia-cublas==13.1.1.3.*; {MARK} and extra == 'cublas'
Requires-Dist: nvidia-cuda-nvrtc==13.0.88.*; {MARK} and extra == 'cublas'
Requires-Dist: nvidia-cuda-runtime==13.0.96.*; {MARK} and extra == 'cudart'
Requires-Dist: nvidia-cufft==12.0.0.61.*; {MARK} and extra == 'cufft'
Requires-Dist: nvidia-nvjitlink<14,>=13.0.88; {MARK} and extra == 'cufft'
Requires-Dist: nvidia-curand==10.4.0.35.*; {MARK} and extra == 'curand'
Requires-Dist: nvidia-cusolver==12.0.4.66.*; {MARK} and extra == 'cusolver'
Requires-Dist: nvidia-cusparse==12.6.3.3.*; {MARK} and extra == 'cusparse'
Requires-Dist: nvidia-npp==13.0.1.2.*; {MARK} and extra == 'npp'
"""
TORCH_CU128 = """Metadata-Version: 2.1
Name: torch
Version: 2.7.0+cu128
Requires-Dist: nvidia-cuda-nvrtc-cu12==12.8.61; platform_system == "Linux" and platform_machine == "x86_64"
Requires-Dist: nvidia-cuda-runtime-cu12==12.8.57; platform_system == "Linux" and platform_machine == "x86_64"
Requires-Dist: nvidia-cudnn-cu12==9.7.1.26; platform_system == "Linux" and platform_machine == "x86_64"
Requires-Dist: nvidia-cublas-cu12==12.8.3.14; platform_system == "Linux" and platform_machine == "x86_64"
Requires-Dist: nvidia-cufft-cu12==11.3.3.41; platform_system == "Linux" and platform_machine == "x86_64"
Requires-Dist: nvidia-nccl-cu12==2.26.2; platform_system == "Linux" and platform_machine == "x86_64"
"""


def test_the_cuda13_wheel_pins_cublas_through_the_toolkit_extras_it_asks_for() -> None:
    assert torch_pins(TORCH_CU130, TOOLKIT) == {
        "cublas": "13.1.1.3", "cudart": "13.0.96", "cudnn": "9.20.0.48", "cufft": "12.0.0.61",
        "curand": "10.4.0.35", "cusolver": "12.0.4.66", "cusparse": "12.6.3.3",
        "cusparselt": "0.8.1", "nccl": "2.29.7", "nvrtc": "13.0.88"}


def test_an_installed_toolkit_of_another_version_says_nothing_of_torch_s_build() -> None:
    other = TOOLKIT.replace("Version: 13.0.3.0", "Version: 13.1.0")
    pins = torch_pins(TORCH_CU130, other)
    assert "cublas" not in pins and "cufft" not in pins
    assert pins == {"cudnn": "9.20.0.48", "cusparselt": "0.8.1", "nccl": "2.29.7"}
    assert torch_pins(TORCH_CU130) == pins  # no cuda-toolkit installed at all


def test_only_the_extras_torch_asks_for_count() -> None:
    asks_less = TORCH_CU130.replace("cuda-toolkit[cublas,cudart,", "cuda-toolkit[cudart,")
    pins = torch_pins(asks_less, TOOLKIT)
    # nvidia-cublas is pinned under 'all' and 'cublas' only, neither of which torch asks for now
    assert "cublas" not in pins and pins["cudart"] == "13.0.96"


def test_the_cuda12_wheels_pin_each_library_directly() -> None:
    assert torch_pins(TORCH_CU128) == {
        "cublas": "12.8.3.14", "cudart": "12.8.57", "cudnn": "9.7.1.26", "cufft": "11.3.3.41",
        "nccl": "2.26.2", "nvrtc": "12.8.61"}


def test_ranges_and_unpinned_requirements_are_no_build_version() -> None:
    text = ("Requires-Dist: nvidia-cublas-cu12>=12.1\nRequires-Dist: nvidia-nccl-cu12\n"
            "Requires-Dist: nvidia-cufft-cu12 == 11.0.2.54\nRequires-Dist: nvidia-curand-cu12===10.3\n")
    assert torch_pins(text) == {"cufft": "11.0.2.54"}


requirement_lines = st.one_of(
    st.sampled_from((TORCH_CU130 + TOOLKIT + TORCH_CU128).splitlines()),
    st.builds(lambda name, extras, version, marker: f"Requires-Dist: {name}{extras}=={version}{marker}",
              st.sampled_from(["nvidia-cublas", "nvidia-nccl-cu13", "cuda-toolkit", "Cuda_Toolkit",
                               "nvidia-cuda-runtime-cu12", "nvidia-x"]) | st.text(max_size=20),
              st.just("") | st.builds(lambda xs: "[" + ",".join(xs) + "]", st.lists(st.text(max_size=8))),
              st.text(alphabet="0123456789.*", max_size=70),
              st.just("") | st.builds(lambda e: f"; extra == '{e}'", st.text(max_size=12)))
    | st.text(max_size=120),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(requirement_lines, max_size=20), st.lists(requirement_lines, max_size=20),
       st.sampled_from(["13.0.3", "13.0.3.0", "", "x"]))
def test_fuzz_pins_never_raise_and_every_version_is_one_a_lock_holds(
        torch_lines: list[str], toolkit_lines: list[str], toolkit_version: str) -> None:
    toolkit = f"Name: cuda-toolkit\nVersion: {toolkit_version}\n" + "\n".join(toolkit_lines)
    pins = torch_pins("\n".join(torch_lines), toolkit)
    # Every name is one [torch.cuda_libraries] accepts, every version one it holds.
    TorchInfo.model_validate({"version": "2.13.0", "cuda_libraries": {
        library: {"built": version} for library, version in pins.items()}})
