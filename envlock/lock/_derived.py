"""What the seal needs of the models, generated from them by ``python -m envlock.lock``
(a test fails when it is stale). Literals, so that the seal and the sealed header
(``_header``) hash a lock without importing pydantic."""

from __future__ import annotations

from typing import Any

# What the fingerprint leaves out, in the shape pydantic's ``exclude`` takes (True drops a
# key, a dict recurses, ``"__all__"`` applies to every item of an array), from each
# field's policy (``_policy.fingerprint_exclude``).
FINGERPRINT_EXCLUDE: dict[str, Any] = {   'canary': True,
    'compile': True,
    'conda': {   'packages': {'__all__': {'requested_specs': True, 'url': True}},
                 'virtual_packages': True},
    'determinism': {   'cuda_fp32_precision': True,
                       'cuda_matmul_allow_bf16_reduced_precision_reduction': True,
                       'cuda_matmul_allow_fp16_reduced_precision_reduction': True,
                       'cuda_matmul_allow_tf32': True,
                       'cuda_matmul_fp32_precision': True,
                       'cudnn_allow_tf32': True,
                       'cudnn_benchmark': True,
                       'cudnn_conv_fp32_precision': True,
                       'cudnn_deterministic': True,
                       'cudnn_enabled': True,
                       'cudnn_rnn_fp32_precision': True,
                       'deterministic_algorithms': True,
                       'deterministic_warn_only': True,
                       'fill_uninitialized_memory': True,
                       'float32_matmul_precision': True,
                       'fp32_precision': True,
                       'late': True,
                       'mkldnn_conv_fp32_precision': True,
                       'mkldnn_enabled': True,
                       'mkldnn_fp32_precision': True,
                       'mkldnn_matmul_fp32_precision': True,
                       'mkldnn_rnn_fp32_precision': True,
                       'num_interop_threads': True,
                       'num_threads': True,
                       'process_env': True,
                       'sdpa_cudnn': True,
                       'sdpa_flash': True,
                       'sdpa_math': True,
                       'sdpa_mem_efficient': True,
                       'torch_loaded': True},
    'env': True,
    'envlock': True,
    'git': True,
    'gpu': {'devices': {'__all__': {'index': True, 'torch_kernels': True, 'uuid_sha256': True}}},
    'image': {   'container_id': True,
                 'digest': True,
                 'engine': True,
                 'id': True,
                 'in_container': True,
                 'reference': True,
                 'source': True},
    'native': True,
    'packages': {'__all__': {'files_sha256': True, 'installer': True, 'requested': True}},
    'platform': {'cpu_count': True, 'cpu_model': True, 'kernel': True, 'os_pretty_name': True},
    'probe': True,
    'python': {'executable': True, 'prefix': True},
    'requires': True,
    'seeds': {'seed': True, 'seed_source': True, 'torch_initial_seed': True},
    'torch': {'cpu_capability': True, 'cuda_available': True, 'device_count': True}}

# Where the models default to an empty list or table, which the writer leaves out of the
# TOML (``_schema.empty_defaults``), in the same shape.
EMPTY_DEFAULTS: dict[str, Any] = {   'canary': {'errors': {}, 'results': [], 'settings': {}},
    'compile': {'caches': [], 'settings': {}},
    'conda': {'packages': []},
    'determinism': {'env': {}, 'late': [], 'process_env': []},
    'duplicates': [],
    'env': {},
    'gpu': {'devices': []},
    'native': {'libraries': [], 'runtimes': []},
    'os_packages': {'packages': []},
    'packages': {'__all__': {'hashes': []}, '__default__': []},
    'probe': {'errors': {}},
    'requires': {'cpu_features': [], 'gpu_archs': []},
    'torch': {'arch_list': [], 'build': {'options': {}}},
    'unreadable': []}
